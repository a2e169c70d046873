"""JSON numbers as expression trees and DFAs: integer and decimal ranges, ``multipleOf``.

Integers are canonical (no leading zeros, no fraction, no exponent); ``-0`` is accepted where 0 is
in range (it is valid JSON for the value 0). Bounded numbers are plain decimals (no exponent: an
over-constraint), with exact decimal bounds; unbounded numbers take the whole JSON number syntax.
``multipleOf`` is exact decimal arithmetic (the JSON Schema definition), as a DFA of residues.

>>> from jaxsample.structured.automaton import compile_expr
>>> d = compile_expr(integer_range(-3, 120))
>>> [d.matches(x) for x in (b"-3", b"120", b"121", b"007", b"-0")]
[True, True, False, False, True]
>>> d = compile_expr(number_range(Decimal("0.25"), Decimal("1.5"), hi_excl=True))
>>> [d.matches(x) for x in (b"0.25", b"0.2", b"1.49", b"1.5", b"1")]
[True, False, True, False, True]
>>> m = multiple_of(Decimal("0.05"), integer=False)
>>> [m.matches(x) for x in (b"0.15", b"-2", b"0.151", b"0.1500")]
[True, True, False, True]
"""

from __future__ import annotations

import functools
from decimal import Decimal

import numpy as np

from jaxsample.structured.automaton import (
    EMPTY,
    EPSILON,
    ByteDFA,
    GrammarError,
    alt,
    chars,
    lit,
    opt,
    plus,
    repeat,
    seq,
    star,
)

_DIGIT = chars("0-9")
#: Largest ``multipleOf`` numerator (residues are DFA states).
MAX_MULTIPLE_RESIDUES = 4096


def _digits_between(lo: str, hi: str):
    """Digit strings of length ``len(lo)`` between ``lo`` and ``hi`` (same length)."""
    if not lo:
        return EPSILON
    if lo[0] == hi[0]:
        return seq(lit(lo[0]), _digits_between(lo[1:], hi[1:]))
    n = len(lo) - 1
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        return seq(chars(f"{lo[0]}-{hi[0]}"), repeat(_DIGIT, n, n))
    parts = [seq(lit(lo[0]), _digits_between(lo[1:], "9" * n))]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(seq(chars(f"{int(lo[0]) + 1}-{int(hi[0]) - 1}"), repeat(_DIGIT, n, n)))
    parts.append(seq(lit(hi[0]), _digits_between("0" * n, hi[1:])))
    return alt(*parts)


def _naturals(a: int, b: int | None):
    """Canonical decimals of the integers in ``[a, b]`` (``a >= 0``; ``b=None`` unbounded)."""
    if b is not None and b < a:
        return EMPTY
    parts = []
    top = len(str(a)) if b is None else len(str(b))
    for n in range(len(str(a)), top + 1):
        lo, hi = max(a, 10 ** (n - 1) if n > 1 else 0), 10**n - 1 if b is None else min(b, 10**n - 1)
        if lo <= hi:
            parts.append(_digits_between(str(lo), str(hi)))
    if b is None:
        parts.append(seq(chars("1-9"), repeat(_DIGIT, top, None)))
    return alt(*parts)


