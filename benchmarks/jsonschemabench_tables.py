"""Token tables of real schemas against the byte-level automata they were built from.

Run: ``python -m benchmarks.jsonschemabench_tables [--limit N | --only I,J] [--options JSON] [--spec] [--vocab V --synthetic]``.

For each schema of the pinned JSONSchemaBench sample (see :mod:`benchmarks.jsonschemabench`) it
builds the byte automaton and the token grammar from the same expression, with the same retries as
``compile_json_schema`` (:func:`jaxsample.structured.compiler.first_fit`), then walks the host
:class:`~jaxsample.structured.Matcher` along the schema's valid test instances (while they are
allowed) and along random allowed tokens, and at every configuration checks **every token** of the
vocabulary: the tables allow it exactly when its bytes run on the byte-level automaton (for a
pushdown automaton: within the stack limit, with a completion left, and to the same state and stack
as the matcher's step); after each accepted token the matcher accepts exactly when the automaton
does. A mismatch is a token the tables wrongly refuse (a silent over-constraint that no sampled
output reveals) or wrongly allow. With ``--device`` a row of the device tables follows the same
tokens and its mask must equal the host matcher's at every configuration.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.jsonschemabench import SPEC_OPTIONS, train_tokenizer  # noqa: E402
from benchmarks.jsonschemabench_sample import load  # noqa: E402
from benchmarks.structured import extend_vocab  # noqa: E402
from jaxsample import structured as st  # noqa: E402
from jaxsample.structured import automaton, compiler, json_schema, pushdown  # noqa: E402


def build(schema, vocab: st.Vocabulary, options: dict):
    """``(byte automaton, token grammar built from it)``, retried as ``compile_json_schema`` retries."""

    def attempt(o):
        auto = automaton.compile_expr(json_schema.schema_expr(schema, **o))
        return auto, compiler.token_grammar(auto, vocab)

    return compiler.first_fit(schema, options, attempt)


_allowed, _advance = jax.jit(st.allowed), jax.jit(st.advance)


def check(auto, grammar, vocab: st.Vocabulary, scripts, *, steps: int = 25, seed: int = 0, device: bool = False):
    """``(configurations, mismatches, examples)`` of one grammar (see the module docstring): each of
    ``scripts`` (token ids, followed while allowed) and then random allowed tokens, ``steps`` tokens
    per walk, plus one random walk. ``device``: a row of the grammar's device tables
    (:func:`~jaxsample.structured.stack`) follows the same tokens, and its mask must equal the host's."""
    recursive = isinstance(auto, pushdown.Pushdown)
    m = st.Matcher(grammar)
    tables = st.stack([grammar]) if device else None
    row = np.zeros(1, np.int32)
    rng = np.random.default_rng(seed)
    eos = set(grammar.eos_ids)
    configs, bad, examples = 0, 0, []

    def miss(what):
        nonlocal bad
        bad += 1
        if len(examples) < 5:
            examples.append(what)

    for script in [*scripts, []]:
        m.reset()
        byte_state = auto.start
        state = st.initial_state(tables, row) if device else None
        for step in range(steps):
            allowed = m.allowed()
            configs += 1
            if device and not np.array_equal(np.asarray(_allowed(tables, row, state))[0], allowed):
                miss(("device", step))
            if recursive:
                accepting = bool(auto.accept[m.state]) and all(auto.accept[r] for r in m.stack)
            else:
                accepting = bool(auto.accept[byte_state])
            for t, data in enumerate(vocab.token_bytes):
                if data is None:
                    ok = t in eos and accepting
                elif recursive:
                    want = auto.run(data, m.state, m.stack, m.limit, m.keys)
                    if want is not None and allowed[t]:
                        m.accept_token(t)
                        if (m.state, m.stack, m.keys) != want:
                            miss(("state", data, step))
                        m.rollback(1)
                    ok = want is not None
                else:
                    ok = auto.run(data, byte_state) != 0
                if bool(allowed[t]) != ok:
                    miss(("allowed" if allowed[t] else "refused", data, step))
            if m.is_accepting() != accepting:
                miss(("accepting", step))
            text = [t for t in np.flatnonzero(allowed) if t not in eos]
            if step < len(script) and allowed[script[step]]:
                t = script[step]
            elif text:
                script = []
                t = int(rng.choice(text))
            else:
                break
            if not recursive:
                byte_state = auto.run(vocab.token_bytes[t], byte_state)
            if device:
                state = _advance(tables, row, state, np.array([t], np.int32))
            m.accept_token(t)
    return configs, bad, examples


def _alarm(*_):
    raise TimeoutError


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--limit", type=int, default=None, help="first N schemas of the sample")
    p.add_argument("--only", default=None, help="comma-separated record indices of the sample (instead of --limit)")
    p.add_argument("--options", default="{}", help="JSON dict of compile_json_schema options")
    p.add_argument("--spec", action="store_true", help="with the jaxsample-spec options (open objects, untyped any)")
    p.add_argument("--steps", type=int, default=25, help="tokens per walk")
    p.add_argument("--timeout", type=int, default=20, help="seconds per compile before the schema is skipped")
    p.add_argument("--device", action="store_true", help="also step the device tables and compare their masks")
    p.add_argument("--synthetic", action="store_true",
                   help="extend the trained BPE (it stops near 9k tokens) with synthetic two-token pieces up to "
                        "--vocab, as benchmarks.jsonschemabench --synthetic (large-vocabulary tables)")  # fmt: skip
    args = p.parse_args(argv)
    options = {**json.loads(args.options), **(SPEC_OPTIONS if args.spec else {})}
    tok = train_tokenizer(args.vocab)
    vocab = st.Vocabulary.from_tokenizer(tok, eos_ids=[0], size=tok.get_vocab_size())
    if args.synthetic and args.vocab > vocab.size:
        vocab = extend_vocab(vocab, args.vocab)
    _, records = load()
    signal.signal(signal.SIGALRM, _alarm)
    totals = {"schemas": 0, "skipped": 0, "configurations": 0, "mismatches": 0}
    chosen = range(len(records))[: args.limit] if args.only is None else [int(x) for x in args.only.split(",")]
    for k in chosen:
        rec = records[k]
        gc.disable()  # (an alarm raised inside a garbage-collection callback would be ignored)
        try:
            signal.alarm(args.timeout)
            try:
                auto, grammar = build(rec["schema"], vocab, options)
            finally:
                signal.alarm(0)  # (an alarm that fires just before this still lands in the except below)
        except (TimeoutError, st.GrammarError, RecursionError):
            totals["skipped"] += 1
            continue
        finally:
            gc.enable()
        scripts = [tok.encode(json.dumps(t["data"], ensure_ascii=False)).ids for t in rec["tests"] if t["valid"]][:2]
        t0 = time.perf_counter()
        configs, bad, examples = check(auto, grammar, vocab, scripts, steps=args.steps, seed=k, device=args.device)
        totals["schemas"] += 1
        totals["configurations"] += configs
        totals["mismatches"] += bad
        kind = "pushdown" if isinstance(auto, pushdown.Pushdown) else "regular"
        print(f"#{k} {rec['split']}/{rec['name']} ({kind}): {configs} configurations, {bad} mismatches "
              f"({time.perf_counter() - t0:.1f} s){' ' + repr(examples) if bad else ''}", flush=True)  # fmt: skip
    print(f"{totals['mismatches']} mismatches over {totals['configurations']} configurations x {vocab.size} tokens "
          f"of {totals['schemas']} schemas ({totals['skipped']} not compiled), options {options}")  # fmt: skip
    return totals


if __name__ == "__main__":
    main()
