"""Decode throughput of the tiny decoder: greedy vs a sampling chain vs beam search, in one process.

    python benchmarks/decode.py                      # batch 32, 32k vocab, llama.cpp-style chain
    python benchmarks/decode.py --chain mypkg.mod:make_sampler --beams 4 --new-tokens 64
    python benchmarks/decode.py --infill runs/demo      # prompt lookup vs plain decoding, demo's BART

The model is :class:`jaxsample.decoding.TinyDecoder` with an untied ``[D, V]`` output projection,
so one decode step costs at least a ``V``-wide logits projection for the whole batch (the bar the
sampling chain's overhead is judged against). Every mode generates exactly ``--new-tokens`` tokens
per row (no EOS), compiled once, then timed ``--repeats`` times, interleaved across modes; the
median is reported. ``chain overhead`` is ``t_chain / t_greedy - 1``.

``--infill RUN_DIR`` instead times prompt-lookup decoding (:mod:`jaxsample.decoding.lookup`) against
plain decoding on the demo's BART infilling task (a ``python -m jaxsample demo`` run directory: its
checkpoint and held-out rows). The drafts are copied from the encoder input (``source=``), greedy
and sampled (temperature 0.8), side by side in one process; it checks that the outputs are equal
(prompt lookup emits exactly plain decoding's tokens) and also times one decoder call over
``k + 1`` tokens against a one-token call (the verification's
cost: prompt lookup gains only when tokens per target call exceed it).

``--chain module:function`` names a zero-argument callable returning a :class:`jaxsample.Sampler`
(optionally ``(sampler, params_dict)``); the default is llama.cpp's default chain
(``presets.llama_cpp()``: penalties, DRY, top-n-sigma, top-k 40, typical, top-p 0.95, min-p 0.05, XTC,
temperature 0.8, dist).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics
import time

import jax
import jax.numpy as jnp

import jaxsample as js
from jaxsample import presets
from jaxsample.decoding import TinyDecoder, beam_search, generate, prompt_lookup_generate

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


def infill_lookup(run_dir: str, rows: int, draft: int, max_n: int, repeats: int) -> dict:
    """Plain vs prompt-lookup decoding of the demo's held-out infilling rows (see the module docstring)."""
    import os

    from jaxsample.evaluation import data as _data
    from jaxsample.models import checkpoint, make_model

    ckpt = checkpoint.restore(os.path.join(run_dir, "checkpoint"))
    model, c = make_model(ckpt.config), ckpt.config
    a = _data.load_rows(os.path.join(run_dir, "data", "heldout"), max_rows=rows).arrays
    ids, mask = jnp.asarray(a["input_ids"]), jnp.asarray(a["attention_mask"])
    b = ids.shape[0]
    n = min(a["labels"].shape[1], c.max_len - draft - 2)
    dmodel = js.decoding.Model(model.apply_step)
    start = jnp.full((b, 1), c.decoder_start_id, jnp.int32)
    source = jnp.where(mask, ids, -1)
    sampler = js.chain(js.stages.temperature(0.8), select=js.stages.categorical())
    common = dict(max_new_tokens=n, eos_ids=c.eos_id, pad_id=c.pad_id)

    def plain(sp):
        cache = model.encode(ckpt.params, ids, mask, n + 1)
        return generate(dmodel, ckpt.params, start, cache=cache, **common, **sp)

    def looked(sp):
        cache = model.encode(ckpt.params, ids, mask, n + draft + 2)
        return prompt_lookup_generate(dmodel, ckpt.params, start, cache=cache, source=source, num_draft_tokens=draft,
                                      prompt_lookup_max=max_n, **common, **sp)

    @functools.partial(jax.jit, static_argnums=0)
    def call(t, cache):  # one decoder call over t tokens: what a verification costs against one step
        toks = jnp.broadcast_to(start, (b, t))
        return model.apply_step(ckpt.params, toks, jnp.broadcast_to(jnp.arange(t), (b, t)), cache).logits

    sampled = {"sampler": sampler, "sampler_params": {"seed": jnp.arange(b)}}
    enc = model.encode(ckpt.params, ids, mask, n + draft + 2)
    modes = {"call 1 token": lambda: call(1, enc), f"call {draft + 1} tokens": lambda: call(draft + 1, enc),
             "greedy": lambda: plain({}), "greedy + lookup": lambda: looked({}),
             "sample": lambda: plain(sampled), "sample + lookup": lambda: looked(sampled)}
    outs = {k: jax.block_until_ready(fn()) for k, fn in modes.items()}  # compile
    same = all(bool(jnp.all(outs[m].tokens == outs[m + " + lookup"].tokens)) for m in ("greedy", "sample"))
    times = {k: [] for k in modes}
    for _ in range(repeats):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"devices: {jax.devices()}  rows={b} max_new_tokens={n} num_draft_tokens={draft} prompt_lookup_max={max_n}")
    print(f"{'mode':<18}{'time (s)':>10}{'tokens':>9}{'tokens/s':>11}{'accepted/drafted':>18}{'tok/call':>10}")
    ratio = med[f"call {draft + 1} tokens"] / med["call 1 token"]
    print(f"one decoder call over {draft + 1} tokens costs {ratio:.2f}x a one-token call")
    for name, t in med.items():
        if name.startswith("call"):
            continue
        o = outs[name]
        tokens = int(o.lengths.sum())
        acc = f"{int(o.num_accepted.sum())}/{int(o.num_drafted.sum())}" if hasattr(o, "num_accepted") else "-"
        calls = f"{tokens / max(1, tokens - int(o.num_accepted.sum())):.2f}" if hasattr(o, "num_accepted") else "1.00"
        print(f"{name:<18}{t:>10.4f}{tokens:>9}{tokens / t:>11.0f}{acc:>18}{calls:>10}")
    speed = {m: med[m] / med[m + " + lookup"] for m in ("greedy", "sample")}
    print(f"speed-up: greedy {speed['greedy']:.2f}x, sample {speed['sample']:.2f}x; outputs identical: {same}")
    return {"median_s": med, "speedup": speed, "identical": same, "verify_call_ratio": ratio}


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
    ap.add_argument("--markdown", action="store_true", help="also print the README table row")
    ap.add_argument(
        "--chain", default=None, help="module:function returning a Sampler (default: llama.cpp chain)"
    )
    ap.add_argument("--infill", metavar="RUN_DIR", default=None,
                    help="time prompt lookup on the demo's BART infilling rows of this demo run instead")
    ap.add_argument("--rows", type=int, default=64, help="--infill: held-out rows")
    ap.add_argument("--draft", type=int, default=8, help="--infill: num_draft_tokens")
    ap.add_argument("--max-ngram", type=int, default=3, help="--infill: prompt_lookup_max")
    args = ap.parse_args(argv)
    if args.infill:
        return infill_lookup(args.infill, args.rows, args.draft, args.max_ngram, args.repeats)

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
    if args.markdown:  # the README row: ms per step
        step = {k: f"{1000 * t / n:.1f}" for k, t in med.items()}
        print(f"| {args.d_model} | {step['model only']} | {step['greedy']} | {step['chain']} | {100 * overhead:+.1f}% "
              f"| {step[f'beam {args.beams}']} ({beam_ratio:.2f}x greedy) |")
    return {"median_s": med, "chain_overhead": overhead}


if __name__ == "__main__":
    main()
