"""Structured generation benchmark: compile time, per-step overhead in a jitted loop, device memory.

Run: ``python -m benchmarks.structured [--vocab 32000] [--batch 32] [--steps 6] [--schemas DIR]``

* **Compile time** (host: schema -> byte DFA -> token tables) over a set of realistic schemas,
  p50/p90, side by side with llguidance when it is installed (``LLMatcher`` construction plus its
  first mask: llguidance compiles lazily, so its first mask is part of its time-to-first-mask).
  Best of 3 per schema, after one warm-up compile: the per-vocabulary preprocessing (token trie,
  reported separately, like llguidance's ``LLTokenizer``) is built once per vocabulary.
* ``--schemas DIR``: the same over every ``*.json`` schema below ``DIR`` (e.g. a sample of
  JSONSchemaBench), with coverage: schemas our compiler rejects (unsupported keywords, budgets)
  are counted, and timings compare the schemas both engines compile.
* **Per-step overhead** inside ``jax.jit`` + ``lax.scan`` at ``B x V``: the same chain with and
  without the grammar stage, with greedy and with categorical selection, and the stage alone.
* **Device memory** per compiled schema (bucketed tables of one grammar); a batch adds one
  ``int32`` state per row (rows share their grammar's tables).

Vocabulary: a byte-level BPE trained on the Python docs (``pydoc_data``) plus JSON snippets; when
``--vocab`` exceeds what the corpus supports, it is extended with concatenations of two trained
tokens (a synthetic but realistic-shaped vocabulary: many long word-like tokens).
"""

from __future__ import annotations

import argparse
import json
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
    pieces = list(base.token_bytes)
    words = [b for b in pieces if b and len(b) > 1]
    seen = set(b for b in pieces if b)
    rng = np.random.default_rng(0)
    while len(pieces) < size:
        cand = words[rng.integers(len(words))] + words[rng.integers(len(words))]
        if cand not in seen:
            seen.add(cand)
            pieces.append(cand)
    return tok, st.Vocabulary(tuple(pieces), (0,)), base.size


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


def _llguidance(vocab):
    try:
        import llguidance as llg
        from llguidance import TokenizerWrapper
    except ImportError:
        return None, None
    return llg, llg.LLTokenizer(TokenizerWrapper(_GreedyTokenizer(vocab)), n_vocab=vocab.size)


