"""Structured generation benchmark: compile time, per-step overhead in a jitted loop, device memory.

Run: ``python -m benchmarks.structured [--vocab 32000] [--batch 32] [--steps 6] [--schemas DIR] [--whitespace W]``

* **Compile time** (host: schema/grammar -> automaton -> token tables -> device tables) over a set
  of realistic schemas and GBNF grammars (recursive ones included: a ``$ref`` tree, JSON mode, the
  arithmetic grammar, llama.cpp's ``json.gbnf``), p50/p90, side by side with llguidance and
  XGrammar when they are importable (llguidance: ``LLMatcher`` construction plus its first mask,
  since it compiles lazily; XGrammar: ``GrammarCompiler`` with its cache off, one thread). Best of
  3 per grammar after one warm-up compile, wall time and process CPU time (the CPU time is less
  disturbed by other load on a shared machine). The per-vocabulary preprocessing (token trie,
  reported separately, like llguidance's ``LLTokenizer`` and XGrammar's ``TokenizerInfo``) is
  built once per vocabulary.
* ``--schemas DIR``: the same over every ``*.json`` schema below ``DIR`` (a schema file, or a
  JSONSchemaBench / MaskBench record with a ``"schema"`` field), with coverage: schemas our
  compiler rejects (unsupported keywords, budgets) are counted, and timings compare the schemas
  each engine compiles.
* **Per-step overhead** inside ``jax.jit`` + ``lax.scan`` at ``B x V``: the same chain with and
  without the grammar stage, with greedy and with categorical selection, and the stage alone; for
  a regular schema and for a recursive grammar (JSON mode: a stack per row).
* **Device memory** per compiled grammar (bucketed tables of one grammar), next to XGrammar's
  ``memory_size_bytes``; a batch adds one state (and a stack for recursive grammars) per row.

Vocabulary: a byte-level BPE trained on the Python docs (``pydoc_data``) plus JSON snippets; when
``--vocab`` exceeds what the corpus supports, it is extended with concatenations of two trained
tokens (a synthetic but realistic-shaped vocabulary: many long word-like tokens).
"""

from __future__ import annotations

import argparse
import json
import os
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

SCHEMAS = {
    "tool_call": {
        "type": "object",
        "properties": {
            "name": {"enum": ["get_weather", "search", "send_email"]},
            "arguments": {
                "type": "object",
                "properties": {
                    "location": {"type": "string"},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                },
                "required": ["location"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
    "person": {
        "type": "object",
        "properties": {
            "first_name": {"type": "string", "maxLength": 40},
            "last_name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "format": "email"},
            "phone": {"type": "string", "pattern": "^\\+?[0-9 -]{7,15}$"},
            "is_active": {"type": "boolean"},
        },
        "required": ["first_name", "last_name", "age"],
        "additionalProperties": False,
    },
    "address": {
        "type": "object",
        "properties": {
            "street": {"type": "string"},
            "city": {"type": "string"},
            "zip": {"type": "string", "pattern": "^[0-9]{5}(-[0-9]{4})?$"},
            "country": {"enum": ["US", "CA", "MX", "FR", "DE", "JP"]},
        },
        "required": ["street", "city", "country"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "format": "uuid"},
            "created": {"type": "string", "format": "date-time"},
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                        "qty": {"type": "integer", "minimum": 1},
                        "price": {"type": "number", "minimum": 0},
                    },
                    "required": ["sku", "qty", "price"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 10,
            },
            "status": {"enum": ["pending", "paid", "shipped"]},
        },
        "required": ["order_id", "items", "status"],
        "additionalProperties": False,
    },
    "extraction": {
        "type": "object",
        "properties": {
            "entities": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string"},
                        "label": {"enum": ["PERSON", "ORG", "LOC", "DATE", "MISC"]},
                        "start": {"type": "integer", "minimum": 0},
                        "end": {"type": "integer", "minimum": 0},
                    },
                    "required": ["text", "label"],
                    "additionalProperties": False,
                },
            },
            "sentiment": {"enum": ["positive", "neutral", "negative"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["entities", "sentiment"],
        "additionalProperties": False,
    },
    "twenty_fields": {
        "type": "object",
        "properties": {
            f"field_{i}": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"enum": ["a", "b", "c"]}][i % 4]
            for i in range(20)
        },
        "required": [f"field_{i}" for i in range(0, 20, 2)],
        "additionalProperties": False,
    },
    "tree": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["name"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    },
    "event": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": 100},
            "date": {"type": "string", "format": "date"},
            "attendees": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 5},
            "location": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["title", "date"],
        "additionalProperties": False,
    },
    "classification": {
        "type": "object",
        "properties": {
            "category": {"enum": [f"category_{i}" for i in range(30)]},
            "reasoning": {"type": "string", "maxLength": 200},
        },
        "required": ["category"],
        "additionalProperties": False,
    },
    "json_mode": True,
}
GBNF = {
    "arithmetic": '''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
''',
    "json.gbnf": r'''
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
''',
}


