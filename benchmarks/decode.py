"""Decode throughput of the tiny decoder: greedy vs a sampling chain vs beam search, in one process.

    python benchmarks/decode.py                      # batch 32, 32k vocab, llama.cpp-style chain
    python benchmarks/decode.py --chain mypkg.mod:make_sampler --beams 4 --new-tokens 64

The model is :class:`jaxsample.decoding.TinyDecoder` with an untied ``[D, V]`` output projection,
so one decode step costs at least a ``V``-wide logits projection for the whole batch (the bar the
sampling chain's overhead is judged against). Every mode generates exactly ``--new-tokens`` tokens
per row (no EOS), compiled once, then timed ``--repeats`` times, interleaved across modes; the
median is reported. ``chain overhead`` is ``t_chain / t_greedy - 1``.

``--chain module:function`` names a zero-argument callable returning a :class:`jaxsample.Sampler`
(optionally ``(sampler, params_dict)``); the default builds llama.cpp's default chain from the stages
available in :mod:`jaxsample.stages` (missing stages are skipped and listed).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import jax
import jax.numpy as jnp

import jaxsample as js
from jaxsample import stages
from jaxsample.decoding import TinyDecoder, beam_search, generate

#: llama.cpp ``common_sampler_init`` order (common/sampling.cpp) and its default values.
LLAMA_CPP_ORDER = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typical",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
LLAMA_CPP_VALUES = {
    "repeat": 1.0,
    "frequency": 0.0,
    "presence": 0.0,
    "penalty_last_n": 64,
    "last_n": 64,
    "dry_multiplier": 0.0,
    "multiplier": 0.0,
    "top_n_sigma": -1.0,
    "top_k": 40,
    "typical": 1.0,
    "typical_p": 1.0,
    "top_p": 0.95,
    "min_p": 0.05,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.1,
    "temperature": 0.8,
}


def llama_cpp_chain() -> tuple[js.Sampler, dict, list[str]]:
    """llama.cpp's default chain from the stage factories that exist (with their defaults)."""
    used, parts = [], []
    for name in LLAMA_CPP_ORDER:
        factory = getattr(stages, name, None)
        if factory is None:
            continue
        parts.append(factory())
        used.append(name)
    sampler = js.chain(*parts, select=stages.categorical())
    specs = sampler.param_specs()
    values = {k: v for k, v in LLAMA_CPP_VALUES.items() if k in specs}
    return sampler, values, used


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
