"""JAX's persistent compilation cache for the command-line jobs, and "compiling ..." notices.

XLA compiles every jitted program once per process; for a sampler chain or a decoding loop that
takes seconds to tens of seconds on a CPU. The commands (``python -m jaxsample ...``, ``wakong
build``) turn on JAX's persistent cache so a second run loads the compiled programs from disk:

* default directory: ``$XDG_CACHE_HOME/jaxsample/jax`` (``~/.cache/jaxsample/jax``);
* ``--compile-cache DIR`` or ``JAXSAMPLE_COMPILE_CACHE=DIR`` picks another directory;
* ``--no-compile-cache`` or ``JAXSAMPLE_COMPILE_CACHE=off`` leaves the cache off.

JAX keys the entries by program, JAX/XLA version and device, so one directory serves every version
and machine. Library calls (not the CLI) never touch the cache unless you call :func:`enable`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Callable, Iterator

ENV = "JAXSAMPLE_COMPILE_CACHE"
_OFF = ("off", "0", "false", "no", "none", "")


def default_dir() -> str:
    """``$XDG_CACHE_HOME/jaxsample/jax``, ``~/.cache/jaxsample/jax`` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxsample", "jax")


def enable(directory: str | None = None, *, min_compile_seconds: float = 1.0) -> str:
    """Turns on JAX's persistent compilation cache in ``directory`` (default :func:`default_dir`).

    Programs that compile faster than ``min_compile_seconds`` are not stored. Returns the directory.
    """
    import jax

    directory = os.path.abspath(os.path.expanduser(directory or default_dir()))
    os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    return directory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--compile-cache DIR`` and ``--no-compile-cache``."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--compile-cache", metavar="DIR",
                       help=f"persistent JAX compilation cache directory (default: ${ENV} or {default_dir()})")
    group.add_argument("--no-compile-cache", action="store_true",
                       help="do not use the persistent compilation cache (every run compiles from scratch)")


def from_args(args: argparse.Namespace) -> str | None:
    """Applies the flags (then ``$JAXSAMPLE_COMPILE_CACHE``): the cache directory in use, or None (off)."""
    if getattr(args, "no_compile_cache", False):
        return None
    directory = getattr(args, "compile_cache", None)
    if directory is None:
        env = os.environ.get(ENV)
        if env is not None and env.strip().lower() in _OFF:
            return None
        directory = env
    return enable(directory)


@contextlib.contextmanager
def notice(what: str, log: Callable[[str], object] | None = None) -> Iterator[None]:
    """Logs ``compiling WHAT ...`` before the block and ``compiled WHAT in S s`` after it (stderr by default)."""
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    say(f"compiling {what} ...")
    start = time.perf_counter()
    yield
    say(f"compiled {what} in {time.perf_counter() - start:.1f} s")
