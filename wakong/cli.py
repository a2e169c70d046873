"""``wakong`` command line: build BART text-infilling datasets, train tokenizers, inspect, mask.

Examples::

    wakong build --corpus pydoc --out data/                       # Python's docs, article defaults
    wakong build corpus/*.txt --config configs/wakong/bart.yaml --out data/ --workers 2
    JAXSAMPLE_DISTRIBUTED=1 wakong build corpus/*.txt --out /shared/data/ # on every host of a TPU pod
    wakong build corpus/*.txt --out /shared/data/ --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0
    wakong build docs.jsonl --format jsonl --set input.field=body --tokenizer tokenizer.json --out data/
    wakong build corpus/*.txt --out /shared/data/ --num-shards 512 --runner beam --beam-options="--runner=..."
    wakong build corpus/*.txt --config bart --mode tokenized --out docs/    # noised on the device
    wakong train-tokenizer corpus/*.txt --vocab-size 32000 --out tokenizer.json
    wakong inspect data/ --verify                                 # also check every shard's sha256
    wakong mask "the quick brown fox jumps over the lazy dog" --seed 1

Settings come from ``--config`` (YAML), then the dedicated flags, then ``--set section.key=value``.
Errors (missing files, corrupt tokenizer or dataset, invalid settings, full disk, a failed host) print
one line and exit 1; nonsensical numbers (``--workers -1``) are argparse errors naming the flag (exit 2);
Ctrl-C exits 130. ``build`` checks everything before it changes ``--out`` and replaces an earlier
dataset only with a complete new one (:func:`wakong.pipeline.build`). ``build`` on several processes (``--distributed``/``--coordinator ...``, see
:mod:`jaxsample.distributed`) builds a part per process and merges them (:mod:`wakong.multihost`);
process 0 prints the report. ``build --runner beam`` runs the build as an Apache Beam pipeline
(:mod:`wakong.beam`; ``--beam-options`` go to Beam as they are).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

from wakong.records import catching_interrupts, check_interrupt
from wakong.sources import FORMATS

_FLAGS = {  # flag attribute -> config key
    "format": "input.format",
    "split": "input.split",
    "field": "input.field",
    "column": "input.column",
    "tokenizer": "tokenizer.path",
    "vocab_size": "tokenizer.vocab_size",
    "seed": "seed",
    "num_shards": "output.num_shards",
    "mode": "output.mode",
}


def _at_least(minimum: int):
    """argparse ``type``: an int >= ``minimum`` (argparse names the flag in its error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    from jaxsample import distributed

    parser = argparse.ArgumentParser(
        prog="wakong",
        description="Wakong span masking and BART text-infilling datasets (grain + ArrayRecord).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `wakong COMMAND --help` for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def inputs(p: argparse.ArgumentParser) -> None:
        p.add_argument("inputs", nargs="*", help="input files, directories or quoted glob patterns (text, JSONL, "
                       "plain or .gz/.zst; ArrayRecord; Parquet; Arrow / Hugging Face datasets directories)")
        p.add_argument("--corpus", choices=["pydoc"], help="built-in corpus instead of files: Python's docs")
        p.add_argument("--repeat", type=_at_least(1), default=1, help="use the built-in corpus N times (benchmarks)")
        p.add_argument("--config", help="YAML config: a path, or the name of a shipped one (article, bart, demo)")
        p.add_argument("--format", choices=[f for f in FORMATS if f != "pydoc"], help="input format")
        p.add_argument("--split", choices=["line", "paragraph", "file"], help="one text record per ...")
        p.add_argument("--field", help="JSON field holding the text")
        p.add_argument("--column", help="column holding the text (parquet, arrow; default: text)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")

    build = sub.add_parser("build", help="build a dataset: text in, ArrayRecord shards + manifest out")
    inputs(build)
    build.add_argument("--out", required=True, help="dataset directory")
    build.add_argument("--tokenizer", help="tokenizer.json or SentencePiece .model (default: train a byte-level BPE)")
    build.add_argument("--vocab-size", type=_at_least(1), help="vocabulary size of a trained tokenizer")
    build.add_argument("--seed", type=int, help="mask seed")
    build.add_argument("--num-shards", type=_at_least(1), help="ArrayRecord shards per host")
    build.add_argument("--mode", choices=["noised", "tokenized"],
                       help="write noised examples (default) or tokenized documents to noise on the device")
    build.add_argument("--workers", type=_at_least(0), default=0,
                       help="worker processes building whole shards (0: in process); with --runner beam: DirectRunner "
                       "processes")
    build.add_argument("--runner", choices=["local", "beam"], default="local",
                       help="local: this process (or each process of a --distributed job); beam: an Apache Beam "
                       "pipeline (pip install 'jaxsample[beam]')")
    build.add_argument("--worker-path", action="append", default=[], metavar="LAUNCHER=WORKER",
                       help="with --runner beam: Beam workers reach the launcher's paths under LAUNCHER (e.g. a "
                       "Cloud Storage FUSE mount, /gcs/bucket/) at WORKER (gs://bucket/); repeatable")
    build.add_argument("--beam-options", default="", metavar="FLAGS",
                       help='Beam pipeline options (one string, after "="), passed on as they are, e.g. '
                       '--beam-options="--runner=FlinkRunner --flink_master=HOST:8081" (default: DirectRunner)')
    build.add_argument("--overwrite", action="store_true", help="replace an earlier build in --out")
    build.add_argument("--no-progress", action="store_true", help="no progress bar")
    build.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    distributed.add_arguments(build)

    train = sub.add_parser("train-tokenizer", help="train a byte-level BPE with BART's special tokens")
    inputs(train)
    train.add_argument("--out", required=True, help="tokenizer.json to write")
    train.add_argument("--vocab-size", type=_at_least(1), help="vocabulary size")

    inspect = sub.add_parser("inspect", help="summarise a dataset and show decoded examples")
    inspect.add_argument("path", help="dataset directory")
    inspect.add_argument("--examples", type=_at_least(0), default=3, help="examples to show")
    inspect.add_argument("--verify", action="store_true", help="check every shard's sha256 against the manifest")

    mask = sub.add_parser("mask", help="mask the words of a text with Wakong (word-level infilling)")
    mask.add_argument("text", help="text to mask")
    mask.add_argument("--seed", type=int, default=0, help="random.Random seed")
    mask.add_argument("--mask-token", default="<mask>", help="mask token")
    return parser


def _config(args: argparse.Namespace):
    from wakong.config import load_config

    overrides = [
        f"{key}={json.dumps(getattr(args, flag))}"
        for flag, key in _FLAGS.items()
        if getattr(args, flag, None) is not None
    ]
    if args.corpus:
        if args.inputs:
            raise ValueError("give input files or --corpus, not both")
        overrides.append("input.format=pydoc")
    from jaxsample.config import config_path

    path = None if args.config is None else config_path(args.config, "wakong")
    return load_config(path, overrides + list(args.set))


def _source(args: argparse.Namespace, config):
    from wakong.sources import open_source

    if config.input.format != "pydoc" and not args.inputs:
        raise ValueError("no input files given (or use --corpus pydoc)")
    return open_source(config.input.format, args.inputs, split=config.input.split, repeat=args.repeat,
                       column=config.input.column)


def _tqdm(total: int, desc: str | None, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="rec", desc=desc, disable=not enabled, dynamic_ncols=True, file=sys.stderr)


def _progress(total: int, enabled: bool):
    bar = _tqdm(total, None, enabled)
    state = {"tokens": 0, "start": None, "shown": 0.0}

    def update(outcome) -> None:
        now = time.perf_counter()
        state["start"] = state["start"] or now  # rate over the records, not the start-up
        state["tokens"] += outcome.tokens
        bar.update(1)
        if now - state["shown"] > 0.5:
            state["shown"] = now
            bar.set_postfix_str(f"{state['tokens'] / max(now - state['start'], 1e-9):,.0f} tok/s")

    return bar, update


def _report_lines(manifest: dict, summary: dict | None) -> list[str]:
    c, timing = manifest["counts"], manifest["timing"]
    dropped = c["records_dropped"]
    reasons = ", ".join(f"{k} {v:,}" for k, v in dropped.items() if v)
    lines = [
        f"records in        {c['records_in']:>12,}",
        f"records written   {c['records_written']:>12,}",
        f"records dropped   {sum(dropped.values()):>12,}" + (f"  ({reasons})" if reasons else ""),
        f"examples          {c['examples']:>12,}",
        f"tokens            {c['tokens']:>12,}  (target; source {c['source_tokens']:,})",
    ]
    for key, value in c["events"].items():
        lines.append(f"  {key.replace('_', ' '):<30} {value:>10,}")
    if manifest["config"]["output"].get("mode") == "tokenized":
        lines.append("mode              tokenized: unnoised documents, noised on the device (wakong.device_noise)")
    if manifest["process_count"] > 1:
        per_part = ", ".join(f"{p['counts']['records_in']:,}" for p in manifest["parts"])
        count = manifest["process_count"]
        lines.append(f"processes         {count:>12,}  (records in per process: {per_part})")
    loop_rate = c["tokens"] / max(timing["loop_seconds"], 1e-9)
    where = f"Beam {timing['runner']}" if "runner" in timing else f"{timing['workers']} workers"
    lines.append(
        f"time              {timing['seconds']:>12.2f} s  -> {timing['tokens_per_second']:,.0f} tokens/s"
        " end to end"
        f" ({loop_rate:,.0f} tokens/s in the example loop, {where})"
    )
    if not summary or not summary["spans"]:
        return lines
    lines += [
        f"mask rate         {summary['mask_rate']:>12.4f}"
        f"  (exact expectation {summary['expected_mask_rate']:.4f},"
        f" {summary['masked_units']:,} of {summary['units']:,} units)",
        f"spans             {summary['spans']:>12,}  (expected {summary['expected_spans']:,.1f})",
        "span length       observed   exact",
    ]
    rows = zip(summary["span_histogram"], summary["span_pmf"], summary["expected_span_pmf"])
    for k, (count, p, q) in enumerate(rows):
        lines.append(f"  {k:>2} {'#' * round(40 * p):<40} {count:>9,}  {p:7.4f}  {q:7.4f}")
    edge = summary["edge"]
    if edge["records"]:
        lines.append(
            f"mask rate by distance from either end"
            f" ({edge['records']:,} sequences of >= {2 * edge['positions']} units)"
        )
        lines.append("  pos   start     end   exact")
        for i, (a, b, e) in enumerate(zip(edge["from_start"], edge["from_end"], edge["expected"])):
            lines.append(f"  {i:>3} {a:7.4f} {b:7.4f} {e:7.4f}")
        lines.append(f"  interior {edge['interior_rate']:.4f} (exact {edge['expected_interior_rate']:.4f})")
    return lines


def _beam_build(args: argparse.Namespace, source, config, reading) -> dict:
    """``--runner beam``: one launcher; Beam spreads the shards over its workers."""
    import logging

    logging.getLogger("apache_beam").setLevel(logging.CRITICAL)  # a failure is reported in one line
    from wakong import beam

    if any("=" not in p for p in args.worker_path):
        raise ValueError(f"--worker-path takes LAUNCHER=WORKER, got {args.worker_path}")
    paths = beam.check_worker_paths(dict(p.split("=", 1) for p in args.worker_path))
    options = beam.pipeline_options(args.beam_options, workers=args.workers)
    print(f"running the build on Apache Beam ({beam.runner_name(options)})", file=sys.stderr)
    return beam.build(source, args.out, config, overwrite=args.overwrite, options=options, worker_paths=paths,
                      tokenizer_progress=reading)


def _build(args: argparse.Namespace) -> int:
    from jaxsample import distributed
    from wakong import multihost
    from wakong.report import MaskStats, plot_positions, plot_span_lengths

    if (args.beam_options or args.worker_path) and args.runner != "beam":
        raise ValueError("--beam-options and --worker-path need --runner beam")
    settings = (args.coordinator, args.num_processes, args.process_id, args.local_device_ids)
    if args.runner == "beam" and distributed._resolve(*settings, distributed=args.distributed)[0]:
        raise ValueError("--runner beam is started once (Beam's runner spreads the work): drop --distributed, "
                         "--coordinator and their JAXSAMPLE_* variables")
    processes = distributed.from_args(args)
    config = _config(args)
    source = _source(args, config)
    if config.tokenizer.path is None and processes.is_main:
        size = config.tokenizer.vocab_size
        print(f"training a byte-level BPE tokenizer ({size:,} tokens) on {len(source):,} records",
              file=sys.stderr)
    total = len(range(processes.index, len(source), processes.count))
    bars: dict = {}

    def reading() -> None:  # a record read to train the tokenizer (the trainer's own bars need a terminal)
        if "tokenizer" not in bars:
            bars["tokenizer"] = _tqdm(len(source), "tokenizer", processes.is_main)
        bars["tokenizer"].update(1)

    def update(outcome) -> None:
        if "build" not in bars:
            if "tokenizer" in bars:
                bars.pop("tokenizer").close()
            bars["build"] = _progress(total, not args.no_progress)
        bars["build"][1](outcome)

    try:
        if args.runner == "beam":
            manifest = _beam_build(args, source, config, None if args.no_progress else reading)
        else:
            manifest = multihost.build(
                source,
                args.out,
                config,
                workers=args.workers,
                overwrite=args.overwrite,
                progress=update,
                processes=processes,
                tokenizer_progress=None if args.no_progress else reading,
            )
    finally:
        for bar in bars.values():
            (bar[0] if isinstance(bar, tuple) else bar).close()
    if not processes.is_main:
        c, i = manifest["parts"][processes.index]["counts"], processes.index
        print(f"process {i} of {processes.count}: built part {i} ({c['records_in']:,} records, "
              f"{c['examples']:,} examples); process 0 reports", file=sys.stderr)
        return 0
    summary = None
    if config.noise.infill:
        summary = MaskStats(config.noise.spans).merge(manifest["mask_stats"]).summary()
    report_dir = os.path.join(args.out, "report")
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, "report.json"), "w", encoding="utf-8") as f:
        json.dump({"counts": manifest["counts"], "timing": manifest["timing"], "mask": summary}, f, indent=1)
    lines = _report_lines(manifest, summary)
    plots = importlib.util.find_spec("matplotlib") is not None
    if summary and summary["spans"] and not args.no_plots and not plots:
        lines.append("plots             skipped: matplotlib is not installed (pip install 'jaxsample[plots]')")
    if summary and summary["spans"] and not args.no_plots and plots:
        spans_png = os.path.join(report_dir, "span_lengths.png")
        positions_png = os.path.join(report_dir, "mask_positions.png")
        plot_span_lengths(summary, spans_png)
        lines.append(f"plots             {spans_png}")
        if summary["edge"]["records"]:
            plot_positions(summary, positions_png)
            lines.append(f"                  {positions_png}")
    print("\n".join(lines))
    print(f"dataset           {os.path.abspath(args.out)}")
    return 0


