"""Sort-free truncation filters vs their sort-based references, on CPU (or any default backend).

Run from the repository root::

    python -m benchmarks.samplers                      # B=64, V=131072
    python -m benchmarks.samplers --batch 8 --vocab 32768 --only top_p typical

Prints one table: milliseconds per call (median of ``--repeats`` timed calls after a warm-up
compile) for the fast function and the reference, the speed-up, and the fast time in units of one
``jax.nn.logsumexp`` pass over the same logits (the cost floor of any filter that needs
probabilities). Two logit sets are used:

* ``peaked``: Zipf(1.6) over a random permutation of the vocabulary, plus small noise; the top 64
  tokens hold ~94% of the mass, as in most steps of a language model. Filters take their
  candidate (``lax.top_k``) fast path.
* ``flat``: i.i.d. N(0, 2^2) logits; nuclei hold thousands of tokens, so top-p / typical take the
  exact bisection fallback (32 masked passes).

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


CASES = [
    Case("top_p 0.9", lambda x: js.top_p(x, 0.9), lambda x: ref.top_p(x, _rows(x, 0.9), _rows(x, 1, jnp.int32))),
    Case("top_k 40", lambda x: js.top_k(x, 40), lambda x: ref.top_k(x, _rows(x, 40, jnp.int32))),
    Case(
        "top_k 40 exact",
        lambda x: js.top_k(x, 40, exact=True),
        lambda x: ref.top_k_exact(x, _rows(x, 40, jnp.int32)),
    ),
    Case(
        "min_p 0.05",
        lambda x: js.min_p(x, 0.05),
        lambda x: ref.min_p(x, _rows(x, 0.05), _rows(x, 1, jnp.int32)),
    ),
    Case(
        "typical 0.9",
        lambda x: js.typical(x, 0.9),
        lambda x: ref.typical(x, _rows(x, 0.9), _rows(x, 1, jnp.int32)),
    ),
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
    f = jax.jit(fn)
    jax.block_until_ready(f(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ref-repeats", type=int, default=2, help="timed calls of the (slow) references")
    parser.add_argument("--only", nargs="*", default=None, help="case names starting with these words")
    parser.add_argument("--no-reference", action="store_true")
    args = parser.parse_args(argv)

    key = jax.random.key(0)
    sets = {
        "peaked": peaked_logits(key, args.batch, args.vocab),
        "flat": flat_logits(key, args.batch, args.vocab),
    }
    cases = [c for c in CASES if not args.only or any(c.name.startswith(o) for o in args.only)]
    print(f"backend={jax.default_backend()}  B={args.batch}  V={args.vocab}  jax={jax.__version__}")
    unit = time_ms(lambda x: jax.nn.logsumexp(x, axis=-1), sets["peaked"], args.repeats)
    print(f"unit: one jax.nn.logsumexp pass = {unit:.2f} ms\n")
    header = f"{'case':<18}{'logits':<8}{'fast ms':>10}{'ref ms':>11}{'speed-up':>10}{'fast/lse':>10}"
    print(header)
    print("-" * len(header))
    for case in cases:
        for set_name, x in sets.items():
            fast = time_ms(case.fast, x, args.repeats)
            if case.reference is None or args.no_reference:
                ref_ms, ratio = float("nan"), float("nan")
            else:
                ref_ms = time_ms(case.reference, x, args.ref_repeats)
                ratio = ref_ms / fast
            print(f"{case.name:<18}{set_name:<8}{fast:>10.1f}{ref_ms:>11.1f}{ratio:>9.1f}x{fast / unit:>10.1f}")


if __name__ == "__main__":
    main()