def _best(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def _llg_time(llg, lt, schema, repeats: int) -> float:
    if llg is None:
        return float("nan")
    text = llg.LLMatcher.grammar_from_json_schema(schema if schema is not True else {})

    def run():
        m = llg.LLMatcher(lt, text, log_level=0)
        m.compute_bitmask()
        if m.is_error():
            raise ValueError(m.get_error())

    return _best(run, repeats)[0]


#: The options the documented tables were measured with (before free whitespace and any property
#: order became the defaults): bounded whitespace, properties in schema order.
MEASURED_AS = {"whitespace": "bounded", "property_order": "schema"}


def bench_compile(vocab, repeats: int = 3):
    """``(rows, grammars)``: per schema ``(name, ours s, llguidance s, S, C, U, device bytes, (S, C) buckets,
    U bucket)``, and each schema's compiled grammar by name."""
    llg, lt = _llguidance(vocab)
    rows, grammars = [], {}
    for name, schema in SCHEMAS.items():
        if schema is True:
            compile_ = lambda: st.compile_json(vocab)  # noqa: E731
        else:
            compile_ = lambda: st.compile_json_schema(schema, vocab, **MEASURED_AS)  # noqa: E731
        ours, g = _best(compile_, repeats)
        grammars[name] = g
        tables = st.stack([g])
        rows.append((name, ours, _llg_time(llg, lt, schema, repeats), g.num_states, g.num_classes,
                     g.masks.shape[0], st.nbytes(tables), tables.next.shape[1:], tables.masks.shape[1]))  # fmt: skip
    return rows, grammars


def bench_directory(vocab, root: str, repeats: int = 1):
    """Compile every schema under ``root``: ``(rows, failures)``; a row is ``(file, ours s, llg s, S, bytes)``."""
    llg, lt = _llguidance(vocab)
    rows, failures = [], {}
    for path in sorted(Path(root).rglob("*.json")):
        schema = json.loads(path.read_text())
        try:
            ours, g = _best(lambda: st.compile_json_schema(schema, vocab), repeats)
        except (st.GrammarError, RecursionError) as e:
            kind = str(e).split(":")[-1].strip()[:60] if isinstance(e, st.GrammarError) else "recursion"
            failures[kind] = failures.get(kind, 0) + 1
            continue
        try:
            theirs = _llg_time(llg, lt, schema, repeats)
        except Exception:  # llguidance rejects some schemas we accept
            theirs = float("nan")
        rows.append((str(path.relative_to(root)), ours, theirs, g.num_states, st.nbytes(st.stack([g]))))
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


def _percentiles(xs) -> str:
    xs = np.asarray(xs, np.float64) * 1e3
    xs = xs[np.isfinite(xs)]
    return f"{np.percentile(xs, 50):.1f}/{np.percentile(xs, 90):.1f} ms" if xs.size else "n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--schemas", help="directory of JSON schemas (e.g. a JSONSchemaBench sample)")
    args = ap.parse_args()
    t = time.perf_counter()
    _, vocab, trained = make_vocab(args.vocab)
    print(f"vocabulary: {vocab.size} tokens ({trained} trained BPE, rest synthetic); built in {time.perf_counter() - t:.1f}s")
    t = time.perf_counter()
    st.compile_regex("a", vocab)  # builds the per-vocabulary token trie (once per vocabulary)
    print(f"per-vocabulary preprocessing (token trie, cached): {1e3 * (time.perf_counter() - t):.0f} ms")
    rows, grammars = bench_compile(vocab)
    print(f"\n{'schema':16} {'ours ms':>9} {'llg ms':>8} {'S':>5} {'C':>5} {'U':>4} {'device MiB':>10}  buckets (S,C) U")
    for name, ours, theirs, s, c, u, nb, sc, ub in rows:
        print(f"{name:16} {ours * 1e3:9.1f} {theirs * 1e3:8.2f} {s:5d} {c:5d} {u:4d} {nb / 2**20:10.2f}  {sc} {ub}")
    print(f"compile p50/p90: ours {_percentiles([r[1] for r in rows])}; llguidance {_percentiles([r[2] for r in rows])}")
    if args.schemas:
        found, failures = bench_directory(vocab, args.schemas)
        total = len(found) + sum(failures.values())
        both = [r for r in found if np.isfinite(r[2])]
        print(f"\n{args.schemas}: {len(found)}/{total} schemas compiled; rejected: {sorted(failures.items(), key=lambda x: -x[1])[:8]}")
        print(f"  compiled: ours p50/p90 {_percentiles([r[1] for r in found])}; on the {len(both)} llguidance also compiles: "
              f"ours {_percentiles([r[1] for r in both])}, llguidance {_percentiles([r[2] for r in both])}")  # fmt: skip
        mib = np.array([r[4] for r in found]) / 2**20
        print(f"  device MiB per grammar p50/p90/max {np.percentile(mib, 50):.1f}/{np.percentile(mib, 90):.1f}/{mib.max():.1f}")
        for r in sorted(found, key=lambda r: -r[1])[:5]:
            print(f"  slowest: {r[0]} {r[1] * 1e3:.0f} ms, S={r[3]}, {r[4] / 2**20:.1f} MiB")
    g = grammars["order"]
    res = bench_step(vocab, g, args.batch, args.steps)
    print(f"\nper-step time, jitted lax.scan, B={args.batch}, V={vocab.size}, CPU ({jax.devices()[0].platform}):")
    for sel in ("process", "greedy", "categorical"):
        a, b = res[(sel, False)], res[(sel, True)]
        label = "temperature stage only" if sel == "process" else f"temperature + {sel}"
        print(f"  {label:28} unconstrained {a * 1e3:8.2f} ms  constrained {b * 1e3:8.2f} ms  overhead {100 * (b / a - 1):+6.1f}%")
    one = st.nbytes(st.stack([g]))
    print(f"device memory: one grammar {one / 2**20:.2f} MiB; a batch of {args.batch} rows on it "
          f"{one / 2**20:.2f} MiB of tables + {4 * args.batch} B of row states (was {args.batch} table copies)")


if __name__ == "__main__":
    main()