def _train_tokenizer(args: argparse.Namespace) -> int:
    from wakong import pipeline
    from wakong.tokenizer import train_tokenizer

    config = _config(args)
    source = _source(args, config)
    cfg = config.tokenizer
    tok = train_tokenizer(
        pipeline.training_texts(source, config),
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        specials=cfg.special,
    )
    tok.save(args.out)
    print(f"wrote {args.out}: {tok.vocab_size:,} tokens, sha256 {tok.sha256}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from wakong import records
    from wakong.reader import open_dataset

    info, tok = open_dataset(args.path)
    c = info["counts"]
    dropped = sum(c["records_dropped"].values())
    print(f"dataset  {os.path.abspath(args.path)}: {len(info['parts'])} part(s), {len(info['files'])} shard(s)")
    print(f"records  in {c['records_in']:,}, written {c['records_written']:,}, dropped {dropped:,}")
    mode = info["config"]["output"].get("mode", "noised")
    print(f"examples {c['examples']:,}; tokens {c['tokens']:,}; seed {info['seed']}; mode {mode}")
    print(f"tokenizer sha256 {tok.sha256}")
    if args.verify:
        checked = records.verify_shards(info)
        print(f"verified {len(info['files'])} shard(s), {checked:,} bytes: every sha256 matches the manifest")
    left = args.examples
    for file in info["files"]:
        if left <= 0:
            break
        for rec in records.read_shard(file, left):
            print(f"\n[record {rec['index']} part {rec['part']}]")
            print("  source:", tok.decode(rec["input_ids"]) if len(rec["input_ids"]) else "(noised on the device)")
            print("  target:", tok.decode(rec["labels"]))
            left -= 1
    return 0


def _mask(args: argparse.Namespace) -> int:
    import random

    from wakong._reference import pretty_print_mask_scheme
    from wakong.infilling import infill, span_scheme

    words = args.text.split()
    scheme = span_scheme(random.Random(args.seed), len(words))
    print(" ".join(infill(words, scheme, args.mask_token)))
    pretty_print_mask_scheme(len(words), scheme)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``wakong`` command; returns the exit code.

    Ctrl-C at any point (imports included) is an interruption: one line, exit code 130.
    """
    commands = {"build": _build, "train-tokenizer": _train_tokenizer, "inspect": _inspect, "mask": _mask}
    with catching_interrupts():
        try:
            args = _parser().parse_args(argv)
            from jaxsample.distributed import DistributedError
            from wakong.records import DatasetError
            from wakong.tokenizer import TokenizerError

            try:
                code = commands[args.command](args)
            except (OSError, TokenizerError, DatasetError, ValueError, ImportError, DistributedError) as err:
                check_interrupt()  # an error caused by an interruption is the interruption
                print(f"wakong: error: {err}", file=sys.stderr)
                return 1
            except RuntimeError as err:  # a failed Beam pipeline (wakong.beam is imported only for --runner beam)
                beam = sys.modules.get("wakong.beam")
                if beam is None or not isinstance(err, beam.BeamBuildError):
                    raise
                check_interrupt()
                print(f"wakong: error: {err}", file=sys.stderr)
                return 1
            check_interrupt()
            return code
        except KeyboardInterrupt:
            print("wakong: interrupted; nothing was committed for the unfinished part", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
