"""The evaluation runner: checkpoint + dataset + named decoding configs -> per-config metrics.

:func:`evaluate` restores a BART checkpoint, reads the dataset's examples (refused when the
checkpoint recorded another tokenizer than the dataset's:
:func:`jaxsample.models.checkpoint.check_tokenizer`), scores the references (teacher-forced
log-likelihood and perplexity: a property of the model, the same for every decoding config),
then for each decoding config decodes every row data-parallel over the devices
(:mod:`jaxsample.evaluation.sharding`; a row's outputs never depend on the device or host count),
rescores the first output of each row under the model, and computes the metrics of
:mod:`jaxsample.evaluation.metrics`. Process 0 writes ``results.json`` (metrics, settings,
timings), ``summary.md`` (the table and a few decoded examples) and ``outputs.jsonl`` (every
output of every row, ids and text).

Compilation is shared: sampler values and the traced decoding settings (length penalty, diversity
penalty, contrastive alpha) are arguments of the compiled program, so decoding configs that differ
only in values (every vLLM-style sampler, llama.cpp's chain with or without DRY) compile once.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxsample import decoding, distributed
from jaxsample.decoding import beam, contrastive, rank
from jaxsample.decoding.generate import generate_tokens
from jaxsample.decoding.model import repeat_rows
from jaxsample.evaluation import data as _data
from jaxsample.evaluation import metrics as M
from jaxsample.evaluation import sharding
from jaxsample.evaluation.configs import DecodingConfig, EvalConfig, load_decodings
from jaxsample.models import checkpoint as _checkpoint
from jaxsample.models import make_model
from jaxsample.models.train import shift_right

RESULTS_VERSION = 1
# decoding settings passed to the compiled program as arguments (plus the sampler: values traced, structure static)
_TRACED = ("sampler", "length_penalty", "diversity_penalty", "penalty_alpha")


# ------------------------------------------------------------------------------ device programs
def _score_fn(model) -> Callable:
    """Per-device ``(params, rows) -> {"logprob": [b]}``: teacher-forced log-prob of ``tokens[:lengths]``."""
    cfg = model.config

    def fn(params, local):
        tokens, lengths = local["tokens"], local["lengths"]
        valid = jnp.arange(tokens.shape[1]) < lengths[:, None]
        tokens = jnp.where(valid, tokens, cfg.pad_id)
        decoder_input = shift_right(tokens, cfg.decoder_start_id, cfg.pad_id)
        logits = model(params, local["input_ids"], local["attention_mask"], decoder_input).logits
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        picked = jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
        return {"logprob": jnp.sum(jnp.where(valid, picked, 0.0), axis=-1)}

    return fn


def _decode_fn(model, cfg: DecodingConfig, sampler, n_new: int) -> Callable:
    """Per-device ``(shared, rows) -> {"tokens": [b, k, N], "lengths": [b, k], "reason": [b, k]}``.

    ``shared`` holds the model ``params``, the sampler values (``[1, ...]`` arrays, broadcast to
    the rows), the traced strategy settings and the ``seed``; row ``r`` samples with
    :func:`sharding.row_keys` (``fold_in(key(seed), r)``).
    """
    k, c = cfg.num_return, model.config
    run = {"greedy": generate_tokens, "contrastive": contrastive.search, "best_of": rank.rank}.get(cfg.strategy, beam.search)
    traced = [name for name in _TRACED[1:] if name in cfg.USES[cfg.strategy]]

    def fn(shared, local):
        params, ids, row, seed = shared["params"], local["input_ids"], local["row"], shared["seed"]
        b = ids.shape[0]
        cache = model.encode(params, ids, local["attention_mask"], n_new + 1)
        start = jnp.full((b, 1), c.decoder_start_id, jnp.int32)
        values = None
        if sampler is not None:
            values = {n: jnp.broadcast_to(v, (b,) + v.shape[1:]) for n, v in shared["sampler"].items()}
            values["seed"] = sharding.row_keys(seed, row)
        common = dict(max_new_tokens=n_new, eos_ids=c.eos_id, pad_id=c.pad_id, sampler=sampler, sampler_params=values)
        if cfg.strategy == "sample":  # k independent samples per row, seeds fold_in(fold_in(key(seed), row), j)
            many = repeat_rows(values, k)
            many["seed"] = sharding.row_keys(seed, row, k).reshape(-1)
            opts = cfg.options(**{**common, "sampler_params": many})
            out = generate_tokens(model, params, repeat_rows(start, k), None, opts, cache=repeat_rows(cache, k))
        else:  # the config's DecodingOptions, with the traced settings as arguments of the compiled program
            opts = cfg.options(**common, **{name: shared[name] for name in traced})
            out = run(model, params, start, None, opts, cache=cache)
        return {"tokens": out.tokens.reshape(b, k, -1), "lengths": out.lengths.reshape(b, k),
                "reason": out.finish_reason.reshape(b, k)}

    return fn


# ------------------------------------------------------------------------------------- helpers
def _check_model(model, tokenizer, arrays: dict, n_new: int) -> None:
    c = model.config
    if not model.is_encoder_decoder:
        raise ValueError("the evaluation runner decodes BART-style checkpoints (infilling); this one is decoder-only")
    for role in ("pad", "eos", "decoder_start"):
        if getattr(c, f"{role}_id") != getattr(tokenizer, f"{role}_id"):
            raise ValueError(f"checkpoint {role}_id={getattr(c, f'{role}_id')} differs from the dataset tokenizer's "
                             f"{getattr(tokenizer, f'{role}_id')}: the model was trained with another tokenizer")
    if c.vocab_size < tokenizer.vocab_size:
        raise ValueError(f"checkpoint vocab_size={c.vocab_size} < dataset tokenizer's {tokenizer.vocab_size}")
    longest = max(arrays["input_ids"].shape[1], arrays["labels"].shape[1], n_new + 1)
    if longest > c.max_len:
        raise ValueError(f"sequences of {longest} positions exceed the model's max_len={c.max_len} "
                         "(lower max_source_len / max_target_len / max_new_tokens)")


def _body(seq, specials) -> tuple[int, ...]:
    return tuple(t for t in seq if t not in specials)


def _config_metrics(wanted, hyps_all, primary_lengths, reasons, logprob, refs, sources, tok) -> dict:
    """Metrics of one decoding config: ``hyps_all[r]`` = the outputs of row ``r`` (first = primary)."""
    specials = {tok.bos_id, tok.eos_id, tok.pad_id}
    primary = [h[0] for h in hyps_all]
    out: dict[str, Any] = {}
    if "exact_match" in wanted:
        out["exact_match"] = M.exact_match(primary, refs)
    if "infill" in wanted:
        out.update(M.infill_exact_match(sources, primary, refs, tok.mask_id))
    if "token_accuracy" in wanted:
        out["token_accuracy"] = M.token_accuracy(primary, refs)
    if "distinct" in wanted:
        bodies = [_body(h, specials) for hs in hyps_all for h in hs]
        out["distinct_1"], out["distinct_2"] = M.distinct_n(bodies, 1), M.distinct_n(bodies, 2)
    if "self_bleu" in wanted:
        out["self_bleu"] = M.self_bleu([[tok.decode(_body(h, specials)) for h in hs] for hs in hyps_all])
    if "length" in wanted:
        out["length"] = M.length_stats(primary_lengths)
        out["finished_by_eos"] = float(np.mean(reasons == int(decoding.FinishReason.EOS)))
    if "logprob" in wanted and logprob is not None:
        out["logprob_per_token"] = float(logprob.sum() / max(int(primary_lengths.sum()), 1))
    return out


# ------------------------------------------------------------------------------------- runner
def evaluate(config: EvalConfig, *, config_path: str | None = None, devices: list | None = None,
             log: Callable[[str], None] | None = print) -> dict:
    """Runs an evaluation (see the module docstring) and returns the results dict.

    Args:
      config: the eval config; ``config_path`` is the file it was read from (resolves names).
      devices: local devices to use (default: all of this process's).
      log: progress lines (``None``: quiet).

    Returns:
      ``{"settings", "reference", "configs": {name: metrics + timing}, "outputs": {name: ...}, ...}``;
      ``outputs[name]`` holds the host arrays ``tokens [R, k, N]``, ``lengths``, ``reason [R, k]``.
    """
    say = log or (lambda _: None)
    started = time.perf_counter()
    decodings = load_decodings(config, relative_to=config_path)
    path = None
    with distributed.together("evaluate: prepare the dataset"):  # process 0 builds a missing dataset first
        if distributed.is_main():
            path = _data.prepare(config.dataset, relative_to=config_path, log=say)
    path = path or _data.prepare(config.dataset, relative_to=config_path, log=say)  # the others then find it
    rows = _data.load_rows(path, max_rows=config.dataset.max_rows, max_source_len=config.max_source_len,
                           max_target_len=config.max_target_len)
    tok, a = rows.tokenizer, rows.arrays
    ckpt = _checkpoint.restore(config.checkpoint, step=config.step)
    _checkpoint.check_tokenizer(ckpt.metadata, tok, f"{config.checkpoint}/{ckpt.step}", path)
    model = make_model(ckpt.config)
    n_new = config.max_new_tokens or a["labels"].shape[1]
    _check_model(model, tok, a, n_new)

    runner = sharding.DataParallel.shared_instance(config.parallel, devices)
    plan = sharding.make_plan(len(a["index"]), config.per_device_batch_size,
                              devices=len(runner.devices) * jax.process_count())
    params = runner.shared(ckpt.params)
    inputs = {"input_ids": a["input_ids"], "attention_mask": a["attention_mask"]}
    ref_lengths = a["loss_mask"].sum(-1).astype(np.int32)
    refs = M.trim(a["labels"], ref_lengths)
    sources = M.trim(a["input_ids"], a["attention_mask"].sum(-1))
    score = _score_fn(model)
    say(f"evaluating {ckpt.config.arch} step {ckpt.step} on {len(refs)} rows of {path} "
        f"({len(runner.devices)} device(s), {config.parallel}, {plan.steps} step(s) of "
        f"{config.per_device_batch_size} rows per device)")

    results: dict[str, Any] = {
        "version": RESULTS_VERSION,
        "settings": {"checkpoint": os.path.abspath(config.checkpoint), "step": ckpt.step, "dataset": os.path.abspath(path),
                     "rows": len(refs), "max_new_tokens": n_new, "seed": config.seed, "parallel": config.parallel,
                     "devices": len(runner.devices), "processes": jax.process_count(),
                     "per_device_batch_size": config.per_device_batch_size},
        "reference": None, "configs": {}, "outputs": {},
    }
    if "reference" in config.metrics:
        out, timing = runner.run(("score", model), score, params,
                                 {**inputs, "tokens": a["labels"], "lengths": ref_lengths}, plan)
        total, count = float(out["logprob"].sum()), int(ref_lengths.sum())
        results["reference"] = {"nll_per_token": -total / count, "perplexity": M.perplexity(total, count),
                                "tokens": count, "seconds": timing.compile_seconds + timing.run_seconds}

    wanted = tuple(config.metrics)
    if "self_bleu" in wanted and importlib.util.find_spec("sacrebleu") is None:
        say("self-BLEU skipped: sacrebleu is not installed (pip install 'jaxsample[metrics]')")
        wanted = tuple(m for m in wanted if m != "self_bleu")
    for name, dcfg, scfg in decodings:
        preset = scfg.build(eos_ids=[tok.eos_id], tokenizer=tok.tokenizer) if scfg is not None else None
        sampler = preset.sampler if preset is not None else None
        if sampler is not None and any(p.shared for p in sampler.param_specs().values()):
            raise ValueError(f"decoding {name!r}: samplers with shared (grammar) parameters are not supported here")
        shared = {
            "params": params,
            "sampler": preset.params((1,)) if preset is not None else {},
            "length_penalty": np.float32(dcfg.length_penalty),
            "diversity_penalty": np.float32(dcfg.diversity_penalty),
            "penalty_alpha": np.float32(dcfg.penalty_alpha),
            "seed": np.int32(config.seed),
        }
        static = tuple((f.name, getattr(dcfg, f.name)) for f in dataclasses.fields(dcfg) if f.name not in _TRACED)
        fn = _decode_fn(model, dcfg, sampler, n_new)
        say(f"  {name:<18} compiling and running {dcfg.strategy} ...")
        out, timing = runner.run(("decode", model, static, sampler, n_new), fn, shared, inputs, plan)
        hyps = [M.trim(row, lens) for row, lens in zip(out["tokens"], out["lengths"])]
        logprob = None
        if "logprob" in config.metrics:
            scored, _ = runner.run(("score", model), score, params,
                                   {**inputs, "tokens": out["tokens"][:, 0], "lengths": out["lengths"][:, 0]}, plan)
            logprob = scored["logprob"]
        metrics = _config_metrics(wanted, hyps, out["lengths"][:, 0], out["reason"], logprob, refs, sources, tok)
        generated = int(out["lengths"].sum())
        metrics["timing"] = {"compile_seconds": timing.compile_seconds, "run_seconds": timing.run_seconds,
                             "generated_tokens": generated,
                             "tokens_per_second": generated / max(timing.run_seconds, 1e-9)}
        metrics["strategy"] = dcfg.strategy
        metrics["sampler"] = None if scfg is None else {"ecosystem": scfg.ecosystem, "settings": scfg.settings}
        metrics["num_return"] = dcfg.num_return
        results["configs"][name] = metrics
        results["outputs"][name] = out
        say(f"  {name:<18} {format_row(metrics)}  (compiled in {timing.compile_seconds:.1f} s)")
    results["examples"] = format_examples(results, tok, a, config.examples)
    results["seconds"] = time.perf_counter() - started
    if config.output_dir and distributed.is_main():
        write(results, config.output_dir, tok, a)
    return results


# ------------------------------------------------------------------------------------- reports
COLUMNS = (  # header, metric key, format
    ("EM", "exact_match", "{:.3f}"),
    ("infill EM", "infill_exact_match", "{:.3f}"),
    ("faithful", "faithful", "{:.3f}"),
    ("tok acc", "token_accuracy", "{:.3f}"),
    ("dist-1", "distinct_1", "{:.3f}"),
    ("dist-2", "distinct_2", "{:.3f}"),
    ("self-BLEU", "self_bleu", "{:.1f}"),
    ("logprob/tok", "logprob_per_token", "{:.3f}"),
    ("len", None, "{:.1f}"),
    ("tok/s", None, "{}"),
)


def format_rate(x: float) -> str:
    """``1234.5 -> '1,234'``.

    >>> format_rate(1234.5)
    '1,234'
    """
    return f"{int(x):,}"


def _cells(m: dict) -> list[str]:
    cells = []
    for header, key, fmt in COLUMNS:
        if header == "len":
            value = m.get("length", {}).get("mean")
        elif header == "tok/s":
            cells.append(format_rate(m["timing"]["tokens_per_second"]))
            continue
        else:
            value = m.get(key)
        cells.append("-" if value is None else fmt.format(value))
    return cells


def format_row(m: dict) -> str:
    """One line of the progress log."""
    return "  ".join(f"{h} {c}" for (h, _, _), c in zip(COLUMNS, _cells(m)) if c != "-")


def format_table(results: dict) -> str:
    """The markdown comparison table of an evaluation's results."""
    head = ["config", "strategy"] + [h for h, _, _ in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * len(COLUMNS)) + "|"]
    for name, m in results["configs"].items():
        lines.append("| " + " | ".join([name, m["strategy"]] + _cells(m)) + " |")
    ref = results.get("reference")
    if ref:
        lines.append("")
        lines.append(f"Reference (teacher-forced) log-likelihood: {-ref['nll_per_token']:.3f} nats/token, "
                     f"perplexity {ref['perplexity']:.2f} over {ref['tokens']:,} tokens.")
    return "\n".join(lines)


