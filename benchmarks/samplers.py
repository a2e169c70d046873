"""Every sampler function against its straightforward reference, in ``logsumexp`` passes (CPU or any backend).

Run from the repository root::

    python -m benchmarks.samplers                      # B=64, V=131072
    python -m benchmarks.samplers --batch 8 --vocab 32768 --only top_p typical --no-reference

Prints one table: milliseconds per call (median of ``--repeats`` rounds; every round times each
case once, interleaved with one ``jax.nn.logsumexp`` pass over the same logits, so machine load hits
both alike) for the jaxsample function and its reference, the speed-up, and the function's time in
``logsumexp`` passes (its median over the pass's median: the cost floor of any filter that needs
probabilities, and the unit of issue 13's goal of at most 4 passes per function). The references
are the sort-based filters of ``tests/reference_samplers.py`` and, for the draw,
``jax.random.categorical``. Two logit sets are used:

* ``peaked``: Zipf(1.6) over a random permutation of the vocabulary, plus small noise; the top 64
  tokens hold ~94% of the mass, as in most steps of a language model.
* ``flat``: i.i.d. N(0, 2^2) logits; nuclei hold tens of thousands of tokens, so top-p / typical
  take their exact searches over the vocabulary and ``categorical`` draws noise for every token.

To add a comparison, append a :class:`Case` to :data:`CASES`: a name, the fast function and the
reference, each ``(logits [B, V]) -> array``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

import jaxsample as js
from tests import reference_samplers as ref


class Case(NamedTuple):
    name: str
    fast: Callable[[jax.Array], jax.Array]
    reference: Callable[[jax.Array], jax.Array] | None


def _rows(x, value, dtype=jnp.float32):
    """A per-row parameter ``[B]`` (the references take one value per row)."""
    return jnp.full(x.shape[:-1], value, dtype)


def _keys(x):
    return jax.random.split(jax.random.key(1), x.shape[0])


def _one(x):
    return _rows(x, 1, jnp.int32)


CASES = [
    Case("top_k 40", lambda x: js.top_k(x, 40), lambda x: ref.top_k(x, _rows(x, 40, jnp.int32))),
    Case("top_k 40 exact", lambda x: js.top_k(x, 40, exact=True), lambda x: ref.top_k_exact(x, _rows(x, 40, jnp.int32))),
    Case("top_p 0.95", lambda x: js.top_p(x, 0.95), lambda x: ref.top_p(x, _rows(x, 0.95), _one(x))),
    Case("min_p 0.05", lambda x: js.min_p(x, 0.05), lambda x: ref.min_p(x, _rows(x, 0.05), _one(x))),
    Case("typical 0.9", lambda x: js.typical(x, 0.9), lambda x: ref.typical(x, _rows(x, 0.9), _one(x))),
    Case("top_n_sigma 1", lambda x: js.top_n_sigma(x, 1.0), lambda x: ref.top_n_sigma(x, _rows(x, 1.0))),
    Case("epsilon 3e-4", lambda x: js.epsilon_cutoff(x, 3e-4), lambda x: ref.epsilon_cutoff(x, _rows(x, 3e-4), _one(x))),
    Case("eta 3e-4", lambda x: js.eta_cutoff(x, 3e-4), lambda x: ref.eta_cutoff(x, _rows(x, 3e-4), _one(x))),
    Case("top_h 0.4", lambda x: js.top_h(x, 0.4), lambda x: ref.top_h(x, _rows(x, 0.4))),
    Case("p_less", js.p_less, lambda x: ref.p_less(x, _one(x))),
    Case(
        "xtc 1 / 0.1",
        lambda x: js.xtc(_keys(x), x, 1.0, 0.1),
        lambda x: ref.xtc(_rows(x, 0.0), x, _rows(x, 1.0), _rows(x, 0.1), _one(x)),
    ),
    Case("temperature 0.8", lambda x: js.temperature(x, 0.8), lambda x: x / 0.8),
    Case("dyn. temperature", lambda x: js.dynamic_temperature(x, 0.8, 0.5), None),
    Case("greedy", js.greedy, lambda x: jnp.argmax(x, axis=-1)),
    Case("categorical", lambda x: js.categorical(_keys(x), x), lambda x: jax.random.categorical(jax.random.key(1), x)),
]


def peaked_logits(key, batch, vocab, exponent=1.6):
    """Zipf(``exponent``) log-probabilities in a random order per row, plus N(0, 0.1^2) noise."""
    k1, k2 = jax.random.split(key)
    base = -exponent * jnp.log(jnp.arange(1, vocab + 1, dtype=jnp.float32))
    perm = jax.vmap(lambda k: jax.random.permutation(k, vocab))(jax.random.split(k1, batch))
    return base[perm] + 0.1 * jax.random.normal(k2, (batch, vocab))


def flat_logits(key, batch, vocab):
    return 2.0 * jax.random.normal(key, (batch, vocab))


def time_ms(fn, x, repeats):
    """Median wall time (ms) of ``repeats`` calls of ``jax.jit(fn)(x)`` after one warm-up call."""
    return time_interleaved({"fn": fn}, x, repeats)["fn"]


def time_interleaved(fns: dict, x, repeats: int) -> dict:
    """Median wall time (ms) of each ``jax.jit(fn)(x)``, timed in ``repeats`` interleaved rounds.

    Interleaving spreads the machine's load over every function alike, so ratios of the results
    (e.g. in units of a ``logsumexp`` pass timed in the same rounds) hold on a busy machine.
    """
    jitted = {name: jax.jit(fn) for name, fn in fns.items()}
    for f in jitted.values():
        jax.block_until_ready(f(x))
    times = {name: [] for name in jitted}
    for _ in range(repeats):
        for name, f in jitted.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f(x))
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def lse_pass(x):
    """The unit: one ``jax.nn.logsumexp`` pass over ``x [B, V]``."""
    return jax.nn.logsumexp(x, axis=-1)


def cpu_name() -> str:
    """The host CPU's model name (the pass unit depends on it), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or "unknown CPU"


