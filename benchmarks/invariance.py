"""Batch invariance under the installed jaxlib and ``XLA_FLAGS``: which rows differ between batch sizes.

Run from the repository root::

    python -m benchmarks.invariance                     # every sampler function and preset, V 24 / 1000 / 32000
    python -m benchmarks.invariance --vocab 1000 --only top_n_sigma log_softmax

Every sampler function (per-row parameters, mixed rows: ties, peaked, flat, sparse, ``-inf`` and
huge rows) and every preset's dense step (``process -> select -> accept``) and ``sample`` run once on
``B = 64`` rows, then on the same rows in batches of 13, 8 and 1; each row's outputs (tokens,
processed logits, state) are compared bit for bit with its row of the 64-row program. Prints one
line per function and batch size whose rows differ, with the largest difference in ulp (integers:
units). Not a test: XLA:CPU's choice of code per shape (docs/conventions.md, "Batch invariance")
makes some of these differ by design of the compiler, and the list changes with jaxlib versions.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jaxsample as js
from jaxsample import presets
from tests import test_fastpath as fp

B = 64
SIZES = (13, 8, 1)
KINDS = ("normal", "normal", "ties", "peaked", "flat", "sparse", "tiny_gaps", "empty", "huge")


def _leaves(tree) -> list[np.ndarray]:
    out = []
    for a in jax.tree.leaves(tree):
        a = np.asarray(jax.random.key_data(a) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a)
        out.append(a.view(np.int32) if a.dtype == np.float32 else a.astype(np.int64))
    return out


def _ordered(a: np.ndarray) -> np.ndarray:
    """float32 bit patterns (as int32) mapped to integers in float order, so differences count ulp."""
    a = a.astype(np.int64)
    return np.where(a < 0, -(a & 0x7FFFFFFF), a)


def compare(name: str, fn, args) -> list[str]:
    """Rows of ``fn(*args)`` (leading axis ``B``) against the same rows in batches of ``SIZES``."""
    ref = _leaves(fn(*args))
    found = []
    for b in SIZES:
        worst, rows = 0, set()
        for start in range(0, B - b + 1, b):
            got = _leaves(fn(*jax.tree.map(lambda a: a[start : start + b], args)))
            for g, r in zip(got, ref):
                r = r[start : start + b]
                diff = (g != r).reshape(b, -1).any(-1)
                if diff.any():
                    rows.update((np.flatnonzero(diff) + start).tolist())
                    worst = max(worst, int(np.abs(_ordered(g) - _ordered(r)).max()))
        if rows:
            found.append(f"{name}: batch of {b} vs {B}: rows {sorted(rows)[:8]}{' ...' if len(rows) > 8 else ''} "
                         f"({len(rows)}), up to {worst} ulp")
    return found


def functions(v: int):
    """``(name, fn, args)`` for every sampler function on ``B`` mixed rows of ``v`` logits."""
    rng = np.random.default_rng(v)
    x = jnp.asarray(np.stack([fp._row(rng, k, v) for k in rng.choice(KINDS, B)]))
    u = lambda lo, hi: jnp.asarray(rng.uniform(lo, hi, B).astype(np.float32))  # noqa: E731
    keys = jax.random.split(jax.random.key(v), B)
    hist = jnp.asarray(rng.integers(-1, v, (B, 32)).astype(np.int32))
    return [
        ("top_k", js.top_k, (x, jnp.asarray(rng.integers(1, 80, B).astype(np.int32)))),
        ("top_p", js.top_p, (x, u(0.05, 1.0))),
        ("min_p", js.min_p, (x, u(0.0, 0.5))),
        ("typical", js.typical, (x, u(0.05, 1.0))),
        ("top_n_sigma", js.top_n_sigma, (x, u(0.0, 3.0))),
        ("top_h", js.top_h, (x, u(0.0, 1.0))),
        ("epsilon_cutoff", js.epsilon_cutoff, (x, u(0.0, 0.05))),
        ("eta_cutoff", js.eta_cutoff, (x, u(0.0, 0.05))),
        ("p_less", js.p_less, (x,)),
        ("xtc", js.xtc, (keys, x, u(0.0, 1.0), u(0.0, 0.5))),
        ("temperature", js.temperature, (x, u(0.0, 2.0))),
        ("dynamic_temperature", js.dynamic_temperature, (x, u(0.1, 2.0), u(0.0, 1.0), u(0.5, 2.0))),
        ("greedy", js.greedy, (x,)),
        ("categorical", js.categorical, (keys, x)),
        ("mirostat", js.mirostat, (keys, x, u(2, 10), u(2, 5), u(0.05, 0.5))),
        ("mirostat_v2", js.mirostat_v2, (keys, x, u(2, 10), u(2, 5), u(0.05, 0.5))),
        ("adaptive_p", js.adaptive_p, (keys, x, u(0, 5), u(1, 10), u(-0.2, 1.0), u(0.0, 0.99))),
        ("penalties", js.penalties, (x, hist, u(0.5, 2.0), u(-1, 1), u(-1, 1))),
        ("dry", js.dry, (x, hist, u(0.0, 2.0))),
        ("log_softmax", js.log_softmax, (x,)),
    ]


def preset_steps(name: str, sampler, v: int):
    """``(name, fn, args)`` for a sampler's dense step and its ``sample`` on ``B`` mixed rows."""
    fp.B = B  # the property's random parameter values, for B rows
    rng = np.random.default_rng(v + 1)
    x = jnp.asarray(np.stack([fp._row(rng, k, v) for k in rng.choice(KINDS, B)]))
    params = {**sampler.params((B,)), **{k: jnp.asarray(a) for k, a in fp._values(rng, sampler, v).items()}}
    prompt = jnp.asarray(np.where(rng.random((B, fp.P)) < 0.2, -1, rng.integers(0, v, (B, fp.P))).astype(np.int32))
    w = max(16, sampler.history_size())
    state = jax.jit(lambda p, q: sampler.init(p, vocab_size=v, prompt=q, encoder_ids=q, history_size=w))(params, prompt)

    def dense(x, state, params):
        processed, state = sampler.process(x, state, params)
        tokens, state = sampler.select(processed, state, params)
        return tokens, processed, sampler.accept(tokens, state, params)

    return [(f"{name} dense step", dense, (x, state, params)), (f"{name} sample", sampler.sample, (x, state, params))]


PRESETS = {"llama_cpp": presets.llama_cpp(), "llama_cpp_mirostat": presets.llama_cpp(mirostat=2),
           "vllm": presets.vllm(), "hf": fp.PRESETS["hf"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocab", type=int, nargs="*", default=[24, 1000, 32000])
    parser.add_argument("--only", nargs="*", default=None, help="names starting with these words")
    args = parser.parse_args()
    print(f"backend={jax.default_backend()}  jax={jax.__version__}  B={B} vs {SIZES}", flush=True)
    found = []
    for v in args.vocab:
        cases = functions(v) + [c for n, p in PRESETS.items() for c in preset_steps(n, p.sampler, v)]
        for name, fn, fn_args in cases:
            if args.only and not any(name.startswith(w) for w in args.only):
                continue
            lines = compare(f"{name} V={v}", jax.jit(fn), fn_args)
            print("\n".join(lines) if lines else f"ok {name} V={v}", flush=True)
            found += lines
    print(f"{len(found)} differing (function, batch size) pairs")


if __name__ == "__main__":
    main()
