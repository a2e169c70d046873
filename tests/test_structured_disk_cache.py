"""Compiled grammars kept on disk (``grammar_cache.set_directory``): read back whole, keyed by
everything that changes the output (the compiler's own sources included), safe to corrupt."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxsample import structured as st
from jaxsample.structured import effects, grammar_cache, tables, tokens, trie
from tests._structured_vocab import bpe_vocab

SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "integer"}},
          "required": ["a"], "additionalProperties": False}  # fmt: skip
GBNF = 'root ::= "(" root ")" | "x"'  # recursive: a pushdown grammar


@pytest.fixture
def cache_dir(tmp_path):
    grammar_cache.clear()
    grammar_cache.set_directory(tmp_path / "grammars")
    yield tmp_path / "grammars"
    grammar_cache.set_directory(None)
    grammar_cache.clear()


def _no_compile(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("compiled although the grammar is on disk")

    monkeypatch.setattr(tokens, "build", refuse)
    monkeypatch.setattr(effects, "build", refuse)


def _same_with_dtypes(a, b):
    assert st.same_grammar(a, b)
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, (x.dtype, y.dtype)
    if a.pushdown is not None:
        for x, y in zip(a.pushdown, b.pushdown):
            assert type(x) is type(y) and np.asarray(x).dtype == np.asarray(y).dtype


def test_grammars_are_read_back_from_disk_without_compiling(cache_dir, monkeypatch):
    v = bpe_vocab()
    regular = st.compile_json_schema(SCHEMA, v)
    recursive = st.compile_gbnf(GBNF, v)
    assert recursive.pushdown is not None and regular.pushdown is None
    assert grammar_cache.info()["disk_writes"] == 2 and len(list(cache_dir.glob("*.grammar"))) == 2
    expected = st.stack([regular, recursive])
    grammar_cache.clear()  # as a new process would start
    _no_compile(monkeypatch)
    again, again_rec = st.compile_json_schema(SCHEMA, v), st.compile_gbnf(GBNF, v)
    assert grammar_cache.info()["disk_hits"] == 2 and again is not regular
    _same_with_dtypes(regular, again)
    _same_with_dtypes(recursive, again_rec)
    assert type(again.start) is int and again.eos_ids == regular.eos_ids
    assert not again.next.flags.writeable  # shared through the memory cache, as a compiled one
    m = st.Matcher(again_rec)  # it works as compiled
    assert m.accept_tokens([v.token_bytes.index(b"(")] * 2) == 2
    monkeypatch.setattr(tables, "_packed_next", None)  # the file held the prepared parts: not recomputed
    monkeypatch.setattr(tables, "_blocks", None)
    got = st.stack([again, again_rec])
    la, ta = jax.tree.flatten(got)
    lb, tb = jax.tree.flatten(expected)
    assert ta == tb and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, lb))


def test_whatever_changes_the_output_misses_the_disk(cache_dir, monkeypatch):
    v = bpe_vocab()
    st.compile_json_schema(SCHEMA, v)
    grammar_cache.clear()
    st.compile_json_schema(SCHEMA, v, whitespace="compact")  # another option
    st.compile_json_schema(SCHEMA, st.Vocabulary(v.token_bytes, (0,)))  # another vocabulary
    from jaxsample.structured import automaton

    monkeypatch.setattr(automaton, "MAX_DFA_STATES", automaton.MAX_DFA_STATES - 1)  # another budget
    st.compile_json_schema(SCHEMA, v)
    monkeypatch.undo()
    monkeypatch.setattr(grammar_cache, "_code_digest", lambda: "another compiler")  # edited sources
    st.compile_json_schema(SCHEMA, v)
    info = grammar_cache.info()
    assert info["disk_hits"] == 0 and info["disk_writes"] == 4 and len(list(cache_dir.glob("*.grammar"))) == 5


def _flip(blob: bytes) -> bytes:
    return blob[:-3] + bytes([blob[-3] ^ 1]) + blob[-2:]


@pytest.mark.parametrize("damage", [lambda b: b[:-40], _flip, lambda b: b"", lambda b: b"PK\x03\x04" + b[4:]],
                         ids=["truncated", "one bit flipped", "empty", "another format"])  # fmt: skip
def test_a_damaged_or_foreign_file_is_compiled_again_with_a_warning(cache_dir, damage):
    v = bpe_vocab()
    g = st.compile_regex("[a-c]{2}x", v)
    (path,) = cache_dir.glob("*.grammar")
    path.write_bytes(damage(path.read_bytes()))
    grammar_cache.clear()
    with pytest.warns(RuntimeWarning, match=f"cannot read '{path}'"):
        h = st.compile_regex("[a-c]{2}x", v)
    assert st.same_grammar(g, h) and grammar_cache.info()["disk_errors"] == 1
    grammar_cache.clear()
    st.compile_regex("[a-c]{2}x", v)  # rewritten whole: read back now
    assert grammar_cache.info()["disk_hits"] == 1
    # a file holding another key under this name (a collision, a copy): ignored, never used
    other = next(p for p in cache_dir.glob("*.grammar"))
    grammar_cache.clear()
    st.compile_regex("zz", v)
    (new,) = set(cache_dir.glob("*.grammar")) - {other}
    os.replace(new, other)
    grammar_cache.clear()
    assert st.same_grammar(st.compile_regex("[a-c]{2}x", v), g) and grammar_cache.info()["disk_hits"] == 0
    assert not list(cache_dir.glob(".*.tmp"))  # no temporary files left behind


def test_an_unwritable_directory_warns_once_and_compiles(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="path: .* not a directory"):
        grammar_cache.set_directory(blocker)
    grammar_cache.clear()
    grammar_cache.set_directory(blocker / "below")  # cannot be created
    try:
        v = bpe_vocab()
        with pytest.warns(RuntimeWarning, match="cannot write to"):
            g = st.compile_regex("q+", v)
        assert g.num_states > 1 and grammar_cache.info()["disk_errors"] == 1
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            st.compile_regex("r+", v)  # warned once
    finally:
        grammar_cache.set_directory(None)
        grammar_cache.clear()
    assert grammar_cache.directory() is None


def test_another_process_reads_what_this_one_wrote(tmp_path):
    """Keys are stable across processes (string hashing is randomised per process); the
    environment variable sets the directory at import."""
    v = bpe_vocab()
    grammar_cache.clear()
    grammar_cache.set_directory(tmp_path)
    try:
        g = st.compile_json_schema(SCHEMA, v)
    finally:
        grammar_cache.set_directory(None)
        grammar_cache.clear()
    code = (
        "import json, sys\n"
        "from jaxsample import structured as st\n"
        "from jaxsample.structured import grammar_cache, tokens\n"
        "from tests._structured_vocab import bpe_vocab\n"
        "tokens.build = None  # a compile would fail\n"
        f"g = st.compile_json_schema({SCHEMA!r}, bpe_vocab())\n"
        "print(json.dumps([grammar_cache.info()['disk_hits'], g.num_states]))\n"
    )
    env = dict(os.environ, JAXSAMPLE_GRAMMAR_CACHE_DIR=str(tmp_path), PYTHONHASHSEED="12345",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]), JAX_PLATFORMS="cpu")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == f"[1, {g.num_states}]"


RECURSIVE_SCHEMA = {"$defs": {"n": {"type": "object", "properties": {"s": {"type": "string"}, "n": {"$ref": "#/$defs/n"}}}},
                    "$ref": "#/$defs/n"}  # fmt: skip


@pytest.fixture
def fresh_index():
    trie._cached_index.cache_clear()  # as a new process: the vocabulary analysed again (or read)
    yield
    trie._cached_index.cache_clear()


def test_vocabulary_analysis_is_read_back_from_disk(cache_dir, fresh_index, monkeypatch):
    """The byte trie (with its chains), each quotient trie and the suffix ids are kept in ``*.vocab``
    files: a new process compiling a grammar it has not seen skips the analysis, same grammar."""
    v = bpe_vocab()
    built = trie.vocab_index(v)
    g = st.compile_json_schema(RECURSIVE_SCHEMA, v)  # recursive (suffixes) with string bodies (quotient)
    info = grammar_cache.info()
    assert info["vocab_disk_writes"] >= 3 and len(list(cache_dir.glob("*.vocab"))) == info["vocab_disk_writes"]
    for p in cache_dir.glob("*.grammar"):
        p.unlink()  # the grammar itself must be compiled again
    grammar_cache.clear()
    trie._cached_index.cache_clear()

    def refuse(*_a, **_k):
        raise AssertionError("the vocabulary was analysed although its analysis is on disk")

    for name in ("_byte_trie", "_quotient", "_suffix_ids", "chains"):
        monkeypatch.setattr(trie, name, refuse)
    again = st.compile_json_schema(RECURSIVE_SCHEMA, v)
    assert grammar_cache.info()["vocab_disk_hits"] == info["vocab_disk_writes"]
    _same_with_dtypes(g, again)
    read = trie.vocab_index(v)
    assert read is not built and read.strings == built.strings
    for name in ("token_ids", "string_of_token", "lengths", "end", "single_byte", "byte_weight", "_parent"):
        a, b = getattr(read, name), getattr(built, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    for a, b in zip((*read.trie, *read.chains, *read.suffixes), (*built.trie, *built.chains, *built.suffixes)):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_a_damaged_vocabulary_file_is_analysed_again_with_a_warning(cache_dir, fresh_index):
    v = bpe_vocab()
    g = st.compile_regex("[a-c]{2}y", v)
    index_file = max(cache_dir.glob("*.vocab"), key=lambda p: p.stat().st_size)  # the byte trie's
    index_file.write_bytes(_flip(index_file.read_bytes()))
    for p in cache_dir.glob("*.grammar"):
        p.unlink()
    grammar_cache.clear()
    trie._cached_index.cache_clear()
    with pytest.warns(RuntimeWarning, match=f"cannot read '{index_file}'"):
        h = st.compile_regex("[a-c]{2}y", v)
    assert st.same_grammar(g, h) and grammar_cache.info()["vocab_disk_errors"] == 1
    assert grammar_cache.info()["disk_errors"] == 0  # (grammar files are counted apart)
