"""llama.cpp: ``common_params_sampling`` fields and CLI flags -> the chain ``common_sampler_init`` builds.

Chain: ``logit_bias`` (if any) -> the ``samplers`` sequence (default ``penalties, dry, top_n_sigma,
top_k, typ_p, top_p, min_p, xtc, temperature``) -> ``dist`` (``adaptive_p`` instead when the
sequence names it: like llama.cpp, it always goes last); or ``logit_bias -> temp -> mirostat``
(v1/v2) when ``mirostat != 0``, where the sequence is ignored as in llama.cpp. Sequence letters
(``--sampling-seq``): ``e`` penalties, ``d`` dry, ``s`` top_n_sigma, ``k`` top_k, ``y`` typ_p,
``p`` top_p, ``m`` min_p, ``x`` xtc, ``t`` temperature, ``i`` infill, ``a`` adaptive_p.

A grammar (``--grammar``, ``--grammar-file``, ``--json-schema``) is compiled with
:mod:`jaxsample.structured` and masks the logits before the chain; with ``grammar_lazy`` and
``grammar_triggers`` (``common_params_sampling`` fields, set by llama-server requests and chat
templates for tool calls; the CLI has no flags for them) it starts masking only after a trigger
(:mod:`jaxsample.structured.triggers`). llama.cpp instead samples with
the chain first and re-samples with the grammar applied only when the token violates it, which can
give a slightly different distribution over grammar-valid tokens; the output is grammar-valid in
both. Defaults are upstream's ``common_params_sampling`` (``common/common.h``, checked at
ggml-org/llama.cpp commit 001d906; ``tests/test_llama_cpp_fidelity.py`` pins them).
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Sequence

from jaxsample import stages
from jaxsample._candidates import DEFAULT_CANDIDATES
from jaxsample.chain import chain
from jaxsample.presets._preset import Preset, check_bias, check_fields, check_values

#: llama.cpp's default ``samplers`` sequence (CLI ``--sampling-seq edskypmxt``).
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")

_ALIASES = {
    "penalties": "penalties", "e": "penalties",
    "dry": "dry", "d": "dry",
    "top_n_sigma": "top_n_sigma", "top-n-sigma": "top_n_sigma", "s": "top_n_sigma",
    "top_k": "top_k", "top-k": "top_k", "k": "top_k",
    "typ_p": "typ_p", "typical_p": "typ_p", "typical-p": "typ_p", "typical": "typ_p", "typ": "typ_p", "y": "typ_p",
    "top_p": "top_p", "top-p": "top_p", "nucleus": "top_p", "p": "top_p",
    "min_p": "min_p", "min-p": "min_p", "m": "min_p",
    "xtc": "xtc", "x": "xtc",
    "temperature": "temperature", "temp": "temperature", "t": "temperature",
    "infill": "infill", "i": "infill",
    "adaptive_p": "adaptive_p", "adaptive-p": "adaptive_p", "a": "adaptive_p",
    "typ-p": "typ_p",
}
#: llama.cpp's default DRY sequence breakers (strings: turned into token ids with a tokenizer).
DEFAULT_DRY_SEQUENCE_BREAKERS = ("\n", ":", "\"", "*")

# common_params_sampling field -> jaxsample parameter name
_FIELDS = {
    "seed": "seed",
    "min_keep": "min_keep",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "xtc_probability": "xtc_probability",
    "xtc_threshold": "xtc_threshold",
    "typ_p": "typical_p",
    "temp": "temperature",
    "dynatemp_range": "dynatemp_range",
    "dynatemp_exponent": "dynatemp_exponent",
    "penalty_repeat": "repetition_penalty",
    "penalty_freq": "frequency_penalty",
    "penalty_present": "presence_penalty",
    "dry_multiplier": "dry_multiplier",
    "dry_base": "dry_base",
    "dry_allowed_length": "dry_allowed_length",
    "top_n_sigma": "top_n_sigma",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "adaptive_target": "adaptive_p_target",
    "adaptive_decay": "adaptive_p_decay",
}


def _sequence(samplers) -> tuple[str, ...]:
    if isinstance(samplers, str):
        parts = samplers.split(";") if (";" in samplers or samplers in _ALIASES and len(samplers) > 1) else list(samplers)
    else:
        parts = list(samplers)
    out = []
    for part in parts:
        name = _ALIASES.get(str(part).strip().lower())
        if name is None:
            raise ValueError(f"samplers: unknown sampler {part!r} (known: {sorted(set(_ALIASES.values()))})")
        out.append(name)
    return tuple(out)


def _capacity(n: int) -> int:
    """Static list capacity: the next power of two >= n (at least 8), so list sizes rarely recompile."""
    return max(8, 1 << max(0, n - 1).bit_length())


def llama_cpp(
    *,
    seed: int = 0,
    min_keep: int = 0,
    top_k: int = 40,
    top_p: float = 0.95,
    min_p: float = 0.05,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.10,
    typ_p: float = 1.0,
    temp: float = 0.80,
    dynatemp_range: float = 0.0,
    dynatemp_exponent: float = 1.0,
    penalty_last_n: int = 64,
    penalty_repeat: float = 1.0,
    penalty_freq: float = 0.0,
    penalty_present: float = 0.0,
    dry_multiplier: float = 0.0,
    dry_base: float = 1.75,
    dry_allowed_length: int = 2,
    dry_penalty_last_n: int = 64,
    dry_sequence_breakers: Sequence[Sequence[int] | str] | None = None,
    adaptive_target: float = -1.0,
    adaptive_decay: float = 0.90,
    mirostat: int = 0,
    mirostat_tau: float = 5.0,
    mirostat_eta: float = 0.10,
    top_n_sigma: float = -1.0,
    samplers: Sequence[str] | str = DEFAULT_SAMPLERS,
    logit_bias: dict[int, float] | None = None,
    ignore_eos: bool = False,
    eos_ids: Sequence[int] = (),
    n_vocab: int | None = None,
    grammar: str | None = None,
    json_schema: Any = None,
    grammar_lazy: bool = False,
    grammar_triggers: Sequence[Any] = (),
    tokenizer: Any = None,
    vocabulary: Any = None,
    infill_table: Any = None,
    candidates: int = DEFAULT_CANDIDATES,
) -> Preset:
    """The chain llama.cpp's ``common_sampler_init`` builds, from ``common_params_sampling`` fields.

    Field names and defaults are llama.cpp's (``temp``, ``typ_p``, ``penalty_repeat`` ...).
    ``penalty_last_n`` and ``dry_penalty_last_n`` fix window sizes (``-1`` = the context: pass
    ``history_size`` to ``Sampler.init``); ``logit_bias`` maps token ids to biases (``-inf`` bans);
    ``ignore_eos`` bans ``eos_ids``; ``n_vocab`` is mirostat v1's vocabulary size (default: V).
    ``seed`` is explicit (llama.cpp's "random" default seed has no reproducible equivalent).

    What needs the vocabulary takes ``tokenizer`` (a ``tokenizers.Tokenizer`` or a fast
    ``transformers`` tokenizer):

    * ``dry_sequence_breakers``: strings (llama.cpp's; default ``DEFAULT_DRY_SEQUENCE_BREAKERS``
      when a tokenizer is given, none without one) or token-id sequences
      (:func:`jaxsample.dry_sequence_breakers` does the conversion);
    * the ``infill`` sampler (``i``): its table from the tokenizer and ``eos_ids`` (the
      end-of-generation ids), or ``infill_table`` (:func:`jaxsample.infill.infill_table`);
    * ``grammar`` (GBNF) / ``json_schema`` (a schema dict or JSON string): compiled with
      :mod:`jaxsample.structured` over ``vocabulary`` (a :class:`jaxsample.structured.Vocabulary`)
      or the tokenizer's; the grammar stage masks the logits first. With ``grammar_lazy``, only
      from the first of ``grammar_triggers`` (words, token ids, or llama.cpp trigger dicts
      ``{"type": 0-3 or "token"/"word"/"pattern"/"pattern_full", "value": ..., "token": ...}``) on,
      as llama.cpp's lazy grammars; without ``grammar_lazy`` the triggers are ignored, as in llama.cpp.

    >>> p = llama_cpp()
    >>> [s.name for s in p.sampler.stages], p.sampler.selector.name
    (['penalties', 'dry', 'top_n_sigma', 'top_k', 'typical', 'top_p', 'min_p', 'xtc', 'temperature'], 'dist')
    """
    check_fields(llama_cpp, locals())
    if logit_bias:
        check_bias(logit_bias, "logit_bias")
    if mirostat not in (0, 1, 2):
        raise ValueError(f"mirostat must be 0, 1 or 2, got {mirostat}")
    if adaptive_target > 1.0:
        raise ValueError(f"adaptive_target must be <= 1 (negative: disabled), got {adaptive_target}")
    if not 0.0 <= adaptive_decay <= 0.99:
        raise ValueError(f"adaptive_decay must be in [0, 0.99], got {adaptive_decay}")
    if grammar is not None and json_schema is not None:
        raise ValueError("grammar and json_schema are exclusive (llama.cpp: one grammar per request)")
    values: dict[str, Any] = {}
    local = dict(locals())
    for field, name in _FIELDS.items():
        values[name] = local[field]
    parts = []
    if grammar_lazy and grammar is None and json_schema is None:
        raise ValueError("grammar_lazy needs a grammar or json_schema")
    if grammar is not None or json_schema is not None:
        grammar_values = _grammar_values(grammar, json_schema, vocabulary, tokenizer, eos_ids,
                                         list(grammar_triggers) if grammar_lazy else None)
        if grammar_lazy:
            rank = grammar_values["grammar_trigger_rank"]
            parts.append(stages.lazy_grammar(max_triggers=len(rank),
                                             max_trigger_bytes=grammar_values.pop("max_trigger_bytes")))
        else:
            parts.append(stages.grammar())
        values.update(grammar_values)
    if logit_bias:
        ids = [int(i) for i in logit_bias]
        parts.append(stages.logit_bias(capacity=_capacity(len(ids))))
        values["logit_bias_ids"] = ids
        values["logit_bias_values"] = [float(logit_bias[i]) for i in logit_bias]
    if ignore_eos:
        if not eos_ids:
            raise ValueError("ignore_eos needs eos_ids (the model's end-of-generation token ids)")
        parts.append(stages.ignore_eos(tuple(int(i) for i in eos_ids), True))
    if mirostat:
        parts.append(stages.temperature())
        select = (
            stages.mirostat(n_vocab=n_vocab, candidates=candidates)
            if mirostat == 1
            else stages.mirostat_v2(candidates=candidates)
        )
    else:
        build = {
            "penalties": lambda: stages.penalties(penalty_last_n),
            "dry": lambda: stages.dry(
                last_n=dry_penalty_last_n,
                sequence_breakers=_breakers(dry_sequence_breakers, tokenizer),
            ),
            "top_n_sigma": lambda: stages.top_n_sigma(),
            "top_k": lambda: stages.top_k(exact=True, candidates=candidates),
            "typ_p": lambda: stages.typical(candidates=candidates),
            "top_p": lambda: stages.top_p(candidates=candidates),
            "min_p": lambda: stages.min_p(),
            "xtc": lambda: stages.xtc(),
            "temperature": lambda: stages.dynamic_temperature(),
            "infill": lambda: stages.infill(_infill_table(infill_table, tokenizer, eos_ids)),
        }
        sequence = _sequence(samplers)
        parts += [build[name]() for name in sequence if name != "adaptive_p"]
        select = (stages.adaptive_p(candidates=candidates) if "adaptive_p" in sequence
                  else stages.categorical(candidates=candidates))
        if "penalties" in sequence and penalty_last_n != 0:
            values["penalty_last_n"] = penalty_last_n
        if "dry" in sequence and dry_penalty_last_n != 0:
            values["dry_penalty_last_n"] = dry_penalty_last_n
    values = {k: v for k, v in values.items()
              if k in _used(parts, select) or k.startswith(("logit_bias", "grammar"))}
    names = {**{name: field for field, name in _FIELDS.items()}, "penalty_last_n": "penalty_last_n",
             "dry_penalty_last_n": "dry_penalty_last_n", "logit_bias_values": "logit_bias"}
    return check_values(Preset(chain(*parts, select=select), values), names)


def _breakers(breakers, tokenizer) -> tuple[tuple[int, ...], ...]:
    """DRY breakers as token-id tuples: strings through the tokenizer, ids as given."""
    if breakers is None:
        breakers = DEFAULT_DRY_SEQUENCE_BREAKERS if tokenizer is not None else ()
    if isinstance(breakers, str):
        raise ValueError("dry_sequence_breakers must be a list of strings or of token-id lists, not one string")
    strings = [b for b in breakers if isinstance(b, str)]
    if strings and len(strings) != len(breakers):
        raise ValueError("dry_sequence_breakers: give all strings or all token-id lists, not a mix")
    if strings:
        if tokenizer is None:
            raise ValueError("dry_sequence_breakers: string breakers need a tokenizer (tokenizer=)")
        from jaxsample.dry import dry_sequence_breakers

        return dry_sequence_breakers(strings, tokenizer)
    return tuple(tuple(int(t) for t in b) for b in breakers)


def _infill_table(table, tokenizer, eos_ids):
    if table is not None:
        return table
    if tokenizer is None or not eos_ids:
        raise ValueError("samplers: the infill sampler (i) needs tokenizer= and eos_ids= (the end-of-generation "
                         "ids), or infill_table=")
    from jaxsample.infill import infill_table_from_tokenizer

    return infill_table_from_tokenizer(tokenizer, [int(i) for i in eos_ids])


def _grammar_values(grammar, json_schema, vocabulary, tokenizer, eos_ids, triggers=None) -> dict:
    """The grammar stage's values (tables and grammar id 0 for every row; with ``triggers``, the
    lazy stage's trigger tables and slot ranks, and the ``max_trigger_bytes`` the stage needs)."""
    from jaxsample import structured

    if vocabulary is None:
        if tokenizer is None:
            raise ValueError("grammar / json_schema need the vocabulary: pass tokenizer= or vocabulary=")
        vocabulary = structured.Vocabulary.from_tokenizer(tokenizer, eos_ids=[int(i) for i in eos_ids] or None)
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise ValueError(f"grammar must be a non-empty GBNF string, got {grammar!r}")
        compiled = structured.compile_gbnf(grammar, vocabulary)
    else:
        schema = json_schema
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as err:
                raise ValueError(f"json_schema is not valid JSON: {err}") from None
        # llama.cpp's json-schema-to-grammar: bounded whitespace, properties in a fixed order
        compiled = structured.compile_json_schema(schema, vocabulary, whitespace="bounded", property_order="schema")
    if triggers is None:
        params = structured.grammar_params([compiled], (1,))
        return {key: (value if key.endswith("_tables") else 0) for key, value in params.items()}
    if not triggers:
        raise ValueError("grammar_lazy needs grammar_triggers (llama.cpp: a lazy grammar waits for a trigger)")
    from jaxsample.structured import triggers as _triggers

    longest = _triggers.longest(triggers)
    params = structured.trigger_params([compiled], [triggers], vocabulary, (1,), max_trigger_bytes=longest)
    return {"grammar_tables": params["grammar_tables"], "grammar_grammar": 0,
            "grammar_triggers": params["grammar_triggers"],
            "grammar_trigger_rank": [int(r) for r in params["grammar_trigger_rank"][0]],
            "max_trigger_bytes": longest}


def _used(parts, select) -> set[str]:
    return {p.name for part in list(parts) + [select] for p in part.params} | {"seed"}


# CLI flag -> common_params_sampling field (llama.cpp common/arg.cpp)
_FLAGS = {
    "-s": "seed", "--seed": "seed", "--temp": "temp", "--top-k": "top_k", "--top-p": "top_p", "--min-p": "min_p",
    "--top-nsigma": "top_n_sigma", "--xtc-probability": "xtc_probability", "--xtc-threshold": "xtc_threshold",
    "--typical": "typ_p", "--repeat-last-n": "penalty_last_n", "--repeat-penalty": "penalty_repeat",
    "--presence-penalty": "penalty_present", "--frequency-penalty": "penalty_freq",
    "--dry-multiplier": "dry_multiplier", "--dry-base": "dry_base", "--dry-allowed-length": "dry_allowed_length",
    "--dry-penalty-last-n": "dry_penalty_last_n", "--dynatemp-range": "dynatemp_range",
    "--dynatemp-exp": "dynatemp_exponent", "--mirostat": "mirostat", "--mirostat-lr": "mirostat_eta",
    "--mirostat-ent": "mirostat_tau", "--samplers": "samplers", "--sampling-seq": "samplers",
    "--sampler-seq": "samplers", "--min-keep": "min_keep", "--adaptive-target": "adaptive_target",
    "--adaptive-decay": "adaptive_decay", "--grammar": "grammar", "--json-schema": "json_schema",
    "-j": "json_schema",
}
_STRING_FIELDS = {"samplers", "grammar", "json_schema"}
_FILE_FLAGS = {"--grammar-file": "grammar", "--json-schema-file": "json_schema", "-jf": "json_schema"}
_INT_FIELDS = {"seed", "top_k", "penalty_last_n", "dry_allowed_length", "dry_penalty_last_n", "mirostat", "min_keep"}


def llama_cpp_args(args: str | Sequence[str], **fields) -> Preset:
    """:func:`llama_cpp` from llama.cpp command-line flags (``"--temp 0.7 --top-k 20 -l 15043+1"``).

    Supports the sampling flags of ``llama-cli`` / ``llama-server``: ``-l/--logit-bias
    TOKEN(+|-)BIAS``, ``--ignore-eos``, ``--samplers`` / ``--sampling-seq`` (every letter,
    ``i`` and ``a`` included), ``--dry-sequence-breaker`` (repeatable: the first one replaces the
    defaults, ``none`` clears them), ``--adaptive-target`` / ``--adaptive-decay``, ``--grammar`` /
    ``--grammar-file``, ``--json-schema`` / ``--json-schema-file``. Extra keyword ``fields`` (e.g.
    ``eos_ids``, ``tokenizer``, ``vocabulary``) are passed on to :func:`llama_cpp`.

    >>> llama_cpp_args("--temp 0 --top-k 1").values["temperature"]
    0.0
    """
    tokens = shlex.split(args) if isinstance(args, str) else list(args)
    out: dict[str, Any] = {}
    bias: dict[int, float] = {}
    breakers: list[str] | None = None
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        if flag == "--ignore-eos":
            out["ignore_eos"] = True
            i += 1
            continue
        if i + 1 >= len(tokens):
            raise ValueError(f"{flag}: missing value")
        value = tokens[i + 1]
        if flag in ("-l", "--logit-bias"):
            sep = max(value.rfind("+"), value.rfind("-"))
            if sep <= 0:
                raise ValueError(f"{flag}: expected TOKEN_ID(+/-)BIAS, got {value!r}")
            try:
                bias[int(value[:sep])] = float(value[sep:])
            except ValueError:
                raise ValueError(f"{flag}: expected TOKEN_ID(+/-)BIAS, got {value!r}") from None
        elif flag == "--dry-sequence-breaker":
            breakers = [] if breakers is None else breakers  # the first use clears llama.cpp's defaults
            if value == "none":
                breakers.clear()
            else:
                breakers.append(value)
        elif flag in _FILE_FLAGS:
            try:
                with open(value, encoding="utf-8") as f:
                    out[_FILE_FLAGS[flag]] = f.read()
            except OSError as err:
                raise ValueError(f"{flag}: cannot read {value!r} ({err.strerror})") from None
        elif flag in _FLAGS:
            field = _FLAGS[flag]
            try:
                out[field] = value if field in _STRING_FIELDS else (int(value) if field in _INT_FIELDS else float(value))
            except ValueError:
                raise ValueError(f"{flag}: expected a number, got {value!r}") from None
            if field == "dry_base" and out[field] < 1.0:
                raise ValueError(f"{flag}: must be >= 1 (llama.cpp ignores smaller values), got {value}")
        else:
            known = sorted(set(_FLAGS) | set(_FILE_FLAGS) | {"--ignore-eos", "-l", "--logit-bias",
                                                            "--dry-sequence-breaker"})
            raise ValueError(f"unsupported llama.cpp flag {flag!r} (supported: {known})")
        i += 2
    if "grammar" in out and "json_schema" in out:
        raise ValueError("--grammar / --grammar-file and --json-schema / --json-schema-file are exclusive")
    if bias:
        out["logit_bias"] = bias
    if breakers is not None:
        out["dry_sequence_breakers"] = breakers
    return llama_cpp(**{**out, **fields})
