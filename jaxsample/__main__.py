"""``python -m jaxsample [COMMAND]``: the demo (default), the sampler showcase, training and evaluation.

Examples::

    python -m jaxsample                          # = demo: data, a tiny BART, infilling with many samplers
    python -m jaxsample demo --out runs/demo2 --steps 1200 --seed 1
    python -m jaxsample showcase --set context="the value of the"
    python -m jaxsample train --config configs/train/pydoc_bart.yaml --set train.num_steps=3000
    python -m jaxsample eval --config configs/eval/infill.yaml --set dataset.max_rows=256
    python -m jaxsample configs samplers         # the shipped configs (installed with the package)

Every command takes ``--config FILE`` (a versioned YAML file of its kind) and ``--set key=value``
overrides (values parsed as YAML, nested keys dotted). Invalid input prints one line and exits
with code 2. ``train`` and ``eval`` run on several hosts with JAX's distributed runtime:
``--distributed`` (or ``JAXSAMPLE_DISTRIBUTED=1``, which ``tpu_scripts/launch.sh`` sets; the cluster
is detected) or an explicit ``--coordinator HOST:PORT --num-processes N --process-id I``. ``eval``:
each host decodes its rows on its own devices, rows are gathered and process 0 writes the results
(identical to one process). ``train``: one jitted step over the mesh of every host's devices, each
host feeding its slice of the global batch (identical losses to one process). ``demo`` and
``showcase`` run on one host. The jobs keep compiled programs in JAX's
persistent compilation cache (``--compile-cache DIR``, ``--no-compile-cache``; see
:mod:`jaxsample.compile_cache`), so only the first run of a configuration compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from jaxsample import compile_cache, distributed

COMMANDS = ("demo", "showcase", "train", "eval", "configs")


def _common(p: argparse.ArgumentParser, kind: str, default: str | None) -> None:
    where = f" (default: {default})" if default else ""
    p.add_argument("--config", help=f"YAML config of kind '{kind}'{where}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (repeatable), e.g. --set train.num_steps=100")
    compile_cache.add_arguments(p)


def _training(p: argparse.ArgumentParser, out: str, seed: str) -> None:
    """The flags of the commands that train: ``--out``, ``--steps``, ``--seed``, ``--no-progress``."""
    p.add_argument("--out", help=out)
    p.add_argument("--steps", type=int, help="training steps (train.num_steps; warmup <= steps / 10)")
    p.add_argument("--seed", type=int, help=seed)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m jaxsample",
        description="jaxsample jobs: the demo (default command), the sampler showcase, training, evaluation.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `python -m jaxsample COMMAND --help` for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="build data, train a tiny BART, fill masked sentences with many samplers",
                          description="Builds wakong infilling data from Python's docs, trains a tiny BART "
                          "(reused when present), evaluates many decoding strategies and samplers on held-out "
                          "sentences and prints the comparison table.")
    _common(demo, "demo", "configs/demo/demo.yaml")
    _training(demo, "run directory (default: runs/demo)", "seed of data order, init and sampling")

    show = sub.add_parser("showcase", help="what each sampler preset does to a real next-word distribution",
                          description="Applies each sampler config to the next-word distribution of a bigram model "
                          "of Python's docs: kept words, entropy, top words, samples.")
    _common(show, "showcase", None)
    show.add_argument("--context", help="words before the predicted one (default: 'the value of the')")

    train = sub.add_parser("train", help="train a BART on a wakong dataset (built from pydoc if needed)",
                           description="Trains a BART (config kind 'train'), with checkpoints, history and loss.png.")
    _common(train, "train", "configs/train/pydoc_bart.yaml")
    _training(train, "run directory", "seed of data order and init")
    distributed.add_arguments(train)

    ev = sub.add_parser("eval", help="evaluate decoding configs on a checkpoint and a dataset",
                        description="Runs the evaluation runner (config kind 'eval'): metrics per decoding config "
                        "as results.json, summary.md and outputs.jsonl.")
    _common(ev, "eval", "configs/eval/infill.yaml")
    ev.add_argument("--out", help="output directory (output_dir)")
    ev.add_argument("--parallel", choices=["mesh", "pmap"], help="data-parallel path")
    ev.add_argument("--json", action="store_true", help="print results.json to stdout instead of the table")
    distributed.add_arguments(ev)

    cf = sub.add_parser("configs", help="list the shipped configs (kind, name, summary)",
                        description="Lists the YAML configs shipped with the package (jaxsample.configs), the "
                        "names that --config, sampler and decoding references resolve to.")
    cf.add_argument("folder", nargs="?", help="only this folder (samplers, decoding, eval, demo, train, models, wakong)")
    cf.add_argument("--path", action="store_true", help="print the directory of the shipped configs and exit")
    return parser


def _default(name: str) -> str:
    from jaxsample.evaluation.configs import CONFIGS_DIR

    return os.path.join(CONFIGS_DIR, name)


def _flags(args, **keys) -> list[str]:
    """``--set`` overrides for dedicated flags that were given (they come before the user's ``--set``)."""
    out = [f"{key}={json.dumps(getattr(args, flag))}" for flag, key in keys.items() if getattr(args, flag, None)
           is not None]
    return out + list(args.set)


def _with_steps(cfg, steps: int | None):
    """``--steps``: the training length; a longer warmup shrinks to a tenth of it."""
    if steps is None:
        return cfg
    import dataclasses

    train = dataclasses.replace(cfg.train, num_steps=steps, warmup_steps=min(cfg.train.warmup_steps, steps // 10))
    return dataclasses.replace(cfg, train=train)


def _demo(args) -> int:
    from jaxsample.evaluation.runner import format_table
    from jaxsample.jobs import demo

    path = args.config or _default("demo/demo.yaml")
    cfg = _with_steps(demo.load(path, _flags(args, out="out", seed="seed")), args.steps)
    results = demo.run(cfg, relative_to=path, progress=not args.no_progress)
    print()
    print(format_table(results))
    if results["examples"]:
        print("\nFilled-in held-out sentences (first output of each config):\n")
        print(results["examples"])
    d = results["demo"]
    print(f"\ndone in {d['wall_seconds']:.0f} s wall, {d['cpu_seconds']:.0f} s CPU "
          f"(data + training {d['data_and_training_wall_seconds']:.0f} s"
          f"{', checkpoint reused' if d['reused_checkpoint'] else ''}); outputs in {os.path.abspath(cfg.out)}")
    return 0


def _showcase(args) -> int:
    from jaxsample.jobs import showcase

    cfg = showcase.load(args.config, _flags(args, context="context"))
    showcase.run(cfg, relative_to=args.config)
    return 0


def _train(args) -> int:
    process = distributed.from_args(args)  # before anything touches JAX
    from jaxsample.jobs import train

    path = args.config or _default("train/pydoc_bart.yaml")
    cfg = _with_steps(train.load(path, _flags(args, out="out", seed="seed")), args.steps)
    done = train.run(cfg, relative_to=path, progress=not args.no_progress, log=print if not process.index else None)
    if process.index:
        return 0
    state = "reused" if done.reused else f"trained in {done.seconds:.0f} s"
    print(f"checkpoint step {done.step} ({state}): {os.path.abspath(done.checkpoint)}")
    return 0


def _eval(args) -> int:
    process = distributed.from_args(args)  # before anything touches JAX
    from jaxsample.evaluation import configs, runner

    path = args.config or _default("eval/infill.yaml")
    cfg = configs.load_eval(path, _flags(args, out="output_dir", parallel="parallel"))
    results = runner.evaluate(cfg, config_path=path, log=None if args.json or process.index else print)
    if process.index:  # process 0 reports
        return 0
    if args.json:
        print(json.dumps({k: v for k, v in results.items() if k != "outputs"}, indent=1))
    else:
        print()
        print(runner.format_table(results))
        if cfg.output_dir:
            print(f"\nresults in {os.path.abspath(cfg.output_dir)}")
    return 0


def _configs(args) -> int:
    import yaml

    from jaxsample.config import shipped_configs

    root = shipped_configs()
    if args.path:
        print(root)
        return 0
    folders = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("_"))
    if args.folder is not None and args.folder not in folders:
        raise ValueError(f"folder: no shipped config folder {args.folder!r} (folders: {', '.join(folders)})")
    for folder in [args.folder] if args.folder else folders:
        for name in sorted(f for f in os.listdir(os.path.join(root, folder)) if f.endswith(".yaml")):
            with open(os.path.join(root, folder, name), encoding="utf-8") as f:
                text = f.read()
            kind = (yaml.safe_load(text) or {}).get("kind", "?")
            summary = next((line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")), "")
            print(f"{folder}/{name[:-5]:<22} {kind:<13} {summary[:90]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxsample`` and the ``jaxsample`` script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv.insert(0, "demo")  # the demo is the default command
    args = _parser().parse_args(argv)
    import yaml

    try:
        if args.command != "configs":
            compile_cache.from_args(args)
        commands = {"demo": _demo, "showcase": _showcase, "train": _train, "eval": _eval, "configs": _configs}
        return commands[args.command](args)
    except (ValueError, FileNotFoundError, yaml.YAMLError) as err:  # DatasetError/TokenizerError are ValueErrors
        kind = "invalid YAML: " if isinstance(err, yaml.YAMLError) else ""
        print(f"jaxsample {args.command}: error: {kind}{' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"jaxsample {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