def make_vocab(size: int):
    """A byte-level BPE tokenizer (trained here) and a Vocabulary of ``size`` tokens."""
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = [topics[k] for k in sorted(topics)]
    text += [json.dumps(s) for s in SCHEMAS.values()] * 10
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer)
    base = st.Vocabulary.from_tokenizer(tok, eos_ids=[0])
    return tok, extend_vocab(base, size), base.size


def extend_vocab(base: st.Vocabulary, size: int) -> st.Vocabulary:
    """``base`` (ids kept) followed by synthetic tokens up to ``size``: distinct concatenations of two
    random multi-byte tokens of ``base`` (seeded), the shape of a large BPE's long word-like tokens."""
    pieces = list(base.token_bytes)
    words = [b for b in pieces if b and len(b) > 1]
    seen = set(b for b in pieces if b)
    rng = np.random.default_rng(0)
    while len(pieces) < size:
        cand = words[rng.integers(len(words))] + words[rng.integers(len(words))]
        if cand not in seen:
            seen.add(cand)
            pieces.append(cand)
    return st.Vocabulary(tuple(pieces), tuple(base.eos_ids))


class _GreedyTokenizer:
    """Minimal tokenizer object for llguidance's TokenizerWrapper (longest-match encoding)."""

    def __init__(self, vocab: st.Vocabulary):
        self.tokens = [b if b else b"" for b in vocab.token_bytes]
        self.eos_token_id = vocab.eos_ids[0]
        self.bos_token_id = None
        self.special_token_ids = [i for i, b in enumerate(vocab.token_bytes) if b is None]
        self._index = {b: i for i, b in enumerate(self.tokens) if b}
        self._max = max(len(b) for b in self.tokens)

    def __call__(self, data: bytes):
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._max, len(data) - i), 0, -1):
                j = self._index.get(data[i : i + n])
                if j is not None:
                    out.append(j)
                    i += n
                    break
            else:
                i += 1
        return out


class Engines:
    """llguidance and XGrammar over the same vocabulary, when importable (else their columns are NaN)."""

    def __init__(self, vocab: st.Vocabulary):
        self.vocab = vocab
        try:
            import llguidance as llg
            from llguidance import TokenizerWrapper

            self.llg = llg
            self.llg_tok = llg.LLTokenizer(TokenizerWrapper(_GreedyTokenizer(vocab)), n_vocab=vocab.size)
        except ImportError:
            self.llg = None
        try:
            import xgrammar as xgr

            info = xgr.TokenizerInfo([b or b"" for b in vocab.token_bytes], vocab_type=xgr.VocabType.RAW,
                                     vocab_size=vocab.size, stop_token_ids=list(vocab.eos_ids))  # fmt: skip
            self.xgr = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        except ImportError:
            self.xgr = None

    def llguidance(self, kind: str, source, repeats: int) -> float:
        """Seconds to a first mask (construction + first mask; NaN if absent or refused)."""
        if self.llg is None:
            return float("nan")
        llg = self.llg
        if kind == "gbnf":
            text = llg.LLMatcher.grammar_from_lark(llg.gbnf_to_lark.gbnf_to_lark(source))
        else:
            text = llg.LLMatcher.grammar_from_json_schema(source if source is not True else {})

        def run():
            m = llg.LLMatcher(self.llg_tok, text, log_level=0)
            m.compute_bitmask()
            if m.is_error():
                raise ValueError(m.get_error())

        try:
            return _best(run, repeats)[0][0]
        except Exception:  # refused
            return float("nan")

    def xgrammar(self, kind: str, source, repeats: int) -> tuple[float, float]:
        """``(seconds, bytes)`` of XGrammar's compile (NaN if absent or refused)."""
        if self.xgr is None:
            return float("nan"), float("nan")
        if kind == "gbnf":
            run = lambda: self.xgr.compile_grammar(source)  # noqa: E731
        elif source is True:
            run = self.xgr.compile_builtin_json_grammar
        else:
            run = lambda: self.xgr.compile_json_schema(json.dumps(source))  # noqa: E731
        try:
            (secs, _), compiled = _best(run, repeats)
        except Exception:  # refused
            return float("nan"), float("nan")
        return secs, float(compiled.memory_size_bytes)


def _best(fn, repeats: int):
    """``((wall s, cpu s), result)``: the fastest of ``repeats`` runs (wall and CPU time minimised separately)."""
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return (min(walls), min(cpus)), out


