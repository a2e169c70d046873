"""Compiled tables pinned by digest: speed work on the compiler must leave every table byte-identical.

The digests were computed on main at d138ca9 (before the compile-time work of issue 12 part 3)
over regexes, GBNF (recursive), generic JSON and JSON Schemas from the built-in tests and the
pinned JSONSchemaBench sample (regular and recursive, with quotient-trie walks), for a vocabulary
built here deterministically (every byte, plus the most frequent substrings of the sample's test
instances: no tokenizer training, so the vocabulary itself cannot drift). A digest covers every
array of the ``TokenGrammar`` (``next``, ``class_of``, masks, the stack tables of recursive
grammars) and of its device ``Tables`` (``stack``). Regenerate only for a deliberate change of the
tables: ``python -m tests.test_structured_table_digests``.
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
    "choice": "6d440825a08beabe",
    "gbnf_arithmetic": "876e7f4de54d314f",
    "json_depth4": "9fbb48f7c1cd7d39",
    "person": "4863fd4b27bde910",
    "person_compact": "42432744453d5c26",
    "regex0": "b75cfbf6953ff145",
    "regex1": "7d1dbc6f93ec1256",
    "regex2": "bd401158964cbdcc",
    "sample130": "36525630466d1a4b",
    "sample17": "f0a3317c73f77f93",
    "sample175": "2210da827f46878e",
    "sample178": "aed265356465e3a2",
    "sample180": "6645836d706ac9f7",
    "sample188": "834b8cf8393f95f1",
    "sample192": "e99589b5251a9a44",
    "sample198": "20e79897ea9feb84",
    "sample219": "fd6f8ae29ea27f70",
    "sample25": "78cc482560a41f7a",
    "sample32": "9086d1e999df2ae8",
    "sample5": "731065f96c3f4d5a",
    "sample53": "9acfdc9297ecdf06",
    "sample53_spec": "f27ba0b8ff20985a",
    "tree": "9909f0f8afa49c94",
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
    out["sample53_spec"] = lambda v: st.compile_json_schema(records[53]["schema"], v, open_objects=True, untyped="any")
    return out


def compute(name: str) -> str:
    st.grammar_cache.clear()  # compile, don't look up
    g = cases()[name](vocabulary())
    return digest(g, st.stack([g]))


def test_vocabulary_is_the_pinned_one():
    assert digest(tuple(np.frombuffer(b or b"-", np.uint8) for b in vocabulary().token_bytes)) == PINNED["vocabulary"]


@pytest.mark.parametrize("name", sorted(cases()))
def test_tables_are_byte_identical(name):
    assert compute(name) == PINNED[name], f"the compiled tables of {name} changed"


if __name__ == "__main__":  # prints the PINNED dict for the current code
    v = vocabulary()
    print("PINNED = {")
    print(f'    "vocabulary": "{digest(tuple(np.frombuffer(b or b"-", np.uint8) for b in v.token_bytes))}",')
    for name in sorted(cases()):
        print(f'    "{name}": "{compute(name)}",')
    print("}")
