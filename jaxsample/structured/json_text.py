r"""JSON text as expression trees: string escapes, encodings of character languages, pattern searches.

JSON strings are compiled over their *encoded* form (the bytes between the quotes). Every encoded
language here is closed under the escapes strings accept (``STRING_CHAR``: a character itself, a
short escape, or ``\u00XX`` in either case for the control characters and DEL), so a
difference of two such languages (``dfa_ops.difference``) is the difference of the decoded strings.

>>> from jaxsample.structured.automaton import compile_expr
>>> d = compile_expr(encoded_literal("a\nb"))
>>> [d.matches(x) for x in (b"a\\nb", b"a\\u000ab", b"a\\u000Ab", b"a\nb")]
[True, True, True, False]
>>> search_dfa("^ab|c$").matches(b"abz"), search_dfa("^ab|c$").matches(b"zab")
(True, False)
"""

from __future__ import annotations

import functools
import json

from jaxsample.structured import dfa_ops, formats
from jaxsample.structured import regex as _regex
from jaxsample.structured.automaton import (
    EPSILON,
    Alt,
    ByteDFA,
    Chars,
    Repeat,
    Seq,
    alt,
    chars,
    compile_expr,
    complement,
    lit,
    normalise_ranges,
    repeat,
    seq,
    star,
)

JSON_WS = chars(" \t\n\r")
_HEX = chars("0-9a-fA-F")
# DEL is legal JSON but excluded unescaped (as llguidance and llama.cpp do): a harmless over-constraint.
_UNESCAPED = complement(((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)))
_SHORT_ESCAPES = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
# Escapes are the canonical ones (as llguidance emits): short escapes except the redundant "\/", and
# "\uXXXX" only for the characters that cannot appear raw (U+0000-U+001F, DEL). Every other
# character is written as itself: an over-constraint that keeps outputs valid and canonical.
_U_ESCAPE = seq(lit("u00"), alt(seq(chars("01"), _HEX), seq(lit("7"), chars("fF"))))
STRING_CHAR = alt(Chars(_UNESCAPED), seq(lit("\\"), alt(chars('"\\\\bfnrt'), _U_ESCAPE)))
STRING_BODY = star(STRING_CHAR)
ANY_CHAR = Chars(complement(()))
def escape(text: str) -> str:
    """Canonical JSON encoding of a string's characters (no quotes)."""
    return "".join(_SHORT_ESCAPES.get(ord(c), f"\\u{ord(c):04x}" if ord(c) < 0x20 or c == "\x7f" else c) for c in text)


def escapes(cp: int):
    """Every escape ``STRING_CHAR`` accepts for code point ``cp`` (short form, ``\\u00XX`` in either case)."""
    forms = [lit(_SHORT_ESCAPES[cp])] if cp in _SHORT_ESCAPES else []
    if cp < 0x20 or cp == 0x7F:
        low = f"{cp & 15:x}"
        forms.append(seq(lit(f"\\u00{cp >> 4:x}"), chars(low + low.upper())))
    return alt(*forms)


def encoded_literal(text: str):
    """Every JSON encoding (between the quotes) of ``text`` that strings accept."""
    if escape(text) == text:  # no character needs an escape: the text is its only encoding
        return lit(text)
    return json_encoded(lit(text)) if text else EPSILON


def canonical_json(value) -> str:
    """Compact JSON text with this module's canonical string escapes."""
    if isinstance(value, str):
        return f'"{escape(value)}"'
    if isinstance(value, dict):
        return "{" + ",".join(f"{canonical_json(k)}:{canonical_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(canonical_json, value)) + "]"
    return json.dumps(value)


def json_encoded(expr):
    """Maps an expression over decoded string characters to one over their JSON encodings."""
    if isinstance(expr, Chars):
        plain = normalise_ranges(
            (max(lo, a), min(hi, b)) for lo, hi in expr.ranges for a, b in _UNESCAPED if max(lo, a) <= min(hi, b)
        )
        escaped = []
        for lo, hi in expr.ranges:
            for cp in [*range(lo, min(hi, 0x5C) + 1), *([0x7F] if lo <= 0x7F <= hi else [])]:
                if cp < 0x20 or cp in (0x22, 0x5C, 0x7F):
                    escaped.append(escapes(cp))
        return alt(*([Chars(plain)] if plain else []), *escaped)
    if isinstance(expr, Seq):
        return seq(*map(json_encoded, expr.items))
    if isinstance(expr, Alt):
        return alt(*map(json_encoded, expr.items))
    if isinstance(expr, Repeat):
        return repeat(json_encoded(expr.item), expr.lo, expr.hi)
    if formats.is_json_safe(expr):
        return expr
    raise TypeError(expr)


@functools.lru_cache(maxsize=512)
def search_dfa(pattern: str) -> ByteDFA:
    """Byte DFA of the JSON-encoded strings in which ``pattern`` finds a match (ECMAScript ``search``)."""
    return compile_expr(json_encoded(search_expr(pattern)))


def search_expr(pattern: str):
    """Strings in which ``pattern`` finds a match; each top-level alternative has its own anchors."""
    branches = []
    for part in _top_level_alternatives(pattern):
        anchored_start = part.startswith("^")
        anchored_end = part.endswith("$") and not part.endswith("\\$")
        expr = _regex.parse_regex(part)
        anything = star(ANY_CHAR)
        branches.append(seq(EPSILON if anchored_start else anything, expr, EPSILON if anchored_end else anything))
    return alt(*branches)


def _top_level_alternatives(pattern: str) -> list[str]:
    """``pattern`` split at the ``|`` outside groups and classes."""
    parts, depth, i, in_class, start = [], 0, 0, False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            j = i + 1 + (pattern[i + 1 : i + 2] == "^")
            if pattern[j : j + 1] == "]":  # "[]...]", "[^]...]": a literal ] first
                i = j
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return [*parts, pattern[start:]]


@functools.lru_cache(maxsize=64)
def body_dfa() -> ByteDFA:
    return compile_expr(STRING_BODY)


def names_dfa(names) -> ByteDFA:
    """DFA of every JSON encoding (between the quotes) of the given strings."""
    return _names_dfa(tuple(names))


@functools.lru_cache(maxsize=1024)
def _names_dfa(names: tuple) -> ByteDFA:
    return compile_expr(alt(*map(encoded_literal, names))) if names else dfa_ops.EMPTY_DFA


@functools.lru_cache(maxsize=1024)
def other_names_dfa(names: tuple) -> ByteDFA:
    """DFA of every string body (between the quotes) that encodes none of the given strings."""
    return dfa_ops.difference(body_dfa(), names_dfa(names))
