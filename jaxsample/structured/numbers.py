"""Decimal number ranges as expression trees: canonical JSON integers and bounded decimals.

>>> from jaxsample.structured.automaton import compile_expr
>>> d = compile_expr(integer_range(-3, 120))
>>> [d.matches(x) for x in (b"-3", b"120", b"121", b"007", b"-0")]
[True, True, False, False, False]
"""

from __future__ import annotations

from jaxsample.structured.automaton import EMPTY, EPSILON, alt, chars, lit, opt, plus, repeat, seq, star

_DIGIT = chars("0-9")


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
    """Canonical JSON integers in ``[lo, hi]`` (``None`` = unbounded)."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_naturals(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        parts.append(seq(lit("-"), _naturals(max(-hi, 1) if hi is not None else 1, -lo if lo is not None else None)))
    return alt(*parts)


def _decimals(a: int, b: int | None, a_excl: bool, b_excl: bool):
    """Decimals ``y`` (no exponent) with ``a <(=) y <(=) b``, ``a >= 0`` integer, ``b`` integer or None."""
    frac_any = opt(seq(lit("."), plus(_DIGIT)))
    frac_zero = opt(seq(lit("."), plus(lit("0"))))
    frac_nonzero = seq(lit("."), star(_DIGIT), chars("1-9"), star(_DIGIT))
    if b is not None and (b < a or (b == a and (a_excl or b_excl))):
        return EMPTY
    if b == a:
        return seq(_naturals(a, a), frac_zero)
    parts = [seq(_naturals(a, a), frac_nonzero if a_excl else frac_any)]
    parts.append(seq(_naturals(a + 1, None if b is None else b - 1), frac_any))
    if b is not None and not b_excl:
        parts.append(seq(_naturals(b, b), frac_zero))
    return alt(*parts)


def number_range(lo, hi, lo_excl: bool = False, hi_excl: bool = False):
    """JSON numbers in the interval; unbounded numbers may use exponents, bounded ones do not."""
    if lo is None and hi is None:
        return seq(opt(lit("-")), integer_range(0, None), opt(seq(lit("."), plus(_DIGIT))),
                   opt(seq(chars("eE"), opt(chars("+-")), plus(_DIGIT))))  # fmt: skip
    parts = []
    if hi is None or hi > 0 or (hi == 0 and not hi_excl):
        a, a_excl = (lo, lo_excl) if lo is not None and lo >= 0 else (0, False)
        parts.append(_decimals(a, hi, a_excl, hi_excl))
    if lo is None or lo < 0:
        a, a_excl = (-hi, hi_excl) if hi is not None and hi < 0 else (0, True)
        parts.append(seq(lit("-"), _decimals(a, None if lo is None else -lo, a_excl, lo_excl)))
    return alt(*parts)