def _ours(kind: str, source, vocab, whitespace: str):
    if kind == "gbnf":
        return lambda: st.compile_gbnf(source, vocab)
    if source is True:
        return lambda: st.compile_json(vocab, whitespace=whitespace)
    # properties in schema order: the documented tables were measured so (before any order became the default)
    return lambda: st.compile_json_schema(source, vocab, whitespace=whitespace, property_order="schema")


def _device(g) -> tuple[int, object]:
    """Device bytes of one grammar's bucketed tables (compile time includes building them)."""
    tables = st.stack([g])
    jax.block_until_ready(tables.arrays())
    return st.nbytes(tables), tables


def bench_compile(vocab, repeats: int = 3, whitespace: str = "bounded"):
    """``(rows, grammars)``: per grammar ``(name, (ours wall, cpu), llg s, (xgr s, xgr bytes), S, C, U,
    device bytes, recursive)``, and each grammar compiled, by name."""
    engines = Engines(vocab)
    rows, grammars = [], {}
    items = [("schema", k, v) for k, v in SCHEMAS.items()] + [("gbnf", k, v) for k, v in GBNF.items()]
    for kind, name, source in items:
        compile_ = _ours(kind, source, vocab, whitespace)
        ours, (g, (nb, _)) = _best(lambda: (lambda g: (g, _device(g)))(compile_()), repeats)
        grammars[name] = g
        rows.append((name, ours, engines.llguidance(kind, source, repeats), engines.xgrammar(kind, source, repeats),
                     g.num_states, g.num_classes, g.masks.shape[0], nb, g.pushdown is not None))  # fmt: skip
    return rows, grammars


def _load_schema(path: Path):
    data = json.loads(path.read_text())
    return data["schema"] if isinstance(data, dict) and "schema" in data and "tests" in data else data


def bench_directory(vocab, root: str, repeats: int = 1, whitespace: str = "bounded"):
    """Compile every schema under ``root``: ``(rows, failures)``; a row is ``(file, (ours wall, cpu) or None,
    llg s, (xgr s, xgr bytes), device bytes or None)``."""
    engines = Engines(vocab)
    rows, failures = [], {}
    for path in sorted(Path(root).rglob("*.json")):
        schema = _load_schema(path)
        try:
            ours, (g, (nb, _)) = _best(lambda: (lambda g: (g, _device(g)))(_ours("schema", schema, vocab, whitespace)()), repeats)
        except (st.GrammarError, RecursionError) as e:
            kind = str(e).split(":")[-1].strip()[:60] if isinstance(e, st.GrammarError) else "recursion"
            failures[kind] = failures.get(kind, 0) + 1
            ours, nb = None, None
        rows.append((str(path.relative_to(root)), ours, engines.llguidance("schema", schema, repeats),
                     engines.xgrammar("schema", schema, repeats), nb))  # fmt: skip
    return rows, failures


def bench_step(vocab, grammar, batch: int, steps: int, repeats: int = 5):
    v = vocab.size
    table = jax.random.normal(jax.random.key(0), (256, v)) * 3.0

    def runner(sampler, process_only=False):
        def run(state, params):
            def body(carry, _):
                state, last = carry
                x = table[last % 256]
                if process_only:
                    x, state = sampler.process(x, state, params)
                    tok = jnp.argmax(x[:, :8], axis=-1).astype(jnp.int32)  # keep the loop dependent on x
                    return (state, tok), tok
                tok, _, state = sampler.sample(x, state, params)
                return (state, tok), tok

            init = (state, jnp.ones(params["seed"].shape, jnp.int32))
            return jax.lax.scan(body, init, None, length=steps)[1]

        return jax.jit(run)

    bound = st.grammar_params([grammar] * batch)
    results = {}
    for sel_name, sel in (("process", stages.greedy()), ("greedy", stages.greedy()), ("categorical", stages.categorical())):
        for constrained in (False, True):
            parts = [stages.temperature(1.0)] + ([stages.grammar()] if constrained else [])
            sampler = js.chain(*parts, select=sel)
            params = sampler.params((batch,), seed=jnp.arange(batch), **(bound if constrained else {}))
            state = sampler.init(params, vocab_size=v)
            results[(sel_name, constrained)] = (runner(sampler, sel_name == "process"), state, params)
    for f, state, params in results.values():
        jax.block_until_ready(f(state, params))
    times = {k: [] for k in results}
    for _ in range(repeats):  # interleaved, to share the machine's load fairly
        for k, (f, state, params) in results.items():
            t = time.perf_counter()
            jax.block_until_ready(f(state, params))
            times[k].append((time.perf_counter() - t) / steps)
    return {k: float(np.min(ts)) for k, ts in times.items()}  # min: least disturbed by other load


