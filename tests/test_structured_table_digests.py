"""Compiled tables pinned by digest: speed work on the compiler must leave every table byte-identical.

The digests were computed on main at d138ca9 (before the compile-time work of issue 12 part 3)
over regexes, GBNF (recursive), generic JSON and JSON Schemas from the built-in tests and the
pinned JSONSchemaBench sample (regular and recursive, with quotient-trie walks), for a vocabulary
built here deterministically (every byte, plus the most frequent substrings of the sample's test
instances: no tokenizer training, so the vocabulary itself cannot drift). A digest covers every
array of the ``TokenGrammar`` (``next``, ``class_of``, masks, the stack tables of recursive
grammars); a second digest covers its device ``Tables`` (``stack``). Regenerate only for a
deliberate change of the tables: ``python -m tests.test_structured_table_digests``. (The device
digests were regenerated on branch h12mem, 2026-11-27, for the compact device layout, and on branch
h12rec, 2026-11-27, for the return tables: ``pop_next``, ``return_row``, ``return_col``,
``return_next``, rests stored as ``return_next`` columns, pop lists shared by equal tokens and values; the
grammar digests are those of d138ca9: the combined digests of d138ca9 were reproduced with the
previous ``stack`` before the split. Both digests of ``json_depth4`` were regenerated on main,
2026-11-29, when token-string suffixes got exact ids numbered by length instead of hash order
(``trie._suffix_ids``): its pushdown effects are numbered in that order, so ``next`` and ``effect``
hold the same 64 effects under other ids; the Matcher on both grammars in lock step allows the same
tokens over 1,116 random steps, and every other case is byte-identical. All digests were regenerated
on branch h12register, 2026-11-29, for the key register's new arrays (``PushdownTables.effect_op`` /
``key_ops`` / ``key_need``, device ``Tables.effect_op`` / ``key_ops`` / ``key_need``): with those
fields left out of the digests, every case gave its previous digests; ``person_keys`` and
``sample25_keys`` were added.)
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json

import numpy as np
import pytest

from benchmarks.jsonschemabench_sample import load
from jaxsample import structured as st
from tests.test_structured_json_schema import SCHEMAS

#: Pinned sample schemas (record index): regular medians, schemas with quotient walks, recursive ones.
SAMPLE = (5, 17, 25, 32, 53, 130, 175, 178, 180, 188, 192, 198, 219)

REGEXES = (r"[a-z]{1,8}@[a-z]{2,6}\.(com|org)", r'"([^"\\]|\\.){0,40}"', r"(yes|no)\. [A-Z][a-z ]{0,40}\.")
ARITHMETIC = r'''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
'''
PERSON = SCHEMAS["person"]
TREE = {"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}}  # fmt: skip

PINNED = {
    "vocabulary": "6b289696cb9ff172",
    "choice": "7142c02da9046f6f",
    "gbnf_arithmetic": "fa770f62b5a57e26",
    "json_depth4": "776aff84247719db",
    "person": "a72f2240a4870d56",
    "person_compact": "620e3e394a8d9f78",
    "person_keys": "23a69191c808ccb0",
    "regex0": "735128ab640f5101",
    "regex1": "58f8c250a1d5dc98",
    "regex2": "cca7613e843c6007",
    "sample130": "ede04559b44f3d94",
    "sample17": "575e04d1892a2975",
    "sample175": "4242b09488a5e876",
    "sample178": "cb43edb48f21a560",
    "sample180": "778ba02434a3cd37",
    "sample188": "1b13687cd1309132",
    "sample192": "1d211b716d2a1097",
    "sample198": "a2c6267ddb10aa6a",
    "sample219": "32e4ca3116a230cd",
    "sample25": "aa6f5e57557f82cd",
    "sample25_keys": "6bbf26841c042bc1",
    "sample32": "bbe97b9a239fdf4e",
    "sample5": "dff7445bf0c2bf06",
    "sample53": "6201cbad56245383",
    "sample53_tracked": "c16ce9fe02a50600",
    "sample53_spec": "88de0c0875cc55e1",
    "tree": "acbddf1334da2c51",
}

#: Digests of the device ``Tables`` (``stack``), apart: a deliberate change of the device layout
#: leaves the compiler's pins above untouched.
PINNED_DEVICE = {
    "choice": "a86ef8fe3c1aa9fb",
    "gbnf_arithmetic": "7bbb718b78863bce",
    "json_depth4": "d9943bfe66761471",
    "person": "5e2dd7c7795c76fc",
    "person_compact": "6dcc885d28885f1c",
    "person_keys": "a5afc808836db9db",
    "regex0": "344874a215ec9c0a",
    "regex1": "df4f4ed2e95d3498",
    "regex2": "680f0c0347056c12",
    "sample130": "387edda36be47789",
    "sample17": "e6ba2a4574cf5c56",
    "sample175": "fb1d2ddb997bc151",
    "sample178": "b6d5884df590444e",
    "sample180": "bea167b92764559e",
    "sample188": "7cb88721b8f6dd32",
    "sample192": "9b172a817d6146c7",
    "sample198": "e52b465c8a1d69fd",
    "sample219": "86eda4b26bd81365",
    "sample25": "f06ea1698af4584f",
    "sample25_keys": "c77d9bdb99a1437d",
    "sample32": "571e5325245b84f5",
    "sample5": "0ce67bc6acf97b11",
    "sample53": "e35ce358c539a4d7",
    "sample53_tracked": "62426e6cf6744557",
    "sample53_spec": "322dbe06189c81aa",
    "tree": "e30637adf439d249",
}


@functools.cache
def vocabulary(n_strings: int = 1500) -> st.Vocabulary:
    """EOS (id 0), the 256 bytes, then the ``n_strings`` most frequent 2-8 byte substrings (by count x
    length, ties by bytes) of the sample's test instances as compact and indented JSON."""
    text = b"".join(
        json.dumps(t["data"], indent=k).encode() for r in load()[1][::3] for t in r["tests"][:2] for k in (None, 2)
    )[:60_000]
    counts = collections.Counter(text[i : i + n] for n in range(2, 9) for i in range(len(text) - n + 1))
    top = sorted(counts, key=lambda s: (-counts[s] * len(s), s))[:n_strings]
    return st.Vocabulary((None,) + tuple(bytes([b]) for b in range(256)) + tuple(top), (0,))