def markdown(results: dict, first: str, ratio_of: str) -> str:
    """README rows from ``{(case, set): {"ms", "ref_ms", "passes"}}``: one row per case, peaked / flat side by side."""
    import os

    def pair(case, key, fmt):
        values = [results[case, s][key] for s in ("peaked", "flat") if (case, s) in results]
        return " / ".join("-" if v != v else fmt.format(v) for v in values)

    lse_ms = [r["lse_ms"] for r in results.values()]
    lse = f"{min(lse_ms):.1f}-{max(lse_ms):.1f}"
    lines = [
        f"<!-- {jax.default_backend()}, {cpu_name()}, jax {jax.__version__}, load average "
        f"{os.getloadavg()[0]:.1f}; one logsumexp pass (ms): {lse} -->",
        f"| {first} | passes peaked / flat | ms peaked / flat | speed-up over {ratio_of} (peaked / flat) |",
        "|---|---:|---:|---:|",
    ]
    for case in dict.fromkeys(c for c, _ in results):
        lines.append(f"| {case} | {pair(case, 'passes', '{:.1f}')} | {pair(case, 'ms', '{:.1f}')} | "
                     f"{pair(case, 'speedup', '{:.3g}x')} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ref-repeats", type=int, default=2, help="timed calls of the (slow) references")
    parser.add_argument("--only", nargs="*", default=None, help="case names starting with these words")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="also print the README table")
    args = parser.parse_args(argv)

    key = jax.random.key(0)
    sets = {
        "peaked": peaked_logits(key, args.batch, args.vocab),
        "flat": flat_logits(key, args.batch, args.vocab),
    }
    cases = [c for c in CASES if not args.only or any(c.name.startswith(o) for o in args.only)]
    print(f"backend={jax.default_backend()}  B={args.batch}  V={args.vocab}  jax={jax.__version__}\n")
    header = f"{'case':<18}{'logits':<8}{'fast ms':>10}{'ref ms':>11}{'speed-up':>10}{'lse passes':>12}"
    print(header)
    print("-" * len(header))
    results = {}
    for case in cases:
        for set_name, x in sets.items():
            ms = time_interleaved({"fast": case.fast, "lse": lse_pass}, x, args.repeats)
            if case.reference is None or args.no_reference:
                ref_ms, ratio = float("nan"), float("nan")
            else:
                ref_ms = time_ms(case.reference, x, args.ref_repeats)
                ratio = ref_ms / ms["fast"]
            passes = ms["fast"] / ms["lse"]
            results[case.name, set_name] = dict(ms=ms["fast"], lse_ms=ms["lse"], speedup=ratio, passes=passes)
            print(f"{case.name:<18}{set_name:<8}{ms['fast']:>10.1f}{ref_ms:>11.1f}{ratio:>9.1f}x{passes:>12.1f}", flush=True)
    if args.markdown:
        print("\n" + markdown(results, "function (`benchmarks/samplers.py`)", "the sorted reference"))
    return results


if __name__ == "__main__":
    main()
