"""Decode throughput of the tiny decoder: greedy vs a sampling chain vs beam search, in one process.

    python benchmarks/decode.py                      # batch 32, 32k vocab, llama.cpp-style chain
    python benchmarks/decode.py --chain mypkg.mod:make_sampler --beams 4 --new-tokens 64

The model is :class:`jaxsample.decoding.TinyDecoder` with an untied ``[D, V]`` output projection,
so one decode step costs at least a ``V``-wide logits projection for the whole batch (the bar the
sampling chain's overhead is judged against). Every mode generates exactly ``--new-tokens`` tokens
per row (no EOS), compiled once, then timed ``--repeats`` times, interleaved across modes; the
median is reported. ``chain overhead`` is ``t_chain / t_greedy - 1``.

``--chain module:function`` names a zero-argument callable returning a :class:`jaxsample.Sampler`
(optionally ``(sampler, params_dict)``); the default is llama.cpp's default chain
(``presets.llama_cpp()``: penalties, DRY, top-n-sigma, top-k 40, typical, top-p 0.95, min-p 0.05, XTC,
temperature 0.8, dist).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import jax
import jax.numpy as jnp

import jaxsample as js
from jaxsample import presets
from jaxsample.decoding import TinyDecoder, beam_search, generate

def llama_cpp_chain() -> tuple[js.Sampler, dict, list[str]]:
    """llama.cpp's default chain (:func:`jaxsample.presets.llama_cpp` with llama.cpp's defaults)."""
    preset = presets.llama_cpp(dry_penalty_last_n=64)
    return preset.sampler, dict(preset.values), [s.name for s in preset.sampler.stages]


def load_chain(spec: str | None):
    if spec is None:
        return llama_cpp_chain()
    module, _, attr = spec.partition(":")
    made = getattr(importlib.import_module(module), attr)()
    sampler, values = made if isinstance(made, tuple) else (made, {})
    return sampler, dict(values), [s.name for s in sampler.stages]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--chain", default=None, help="module:function returning a Sampler (default: llama.cpp chain)"
    )
    args = ap.parse_args(argv)

    net = TinyDecoder(args.vocab, args.d_model, args.layers, args.heads)
    params = jax.jit(net.init_params)(jax.random.key(0))
    b, n = args.batch, args.new_tokens
    prompt = jax.random.randint(jax.random.key(1), (b, args.prompt_len), 0, args.vocab)
    sampler, values, used = load_chain(args.chain)
    sp = dict(values, seed=jnp.arange(b))

    @jax.jit
    def model_only(params, prompt):
        """The model cost alone: prefill + n decode steps feeding a fixed token (a max instead of a selector)."""
        cache = net.init_cache(b, args.prompt_len + n)
        cache = net.apply_step(
            params, prompt, jnp.broadcast_to(jnp.arange(args.prompt_len), prompt.shape), cache
        ).cache

        def body(i, carry):
            cache, acc = carry
            out = net.apply_step(params, prompt[:, :1], jnp.full((b, 1), args.prompt_len + i), cache)
            return out.cache, acc + jnp.max(out.logits[:, 0], axis=-1)  # uses every logit: no DCE

        return jax.lax.fori_loop(0, n, body, (cache, jnp.zeros(b)))[1]

    modes = {
        "model only": lambda: model_only(params, prompt),
        "greedy": lambda: generate(net.model, params, prompt, max_new_tokens=n).tokens,
        "chain": lambda: (
            generate(net.model, params, prompt, max_new_tokens=n, sampler=sampler, sampler_params=sp).tokens
        ),
        f"beam {args.beams}": lambda: (
            beam_search(
                net.model, params, prompt, num_beams=args.beams, max_new_tokens=n, early_stopping="never"
            ).tokens
        ),
    }
    for fn in modes.values():  # compile
        jax.block_until_ready(fn())
    times = {k: [] for k in modes}
    for _ in range(args.repeats):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}

    print(
        f"devices: {jax.devices()}  batch={b} vocab={args.vocab} d_model={args.d_model} layers={args.layers} "
        f"prompt={args.prompt_len} new_tokens={n}"
    )
    print(f"chain stages: {used + ['dist']}  values: {values}")
    print(
        f"{'mode':<18}{'time (s)':>10}{'ms/step':>10}{'tokens/s':>12}   (beam: output tokens of the best beam)"
    )
    for name, t in med.items():
        print(f"{name:<18}{t:>10.4f}{1000 * t / n:>10.2f}{b * n / t:>12.0f}")
    overhead = med["chain"] / med["greedy"] - 1.0
    beam_ratio = med[f"beam {args.beams}"] / med["greedy"]
    print(f"chain overhead over greedy: {100 * overhead:+.1f}%   (beam {args.beams}: {beam_ratio:.2f}x greedy time)")
    return {"median_s": med, "chain_overhead": overhead}


if __name__ == "__main__":
    main()