def _percentiles(xs, scale: float = 1e3, unit: str = "ms") -> str:
    xs = np.asarray(xs, np.float64) * scale
    xs = xs[np.isfinite(xs)]
    return f"{np.percentile(xs, 50):.1f}/{np.percentile(xs, 90):.1f} {unit}" if xs.size else "n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--whitespace", default="bounded", choices=["bounded", "compact", "free"])
    ap.add_argument("--schemas", help="directory of JSON schemas (e.g. a JSONSchemaBench sample)")
    ap.add_argument("--no-step", action="store_true", help="skip the per-step measurement")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; whitespace={args.whitespace}")
    t = time.perf_counter()
    _, vocab, trained = make_vocab(args.vocab)
    print(f"vocabulary: {vocab.size} tokens ({trained} trained BPE, rest synthetic); built in {time.perf_counter() - t:.1f}s")
    t = time.perf_counter()
    st.compile_regex("a", vocab)  # builds the per-vocabulary token trie (once per vocabulary)
    print(f"per-vocabulary preprocessing (token trie, cached): {1e3 * (time.perf_counter() - t):.0f} ms")
    rows, grammars = bench_compile(vocab, whitespace=args.whitespace)
    print(f"\n{'grammar':14} {'ours ms':>8} {'cpu ms':>7} {'llg ms':>7} {'xgr ms':>7} {'S':>5} {'C':>4} {'U':>4} "
          f"{'device KiB':>10} {'xgr KiB':>8}")  # fmt: skip
    for name, (wall, cpu), llg, (xgr, xgr_b), s, c, u, nb, rec in rows:
        print(f"{name + (' *' if rec else ''):14} {wall * 1e3:8.1f} {cpu * 1e3:7.1f} {llg * 1e3:7.2f} {xgr * 1e3:7.2f} "
              f"{s:5d} {c:4d} {u:4d} {nb / 1024:10.0f} {xgr_b / 1024:8.0f}")  # fmt: skip
    print("(* recursive: a stack per row)")
    print(f"compile p50/p90: ours {_percentiles([r[1][0] for r in rows])} (CPU {_percentiles([r[1][1] for r in rows])}); "
          f"llguidance {_percentiles([r[2] for r in rows])}; XGrammar {_percentiles([r[3][0] for r in rows])}")  # fmt: skip
    if args.schemas:
        found, failures = bench_directory(vocab, args.schemas, whitespace=args.whitespace)
        ok = [r for r in found if r[1] is not None]
        print(f"\n{args.schemas}: {len(ok)}/{len(found)} schemas compiled; rejected: "
              f"{sorted(failures.items(), key=lambda x: -x[1])[:8]}")  # fmt: skip
        print(f"  compile p50/p90 (each engine on the schemas it compiles): ours {_percentiles([r[1][0] for r in ok])} "
              f"(CPU {_percentiles([r[1][1] for r in ok])}), llguidance {_percentiles([r[2] for r in found])} "
              f"({int(np.isfinite([r[2] for r in found]).sum())}), XGrammar {_percentiles([r[3][0] for r in found])} "
              f"({int(np.isfinite([r[3][0] for r in found]).sum())})")  # fmt: skip
        both = [r for r in ok if np.isfinite(r[3][1])]
        print(f"  memory p50/p90 on the {len(both)} both compile: ours (device tables) "
              f"{_percentiles([r[4] for r in both], 1 / 2**20, 'MiB')}, XGrammar {_percentiles([r[3][1] for r in both], 1 / 2**20, 'MiB')}")  # fmt: skip
        for r in sorted(ok, key=lambda r: -r[1][0])[:5]:
            print(f"  slowest: {r[0]} {r[1][0] * 1e3:.0f} ms, {r[4] / 2**20:.1f} MiB")
    if args.no_step:
        return
    for name in ("order", "json_mode"):
        g = grammars[name]
        res = bench_step(vocab, g, args.batch, args.steps)
        print(f"\nper-step time ({name}{', recursive' if g.pushdown is not None else ''}), jitted lax.scan, "
              f"B={args.batch}, V={vocab.size}, {jax.devices()[0].platform}:")  # fmt: skip
        for sel in ("process", "greedy", "categorical"):
            a, b = res[(sel, False)], res[(sel, True)]
            label = "temperature stage only" if sel == "process" else f"temperature + {sel}"
            print(f"  {label:28} unconstrained {a * 1e3:8.2f} ms  constrained {b * 1e3:8.2f} ms  overhead {100 * (b / a - 1):+6.1f}%")
        one = st.nbytes(st.stack([g]))
        print(f"  device memory: {one / 2**20:.2f} MiB of tables for the batch + per row a state"
              f"{' and a stack' if g.pushdown is not None else ''}")  # fmt: skip


if __name__ == "__main__":
    main()
