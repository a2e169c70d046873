"""Jump-forward decoding against plain constrained decoding, on the demo-size decoder models.

    python -m benchmarks.jump_forward                     # decoder 'tiny' and 'small', batch 8, k = 8
    python -m benchmarks.jump_forward --sizes small --batch 16 --k 16 --repeats 7

For each model size (``jaxsample.models.get_config("decoder", size)``, randomly initialised: the
time of a call does not depend on the weights) and a byte-level BPE vocabulary of the model's size
(``benchmarks.structured.make_vocab``), every row generates one JSON document of a schema with long
required keys, greedy and sampled (temperature 1), with plain ``generate`` and with
``generate(jump_forward=k)`` (``jump_forward_min`` 1 and 4), side by side in one process, interleaved,
median of ``--repeats`` runs. Two schemas:

* ``words``: keys made of English words (``customer_identifier``, ...); the vocabulary spells them
  in several ways (``customer`` or ``cust`` + ``omer``), so most key tokens are *not* forced: only a
  state allowing exactly one token is;
* ``opaque``: keys of rare character pairs (``QX7_ZK9_...``) that BPE never merged, so each key
  has one tokenization and is forced token by token: the case jump-forward is for.

Reported per mode: tokens generated, the share of forced tokens that rode along in a multi-token
call, tokens per model call, time, speed-up over plain decoding, and whether the outputs are
identical (they must be). Also one model call's time at each width, the cost jump-forward trades
against (on a CPU a call over ``w`` tokens costs much more than a one-token call).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxsample as js  # noqa: E402
from jaxsample import stages  # noqa: E402
from jaxsample import structured as st  # noqa: E402
from jaxsample.decoding import generate, jump_forward_generate  # noqa: E402
from jaxsample.models import get_config, make_model  # noqa: E402

from benchmarks.structured import make_vocab  # noqa: E402


def _schema(keys: list[str]) -> dict:
    values = [{"type": "boolean"}, {"enum": ["low", "high"]}, {"type": "integer", "minimum": 0, "maximum": 99}]
    props = {k: values[i % len(values)] for i, k in enumerate(keys)}
    return {"type": "object", "properties": props, "required": keys, "additionalProperties": False}


SCHEMAS = {
    "words": _schema(["customer_identifier", "shipping_priority_level", "gift_wrapping_requested",
                      "delivery_window_preference", "loyalty_program_member", "invoice_copy_count"]),
    "opaque": _schema(["QX7_ZK9_WV3_JP", "VQ8_XJ2_KZ5_QW", "JZ3_QV7_XW9_KQ", "WK2_ZQ8_VJ4_XZ",
                       "KJ9_XQ3_ZW7_VQ", "ZV5_KW2_QJ8_XJ"]),
}


def _median_times(modes: dict, repeats: int) -> dict:
    outs = {k: jax.block_until_ready(fn()) for k, fn in modes.items()}  # compile
    times = {k: [] for k in modes}
    for _ in range(repeats):
        for name, fn in modes.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), outs[k]) for k, v in times.items()}


def call_widths(model, params, batch: int, k: int, repeats: int) -> dict:
    """Median time of one model call over ``w`` tokens, for the widths jump-forward uses."""
    cache = model.init_cache(batch, 256)

    @jax.jit
    def call(tokens, positions, cache):
        return model.apply_step(params, tokens, positions, cache).logits

    widths = js.decoding.jump_forward.widths(k)
    modes = {}
    for w in widths:
        toks = jnp.ones((batch, w), jnp.int32)
        pos = jnp.broadcast_to(64 + jnp.arange(w), (batch, w))
        modes[w] = (lambda t, p: lambda: call(t, p, cache))(toks, pos)
    return {w: t for w, (t, _) in _median_times(modes, repeats).items()}


def bench_size(size: str, batch: int, k: int, repeats: int) -> dict:
    cfg = get_config("decoder", size)
    _, vocab, _ = make_vocab(cfg.vocab_size)
    cfg = dataclasses.replace(cfg, vocab_size=vocab.size, mask_id=vocab.size - 1)
    model = make_model(cfg)
    params = jax.jit(model.init)(jax.random.key(0))
    widths = call_widths(model, params, batch, k, repeats)
    print(f"\n== decoder {size}: d_model={cfg.d_model} layers={cfg.num_layers} V={vocab.size} batch={batch} k={k}")
    print("one call over w tokens (ms): " + ", ".join(f"w={w}: {1000 * t:.1f}" for w, t in widths.items()))
    prompt = jnp.zeros((batch, 1), jnp.int32)
    results = {"call_ms": {w: 1000 * t for w, t in widths.items()}}
    for name, schema in SCHEMAS.items():
        grammar = st.compile_json_schema(schema, vocab, whitespace="compact")
        rows = st.grammar_params([grammar] * batch)
        for mode, select in (("greedy", stages.greedy()), ("sampled", stages.categorical())):
            sampler = js.chain(stages.grammar(), stages.temperature(1.0), select=select)
            kw = dict(max_new_tokens=cfg.max_len - k - 2, eos_ids=list(vocab.eos_ids), sampler=sampler,
                      sampler_params={"seed": jnp.arange(batch), **rows})
            modes = {
                "plain": lambda kw=kw: generate(model, params, prompt, **kw),
                "jump": lambda kw=kw: jump_forward_generate(model, params, prompt, jump_forward=k, **kw),
                "jump min 4": lambda kw=kw: jump_forward_generate(model, params, prompt, jump_forward=k,
                                                                  jump_forward_min=4, **kw),
            }
            med = _median_times(modes, repeats)
            plain_t, plain = med["plain"]
            tokens = int(np.asarray(plain.lengths).sum())
            print(f"{name:>7} {mode:<8}{'mode':<12}{'time (s)':>9}{'tok/s':>8}{'forced rode':>13}{'tok/call':>10}"
                  f"{'speed-up':>10}  identical")
            for label, (t, o) in med.items():
                same = bool(np.array_equal(np.asarray(o.tokens), np.asarray(plain.tokens)))
                rode = int(np.asarray(getattr(o, "num_accepted", np.zeros(1))).sum())
                calls = tokens - rode
                print(f"{'':>16}{label:<12}{t:>9.3f}{tokens / t:>8.0f}{rode / tokens:>13.0%}{tokens / calls:>10.2f}"
                      f"{plain_t / t:>9.2f}x  {same}")
                results[f"{name}/{mode}/{label}"] = {"s": t, "tokens": tokens, "rode": rode,
                                                     "speedup": plain_t / t, "identical": same}
    return results


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"devices: {jax.devices()}")
    return {size: bench_size(size, args.batch, args.k, args.repeats) for size in args.sizes}


if __name__ == "__main__":
    main()