def _text(tok, ids) -> str:
    return tok.decode([t for t in ids if t not in (tok.bos_id, tok.eos_id, tok.pad_id)]).strip()


def format_examples(results: dict, tok, arrays: dict, count: int) -> str:
    """Source (with masks), reference and each config's first output for the first ``count`` rows."""
    lines = []
    for r in range(min(count, len(arrays["index"]))):
        src = arrays["input_ids"][r][arrays["attention_mask"][r].astype(bool)]
        lines.append(f"* source:    {_text(tok, src)}")
        lines.append(f"  reference: {_text(tok, arrays['labels'][r][arrays['loss_mask'][r].astype(bool)])}")
        for name, out in results["outputs"].items():
            lines.append(f"  {name + ':':<10} {_text(tok, out['tokens'][r, 0, :out['lengths'][r, 0]])}")
    return "\n".join(lines)


def write(results: dict, out_dir: str, tok, arrays: dict) -> None:
    """``results.json``, ``summary.md`` and ``outputs.jsonl`` in ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in results.items() if k != "outputs"}, f, indent=1)
    with open(os.path.join(out_dir, "summary.md"), "w", encoding="utf-8") as f:
        f.write(format_table(results) + "\n")
        if results.get("examples"):
            f.write("\nExamples (first output of each config):\n\n" + results["examples"] + "\n")
    with open(os.path.join(out_dir, "outputs.jsonl"), "w", encoding="utf-8") as f:
        for name, out in results["outputs"].items():
            for r in range(out["tokens"].shape[0]):
                ids = [out["tokens"][r, j, :n].tolist() for j, n in enumerate(out["lengths"][r])]
                f.write(json.dumps({"config": name, "row": r, "index": int(arrays["index"][r]),
                                    "part": int(arrays["part"][r]), "ids": ids,
                                    "text": [_text(tok, i) for i in ids]}) + "\n")