def integer_range(lo: int | None, hi: int | None):
    """Canonical JSON integers in ``[lo, hi]`` (``None`` = unbounded), and ``-0`` when 0 is in range."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_naturals(max(lo, 0) if lo is not None else 0, hi))
        if lo is None or lo <= 0:
            parts.append(lit("-0"))
    if lo is None or lo < 0:
        parts.append(seq(lit("-"), _naturals(max(-hi, 1) if hi is not None else 1, -lo if lo is not None else None)))
    return alt(*parts)


def _split(x: Decimal) -> tuple[int, str]:
    """``x >= 0`` as (integer part, fraction digits without trailing zeros)."""
    whole = int(x)
    frac = format(x - whole, "f").partition(".")[2].rstrip("0")
    return whole, frac


@functools.lru_cache(maxsize=1024)
def _fraction(low, high):
    """Fraction digit strings ``f`` (the digits after ``.``) with ``low <= 0.f <= high``.

    ``low``/``high`` are ``(digits, strict)`` or ``None`` (no bound). Returns ``(empty_ok, expr)``:
    whether the empty fraction (no ``.``) qualifies, and the non-empty digit strings that do.
    """
    if low == ("", False):
        low = None
    lo_empty = low is None or low == ("", False)
    hi_empty = high is None or high[0] != "" or not high[1]
    empty_ok = lo_empty and hi_empty
    if high == ("", True):
        return False, EMPTY
    if low is None and high is None:
        return True, plus(_DIGIT)
    if high == ("", False):  # only zeros
        return empty_ok, (EMPTY if low == ("", True) else plus(lit("0")))
    if low == ("", True) and high is None:  # > 0
        return False, seq(star(_DIGIT), chars("1-9"), star(_DIGIT))
    groups: dict = {}
    for c in "0123456789":
        nl = nh = None
        if low is not None:
            f, strict = low
            if f == "":  # strict: still only zeros
                nl = low if c == "0" else None
            elif c < f[0]:
                continue
            elif c == f[0]:
                nl = (f[1:], strict)
        if high is not None:
            f, strict = high
            if c > f[0]:
                continue
            if c == f[0]:
                nh = (f[1:], strict)
        groups.setdefault((nl, nh), []).append(c)
    parts = []
    for (nl, nh), cs in groups.items():
        e, rest = _fraction(nl, nh)
        tail = alt(EPSILON, rest) if e else rest
        parts.append(seq(chars("".join(cs)), tail))
    return empty_ok, alt(*parts)


def _nonneg(a: Decimal, b: Decimal | None, a_excl: bool, b_excl: bool):
    """Plain decimals ``y`` with ``a <(=) y <(=) b`` and ``0 <= a`` (no sign, no exponent)."""
    if b is not None and (b < a or (b == a and (a_excl or b_excl))):
        return EMPTY
    (ia, fa), (ib, fb) = _split(a), (_split(b) if b is not None else (None, None))

    def number(whole, low, high):
        empty_ok, frac = _fraction(low, high)
        return seq(whole, alt(*([EPSILON] if empty_ok else []), seq(lit("."), frac)))

    if b is not None and ia == ib:
        return number(_naturals(ia, ia), (fa, a_excl), (fb, b_excl))
    parts = [number(_naturals(ia, ia), (fa, a_excl), None)]
    parts.append(number(_naturals(ia + 1, None if ib is None else ib - 1), None, None))
    if ib is not None:
        parts.append(number(_naturals(ib, ib), None, (fb, b_excl)))
    return alt(*parts)


def plain_decimals():
    """Every JSON number without exponent (``-?int(.digits)?``)."""
    return seq(opt(lit("-")), _naturals(0, None), opt(seq(lit("."), plus(_DIGIT))))


def _dec(x) -> Decimal | None:
    return None if x is None else x if isinstance(x, Decimal) else Decimal(repr(x) if isinstance(x, float) else x)


def number_range(lo=None, hi=None, lo_excl: bool = False, hi_excl: bool = False):
    """JSON numbers in the interval (bounds: ints, floats or Decimals; ``None`` = unbounded).

    Unbounded numbers may use exponents; bounded ones are plain decimals. ``-0``, ``-0.0`` ...
    are accepted where 0 is in range.
    """
    lo, hi = _dec(lo), _dec(hi)
    if lo is None and hi is None:
        return seq(opt(lit("-")), _naturals(0, None), opt(seq(lit("."), plus(_DIGIT))),
                   opt(seq(chars("eE"), opt(chars("+-")), plus(_DIGIT))))  # fmt: skip
    zero = Decimal(0)
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        a, a_excl = (lo, lo_excl) if lo is not None and lo >= 0 else (zero, False)
        parts.append(_nonneg(a, hi, a_excl, hi_excl))
    if lo is None or lo < 0:  # y = -z with z > 0 (the zeros are below)
        a, a_excl = (-hi, hi_excl) if hi is not None and hi < 0 else (zero, True)
        parts.append(seq(lit("-"), _nonneg(a, None if lo is None else -lo, a_excl, lo_excl)))
    zero_in = (lo is None or lo < 0 or lo == 0 and not lo_excl) and (hi is None or hi > 0 or hi == 0 and not hi_excl)
    if zero_in:
        parts.append(seq(lit("-0"), opt(seq(lit("."), plus(lit("0"))))))
    return alt(*parts)


def multiple_of(m, *, integer: bool) -> ByteDFA:
    """DFA of the plain JSON numbers (``integer``: canonical integers) that are multiples of ``m > 0``.

    ``m = p / 10**k``: a number qualifies when its digits times ``10**k`` form an integer divisible
    by ``p`` (residues mod ``p`` are states; digits beyond the ``k``-th fraction digit must be 0).

    Raises:
      GrammarError: if ``p`` exceeds :data:`MAX_MULTIPLE_RESIDUES`.
    """
    m = _dec(m).normalize()
    k = max(-m.as_tuple().exponent, 0)
    p = int(m * (Decimal(10) ** k))
    if p > MAX_MULTIPLE_RESIDUES:
        raise GrammarError(f"multipleOf {m}: more than {MAX_MULTIPLE_RESIDUES} residues")
    # byte classes: 0 other, 1 '-', 2 '.', 3 + d for digit d
    byte_class = np.zeros(256, np.int32)
    byte_class[ord("-")], byte_class[ord(".")] = 1, 2
    byte_class[ord("0") : ord("9") + 1] = np.arange(3, 13)
    # states: 0 dead, 1 start, 2 after '-', 3 a zero integer part, 4 + r integer part = r (mod p),
    # then fraction states (r, j): j digits read (j = k + 1: more than k, or one when k = 0)
    int_base, frac_base = 4, 4 + p
    n = frac_base + (0 if integer else p * (k + 2))
    delta = np.zeros((n, 13), np.int32)
    accept = np.zeros(n, bool)

    def frac(r, j):
        return frac_base + j * p + r

    for s in (1, 2):
        delta[s, 3] = 3
        for c in range(1, 10):
            delta[s, 3 + c] = int_base + c % p
    delta[1, 1] = 2
    accept[3] = True
    for r in range(p):
        for c in range(10):
            delta[int_base + r, 3 + c] = int_base + (10 * r + c) % p
        accept[int_base + r] = r * 10**k % p == 0
    if not integer:
        delta[3, 2] = frac(0, 0)
        for r in range(p):
            delta[int_base + r, 2] = frac(r, 0)
            for j in range(k + 2):
                s = frac(r, j)
                if j < k:
                    delta[s, 3:] = [frac((10 * r + c) % p, j + 1) for c in range(10)]
                else:
                    delta[s, 3] = frac(r, k + 1)
                accept[s] = 1 <= j <= k and r * 10 ** (k - j) % p == 0 or j == k + 1 and r == 0
    return ByteDFA(delta, byte_class, accept, 1)
