"""The llama.cpp default chain, end to end (logits -> token), vs a straightforward sort-based chain.

Run from the repository root::

    python -m benchmarks.chain                 # B=64, V=131072

Both sides run in this process on the same logits: ``jaxsample`` (``presets.llama_cpp()``: penalties,
DRY, top-n-sigma, top-k 40, typical, top-p 0.95, min-p 0.05, XTC, temperature 0.8, dist) and a
reference made of the plain sort-based filters of ``tests/reference_samplers.py`` followed by
``jax.random.categorical`` (the usual JAX implementation). Also reported: the README's functional
composition ``categorical(temperature(min_p(top_p(top_k(x)))))`` against the same reference, ``top_p``
alone, and every time in units of one ``jax.nn.logsumexp`` pass timed in the same interleaved rounds
(:func:`benchmarks.samplers.time_interleaved`). Goals (issue 13): the preset chain <= 2.5 passes, the
functional composition <= 6.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jaxsample as js
from benchmarks.samplers import flat_logits, lse_pass, markdown, peaked_logits, time_interleaved, time_ms
from jaxsample import presets
from tests import reference_samplers as ref


def llama_chain(batch: int, vocab: int):
    """``x [B, V] -> tokens [B]``: one full step of the llama.cpp default sampler."""
    preset = presets.llama_cpp()
    params = preset.params((batch,), seed=jnp.arange(batch))
    prompt = jnp.tile(jnp.arange(32, dtype=jnp.int32), (batch, 1))
    state = preset.sampler.init(params, vocab_size=vocab, prompt=prompt, history_size=64)
    return lambda x: preset.sampler.sample(x, state, params)[0]


def functional_chain(batch: int):
    """The README's composition of the public functions: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8, draw."""
    keys = jax.random.split(jax.random.key(0), batch)
    return lambda x: js.categorical(keys, js.temperature(js.min_p(js.top_p(js.top_k(x, 40), 0.95), 0.05), 0.8))


def reference_chain(batch: int):
    """The same filters done the straightforward way: full sorts, then ``jax.random.categorical``."""
    rows = lambda v, dt=jnp.float32: jnp.full((batch,), v, dt)  # noqa: E731
    key = jax.random.key(0)

    def step(x):
        y = ref.top_k_exact(x, rows(40, jnp.int32))
        y = ref.top_p(y, rows(0.95), rows(0, jnp.int32))
        y = ref.min_p(y, rows(0.05), rows(0, jnp.int32))
        return jax.random.categorical(key, y / 0.8)

    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--markdown", action="store_true", help="also print the README table")
    args = parser.parse_args(argv)
    b, v = args.batch, args.vocab
    sets = {"peaked": peaked_logits(jax.random.key(0), b, v), "flat": flat_logits(jax.random.key(0), b, v)}
    print(f"backend={jax.default_backend()}  B={b}  V={v}  jax={jax.__version__}")
    cases = [
        ("llama.cpp chain", llama_chain(b, v), reference_chain(b)),
        ("functional chain", functional_chain(b), reference_chain(b)),
        ("top_p 0.95", lambda x: js.top_p(x, 0.95),
         lambda x: ref.top_p(x, jnp.full((b,), 0.95), jnp.ones((b,), jnp.int32))),
    ]
    header = f"{'case':<17}{'logits':<8}{'jaxsample ms':>13}{'sorted ms':>11}{'speed-up':>10}{'in lse passes':>15}"
    print(header)
    print("-" * len(header))
    results = {}
    for name, fast, slow in cases:
        for set_name, x in sets.items():
            ms = time_interleaved({"fast": fast, "lse": lse_pass}, x, args.repeats)
            f = ms["fast"]
            s = time_ms(slow, x, 2)
            results[name, set_name] = dict(ms=f, lse_ms=ms["lse"], speedup=s / f, passes=f / ms["lse"])
            print(f"{name:<17}{set_name:<8}{f:>13.1f}{s:>11.1f}{s / f:>9.1f}x{f / ms['lse']:>15.1f}", flush=True)
    if args.markdown:
        print("\n" + markdown(results, "case (`benchmarks/chain.py`, logits -> token)", "the sorted chain"))
    return results


if __name__ == "__main__":
    main()