def digest(*values) -> str:
    h = hashlib.sha256()

    def add(x):
        if x is None:
            h.update(b"None")
        elif isinstance(x, tuple) and hasattr(x, "_fields"):
            for f in x._fields:
                h.update(f.encode())
                add(getattr(x, f))
        elif isinstance(x, (tuple, list)):
            h.update(b"(")
            for y in x:
                add(y)
            h.update(b")")
        elif hasattr(x, "shape") and hasattr(x, "dtype"):
            a = np.asarray(x)
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        else:
            h.update(repr(x).encode())

    for v in values:
        add(v)
    return h.hexdigest()[:16]


def cases() -> dict:
    """name -> a function compiling the case for a vocabulary."""
    out = {f"regex{i}": functools.partial(st.compile_regex, p) for i, p in enumerate(REGEXES)}
    out["choice"] = functools.partial(st.compile_choice, ["yes", "no", "maybe"])
    out["gbnf_arithmetic"] = functools.partial(st.compile_gbnf, ARITHMETIC)
    out["json_depth4"] = lambda v: st.compile_json(v, max_depth=4)
    out["person"] = functools.partial(st.compile_json_schema, PERSON)
    out["person_compact"] = lambda v: st.compile_json_schema(PERSON, v, whitespace="compact")
    out["tree"] = functools.partial(st.compile_json_schema, TREE)
    records = load()[1]
    for i in SAMPLE:
        out[f"sample{i}"] = functools.partial(st.compile_json_schema, records[i]["schema"])
    out["sample53_tracked"] = lambda v: st.compile_json_schema(records[53]["schema"], v, key_register=False)
    out["sample53_spec"] = lambda v: st.compile_json_schema(records[53]["schema"], v, open_objects=True, untyped="any")
    out["person_keys"] = lambda v: st.compile_json_schema(PERSON, v, key_register=True)
    out["sample25_keys"] = lambda v: st.compile_json_schema(records[25]["schema"], v, key_register=True)
    return out


def compute(name: str) -> tuple[str, str]:
    """``(digest of the TokenGrammar, digest of its device tables)``."""
    st.grammar_cache.clear()  # compile, don't look up
    g = cases()[name](vocabulary())
    return digest(g), digest(st.stack([g]))


def test_vocabulary_is_the_pinned_one():
    assert digest(tuple(np.frombuffer(b or b"-", np.uint8) for b in vocabulary().token_bytes)) == PINNED["vocabulary"]


@pytest.mark.parametrize("name", sorted(cases()))
def test_tables_are_byte_identical(name):
    grammar, device = compute(name)
    assert grammar == PINNED[name], f"the compiled tables of {name} changed"
    assert device == PINNED_DEVICE[name], f"the device tables of {name} changed"


if __name__ == "__main__":  # prints the PINNED dict for the current code
    v = vocabulary()
    print("PINNED = {")
    print(f'    "vocabulary": "{digest(tuple(np.frombuffer(b or b"-", np.uint8) for b in v.token_bytes))}",')
    found = {name: compute(name) for name in sorted(cases())}
    for name, (grammar, _) in found.items():
        print(f'    "{name}": "{grammar}",')
    print("}\nPINNED_DEVICE = {")
    for name, (_, device) in found.items():
        print(f'    "{name}": "{device}",')
    print("}")
