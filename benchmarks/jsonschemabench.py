"""JSONSchemaBench, as the field measures engines: coverage, compile time, memory, correctness.

Run: ``python -m benchmarks.jsonschemabench [--limit N] [--samples K] [--out FILE]`` (XGrammar is
measured when importable: ``/work/venv-xgr/bin/python -m benchmarks.jsonschemabench``).

Data: the pinned sample ``benchmarks/data/jsonschemabench_sample.jsonl.gz`` (253 schemas, 23 from
each of 11 splits of guidance-ai/jsonschemabench's MaskBench data, with their test instances;
provenance in its first line; nothing is downloaded). Vocabulary: a byte-level BPE of
``--vocab`` tokens trained here on ``pydoc_data.topics`` (the Python docs; the corpus gives at most ~9.2k
tokens: ``--synthetic`` adds synthetic two-token pieces up to ``--vocab`` for the jaxsample engines,
as ``benchmarks/structured.py`` does, to measure how compile time and tables grow with the vocabulary).

Per engine (jaxsample with its defaults; ``jaxsample-spec``: with ``SPEC_OPTIONS``, the JSON Schema
meaning of an absent ``additionalProperties``/``type``; ``jaxsample-disk`` (asked for by name): the
defaults with the on-disk grammar cache warm, as a restarted process finds it; llguidance and
XGrammar when installed), in one process, schema by schema:

* **compiles**: the schema is accepted (ours: no ``GrammarError``, within ``--timeout`` seconds);
* **compile ms** p50/p90: best of up to ``--repeats`` runs (stopping after 2 s), including what
  the first mask needs: ours = schema -> token tables -> device tables (``stack`` +
  ``block_until_ready``); llguidance = ``LLMatcher`` + first mask (it compiles lazily); XGrammar =
  ``compile_json_schema`` (cache off). Percentiles over the schemas each engine compiles, and over
  those all engines compile;
* **device MiB**: our bucketed tables for the grammar; XGrammar's ``memory_size_bytes``;
* **valid accepted**: test instances marked valid (``json.dumps`` text, tokenized by the BPE) that
  the engine accepts to the end; **invalid accepted**: instances marked invalid that it accepts;
* **outputs valid**: ``--samples`` random generations per schema (at most ``--max-tokens``
  tokens; a random allowed token, EOS with probability 1/2 when allowed, a single-byte token with
  probability 1/2) validated by ``jsonschema`` for the schema's draft with format checking plus
  the RFC rules it does not check (``tests/_format_rules.py``), exact ``multipleOf``, no duplicate
  keys. Unfinished generations are counted apart.

``--explain`` prints, for every valid instance an engine refuses, the text around the first token
it refuses (how the causes in docs/structured.md were counted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.jsonschemabench_sample import load  # noqa: E402
from jaxsample import structured as st  # noqa: E402
from tests._format_rules import loads, validator  # noqa: E402


#: Options of the ``jaxsample-spec`` engine: absent ``additionalProperties`` open and absent ``type``
#: every type (the JSON Schema meaning; the defaults close objects and imply types from keywords).
SPEC_OPTIONS = {"open_objects": True, "untyped": "any"}


def train_tokenizer(vocab_size: int):
    """Byte-level BPE trained on the Python docs; id 0 is ``<|endoftext|>`` (EOS)."""
    from pydoc_data.topics import topics
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)  # fmt: skip
    tok.train_from_iterator([topics[k] for k in sorted(topics)], trainer)
    return tok


class _Timeout(Exception):
    pass


#: Whether the last alarm fired: Python ignores an exception raised while a garbage-collection
#: callback runs (JAX registers one), so a compile can outlive its alarm and still return.
_fired = [False]


def _alarm(*_):
    _fired[0] = True
    raise _Timeout()


def _best(fn, repeats: int, budget: float = 2.0):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        if sum(times) > budget:
            break
    return min(times), out


# ----------------------------------------------------------------------------------- engines
class Ours:
    def __init__(self, vocab: st.Vocabulary, options, name="jaxsample"):
        import jax

        self.jax, self.name = jax, name
        self.vocab = vocab
        self.token_bytes = vocab.token_bytes
        self.options = options
        self.compile({"type": "string"})  # warm-up: the per-vocabulary trie, JAX's device transfer

    def compile(self, schema):
        st.grammar_cache.clear()  # every repeat compiles (the content cache would return the first result)
        g = st.compile_json_schema(schema, self.vocab, **self.options)
        tables = st.stack([g])
        self.jax.block_until_ready(self.jax.device_put(tables))
        return g, st.nbytes(tables)

    def matcher(self, compiled):
        return _OurMatcher(compiled[0])


class OursFromDisk(Ours):
    """Ours with the on-disk grammar cache warm (``grammar_cache.set_directory``): each schema is
    compiled once untimed (:meth:`prime`), then timed as a new process finds it: memory cache
    empty, grammar read from disk, device tables built and uploaded."""

    def __init__(self, vocab: st.Vocabulary, options, name):
        import tempfile

        self._files = tempfile.TemporaryDirectory(prefix="jsonschemabench-grammars-")  # removed with the engine
        self.directory = self._files.name
        super().__init__(vocab, options, name)

    @contextlib.contextmanager
    def _on_disk(self):
        st.grammar_cache.set_directory(self.directory)
        try:
            yield
        finally:
            st.grammar_cache.set_directory(None)

    def prime(self, schema):
        with self._on_disk():
            st.grammar_cache.clear()
            st.compile_json_schema(schema, self.vocab, **self.options)

    def compile(self, schema):
        with self._on_disk():
            return super().compile(schema)


class _OurMatcher:
    """The host matcher over the compiled tables (regular and recursive grammars alike)."""

    def __init__(self, g):
        self.m = st.Matcher(g)

    def allowed(self):
        return self.m.allowed()

    def consume(self, t):
        return self.m.accept_token(t)

    def accepts_all(self, ids):
        return self.m.accept_tokens(ids) == len(ids) and self.m.is_accepting()


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, vocab_size):
        import llguidance as llg

        self.llg = llg
        self.lt = llg.LLTokenizer(tok.to_str(), n_vocab=vocab_size, eos_token=0, slices=[])
        self.v = vocab_size

    def compile(self, schema):
        text = self.llg.LLMatcher.grammar_from_json_schema(schema)
        m = self.llg.LLMatcher(self.lt, text, log_level=0)
        m.compute_bitmask()
        if m.is_error():
            raise ValueError(m.get_error())
        return text, None

    def matcher(self, compiled):
        return _LLGMatcher(self.llg.LLMatcher(self.lt, compiled[0], log_level=0), self.v)


class _LLGMatcher:
    def __init__(self, m, v):
        self.m, self.v = m, v

    def allowed(self):
        return np.unpackbits(np.frombuffer(self.m.compute_bitmask(), np.uint8), bitorder="little")[: self.v].astype(bool)

    def consume(self, t):
        return bool(self.m.consume_token(t)) and not self.m.is_error()

    def accepts_all(self, ids):
        return self.m.validate_tokens(ids) == len(ids) and self.m.consume_tokens(ids) and self.m.is_accepting()


class XGrammar:
    name = "XGrammar"

    def __init__(self, tok, vocab_size):
        import xgrammar as xgr
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgr
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=[0])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.v = vocab_size

    def compile(self, schema):
        g = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True)
        return g, g.memory_size_bytes

    def matcher(self, compiled):
        return _XGRMatcher(self.xgr, compiled[0], self.v)


class _XGRMatcher:
    def __init__(self, xgr, g, v):
        self.xgr, self.m, self.v = xgr, xgr.GrammarMatcher(g), v
        self.mask = xgr.allocate_token_bitmask(1, v)

    def allowed(self):
        self.m.fill_next_token_bitmask(self.mask)
        words = self.mask.numpy().view(np.uint8).reshape(-1)
        return np.unpackbits(words, bitorder="little")[: self.v].astype(bool)

    def consume(self, t):
        return bool(self.m.accept_token(t))

    def accepts_all(self, ids):
        return all(self.m.accept_token(t) for t in ids) and self.m.accept_token(0)


# ----------------------------------------------------------------------------------- measurement
def generate(matcher, single_byte: np.ndarray, rng, max_tokens: int, decode) -> bytes | None:
    """A random constrained generation (see the module docstring); ``None`` if unfinished."""
    out = []
    for _ in range(max_tokens):
        allowed = matcher.allowed()
        if allowed[0] and rng.random() < 0.5:
            return decode(out)
        ids = np.flatnonzero(allowed)
        if ids.size == 0:
            return None
        short = ids[single_byte[ids]]
        pick = rng.choice(short if short.size and rng.random() < 0.5 else ids)
        if pick == 0:
            return decode(out)
        if not matcher.consume(int(pick)):
            return None
        out.append(int(pick))
    return None


def where_refused(matcher, tok, text: str) -> str:
    """The text around the first token a matcher refuses (``...before|refused...``), or ``at the end``."""
    enc = tok.encode(text)
    for i, t in enumerate(enc.ids):
        if not matcher.consume(t):
            at = enc.offsets[i][0]
            return repr(text[max(0, at - 60) : at]) + " | " + repr(text[at : at + 30])
    return "at the end (incomplete)"


def output_valid(text: str, schema) -> bool:
    try:
        validator(schema).validate(loads(text))
    except Exception:
        return False
    return True


def run(engines, records, tok, args) -> dict:
    tok_bytes = st.Vocabulary.from_tokenizer(tok, eos_ids=[0]).token_bytes

    def decoder(vocab_bytes):  # (the engine's token bytes: ours may add synthetic tokens, --synthetic)
        single = np.array([b is not None and len(b) == 1 for b in vocab_bytes])
        return single, lambda ids: b"".join(vocab_bytes[i] for i in ids).decode("utf-8", "replace")

    decoders = {e.name: decoder(getattr(e, "token_bytes", tok_bytes)) for e in engines}
    signal.signal(signal.SIGALRM, _alarm)
    stats = {e.name: {"times": {}, "bytes": [], "errors": Counter(), "failed": {}, "valid": [0, 0],
                      "invalid_acc": [0, 0], "outputs": [0, 0, 0]} for e in engines}  # fmt: skip
    for j, rec in enumerate(records):
        k, schema = rec.get("index", j), rec["schema"]  # (the sample's index, also with --only)
        for e in engines:
            s = stats[e.name]
            _fired[0] = False
            signal.alarm(args.timeout)
            try:
                if hasattr(e, "prime"):
                    e.prime(schema)
                secs, compiled = _best(lambda: e.compile(schema), args.repeats)
                if _fired[0]:  # the alarm's exception was swallowed (see _fired)
                    raise _Timeout()
            except (_Timeout, Exception) as err:
                signal.alarm(0)
                kind = "timeout" if isinstance(err, _Timeout) else getattr(err, "keyword", None) or type(err).__name__
                if isinstance(err, st.GrammarError) and "too large" in str(err):
                    kind = "state budget"
                s["errors"][kind] += 1
                s["failed"][k] = f"{kind}: {err}"[:300]
                continue
            signal.alarm(0)
            s["times"][k] = secs * 1000
            if compiled[1] is not None:
                s["bytes"].append(compiled[1])
            for t in rec["tests"]:
                text = json.dumps(t["data"], ensure_ascii=False)
                ok = e.matcher(compiled).accepts_all(tok.encode(text).ids)
                if args.explain and t["valid"] and not ok:
                    print(f"refused by {e.name}: #{k} {rec['split']}/{rec['name']}: {where_refused(e.matcher(compiled), tok, text)}")
                (s["valid"] if t["valid"] else s["invalid_acc"])[0] += bool(ok)
                (s["valid"] if t["valid"] else s["invalid_acc"])[1] += 1
            rng = np.random.default_rng(k)
            single_byte, decode = decoders[e.name]
            for _ in range(args.samples):
                out = generate(e.matcher(compiled), single_byte, rng, args.max_tokens, decode)
                if out is None:
                    s["outputs"][2] += 1
                else:
                    s["outputs"][0] += output_valid(out, schema)
                    s["outputs"][1] += 1
        if args.verbose:
            print(k, rec["split"], rec["name"], {n: round(stats[n]["times"].get(k, -1), 1) for n in stats}, flush=True)
    return stats


def table(stats, n_schemas: int) -> str:
    common = set.intersection(*(set(s["times"]) for s in stats.values()))
    rows = ["| engine | compiles | compile p50 / p90 ms (own) | p50 / p90 ms (common) | device MiB p50 / p90 / max "
            "| valid accepted | invalid accepted | outputs valid (unfinished) |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, s in stats.items():
        own = list(s["times"].values())
        com = [s["times"][k] for k in common]

        def pct(xs):
            return " / ".join(f"{v:.3g}" for v in np.percentile(xs, [50, 90])) if xs else "-"

        mib = " / ".join(f"{v / 2**20:.2g}" for v in np.percentile(s["bytes"], [50, 90, 100])) if s["bytes"] else "-"
        v, i, o = s["valid"], s["invalid_acc"], s["outputs"]
        rows.append(f"| {name} | {len(own)}/{n_schemas} ({100 * len(own) / n_schemas:.0f}%) | {pct(own)} | {pct(com)} "
                    f"| {mib} | {v[0]}/{v[1]} ({100 * v[0] / max(v[1], 1):.0f}%) | {i[0]}/{i[1]} "
                    f"| {o[0]}/{o[1]} ({100 * o[0] / max(o[1], 1):.0f}%; {o[2]}) |")  # fmt: skip
    rows.append(f"\n(common: the {len(common)} schemas every engine compiles)")
    for name, s in stats.items():
        if s["errors"]:
            rows.append(f"{name} failures: " + ", ".join(f"{k} {v}" for k, v in s["errors"].most_common()))
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--synthetic", action="store_true",
                   help="jaxsample engines only: when the trained BPE stops short of --vocab (~9.2k tokens on "
                        "this corpus), add synthetic two-token pieces up to --vocab (benchmarks/structured.py)")
    p.add_argument("--limit", type=int, default=None, help="first N schemas of the sample")
    p.add_argument("--only", default=None, help="comma-separated indices of the schemas to run (as --explain prints them)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=300)
    p.add_argument("--timeout", type=int, default=120, help="seconds per compile before it counts as a failure")
    p.add_argument("--engines", default="jaxsample,jaxsample-spec,llguidance,xgrammar",
                   help="any of jaxsample, jaxsample-spec, jaxsample-disk (warm on-disk cache), llguidance, xgrammar")
    p.add_argument("--options", default="{}", help="JSON dict of compile_json_schema options for jaxsample")
    p.add_argument("--out", default=None, help="write the per-engine statistics as JSON")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--explain", action="store_true", help="print where each refused valid instance stops")
    args = p.parse_args(argv)
    provenance, records = load()
    records = records[: args.limit]
    if args.only:
        records = [{**records[int(i)], "index": int(i)} for i in args.only.split(",")]
    tok = train_tokenizer(args.vocab)
    v = tok.get_vocab_size()
    wanted = args.engines.split(",")
    vocab = st.Vocabulary.from_tokenizer(tok, eos_ids=[0], size=v)
    described = f"byte-level BPE V={v}"
    if args.synthetic and args.vocab > v:
        from benchmarks.structured import extend_vocab

        others = sorted(set(wanted) & {"llguidance", "xgrammar"})
        if others:
            p.error(f"--synthetic measures the jaxsample engines only (their vocabulary is ours), not {others}")
        vocab = extend_vocab(vocab, args.vocab)
        described = f"byte-level BPE of {v} tokens + {args.vocab - v} synthetic, V={args.vocab}"
    elif args.vocab > v:
        print(f"(the trained BPE has {v} tokens, fewer than --vocab {args.vocab}; --synthetic adds the rest)")
    engines = []
    options = json.loads(args.options)
    if "jaxsample" in wanted:
        engines.append(Ours(vocab, options, f"jaxsample {options}" if options else "jaxsample"))
    if "jaxsample-spec" in wanted:  # the JSON Schema meaning of absent additionalProperties and type
        spec = {**options, **SPEC_OPTIONS}
        engines.append(Ours(vocab, spec, f"jaxsample {spec}"))
    if "jaxsample-disk" in wanted:  # defaults, grammars read from a warm on-disk cache
        engines.append(OursFromDisk(vocab, options, "jaxsample (from disk)"))
    for key, cls in (("llguidance", LLGuidance), ("xgrammar", XGrammar)):
        if key in wanted:
            try:
                engines.append(cls(tok, v))
            except ImportError:
                print(f"({cls.name} not installed: skipped)")
    stats = run(engines, records, tok, args)
    print(f"JSONSchemaBench sample ({len(records)} schemas, {provenance['repo']}@{provenance['commit'][:10]}), "
          f"{described}")  # fmt: skip
    print(table(stats, len(records)))
    if args.out:
        Path(args.out).write_text(json.dumps({n: {**s, "errors": dict(s["errors"])} for n, s in stats.items()}, indent=1))
    return stats


if __name__ == "__main__":
    main()
