"""Shared pytest configuration: hypothesis profiles and JAX settings for the whole suite."""

import importlib.util
import os
import shutil
import tempfile

collect_ignore = ["data"]  # scripts run against the reference package, not tests

# CLI jobs called in-process must not turn on JAX's persistent compilation cache for the whole
# suite (nor write to the user's cache); tests of the cache pass --compile-cache explicitly.
os.environ.setdefault("JAXSAMPLE_COMPILE_CACHE", "off")
# The suite compiles thousands of small programs, and LLVM's optimisation passes are most of each
# XLA:CPU compile while buying nothing at test sizes: a third of the fast tier's time. The programs'
# semantics do not change (XLA:CPU does no fast-math either way). The legacy elemental emitters instead
# of the MLIR fusion emitters: another ~10% of compile CPU on the fast-path property's chains (87.6 ->
# 78.5 CPU-s, execution unchanged). LLVM code generation in one piece instead of split into parts
# for parallel compilation: the suite's xdist workers already keep every core busy, and the split
# costs ~14% of compile CPU (13 programs of the sampler chains: 12.4 -> 10.7 CPU-s). Appended to the
# user's XLA_FLAGS, inherited by the subprocesses tests start (tests/_devices.py adds 8 simulated
# devices to it).
_FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true",
                 "--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
_CHECKED = "JAXSAMPLE_TEST_XLA_FLAGS"  # set once by the first pytest process; xdist workers inherit it


def _known_flags(flags: tuple[str, ...]) -> list[str]:
    """``flags`` less those the installed XLA does not know (an unknown flag in ``XLA_FLAGS`` aborts
    the process: jaxlib 0.11 dropped ``--xla_cpu_use_fusion_emitters``). One short subprocess."""
    import subprocess
    import sys

    flags = list(flags)
    while flags:
        env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {' '.join(flags)}", "JAX_PLATFORMS": "cpu"}
        probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True, text=True)
        unknown = [f for f in flags if f"Unknown flag in XLA_FLAGS: {f}" in probe.stderr]
        if probe.returncode == 0 or not unknown:
            return flags
        flags = [f for f in flags if f not in unknown]
    return flags


if _CHECKED not in os.environ:
    os.environ[_CHECKED] = " ".join(_known_flags(_FAST_COMPILE))
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {os.environ[_CHECKED]}".strip()

# One persistent XLA compilation cache per run, new and empty (never the user's), shared by the xdist
# workers and the processes tests start: a program that both workers, or two test modules (compiled
# programs are freed per module below), compile alike is compiled once and then read from disk
# (~130 programs took >= 1 s and are stored, ~50 MB; one run each on 2 cores: the fast tier 15:40 -> 14:09,
# the typical-vs-bisection test 38 -> 11 s on the second worker). With a size bound, JAX holds a file
# lock around each read and write, so no process reads an entry another is still writing (the lock
# needs `filelock`, which torch and huggingface_hub bring; without it the cache stays off).
# Env variables, not jax.config: set before JAX is imported, they reach the workers and subprocesses.
_CACHE = "JAXSAMPLE_TEST_COMPILATION_CACHE"
_OWN_CACHE = _CACHE not in os.environ and importlib.util.find_spec("filelock") is not None
if _OWN_CACHE:
    os.environ[_CACHE] = tempfile.mkdtemp(prefix="jaxsample-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ[_CACHE]
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(16 << 30)
elif _CACHE not in os.environ:  # no filelock: no cache, and not the user's either
    os.environ[_CACHE] = ""
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)


def pytest_unconfigure(config):
    """The run's compilation cache is removed by the process that made it (xdist's controller)."""
    if _OWN_CACHE:
        shutil.rmtree(os.environ[_CACHE], ignore_errors=True)


import jax
import pytest
from hypothesis import HealthCheck, settings

# Fast tier (CI default): few examples, no deadline (jit compiles dominate the first example).
settings.register_profile(
    "ci", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

jax.config.update("jax_enable_x64", False)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` without ``--dist``: work stealing instead of xdist's default ``load``.

    ``load`` hands the collection out in consecutive slices, so a module that straddles two slices runs
    partly on each worker, and both workers pay for its module-scoped fixtures and compiled programs
    (freed per module below). Work stealing gives each worker one contiguous half and moves only the
    tail of a busy worker's queue to an idle one, so modules are split only a few times, near the end.
    """
    args = config.invocation_params.args
    if config.getvalue("dist") == "load" and not any(a == "-d" or a.startswith("--dist") for a in args):
        from xdist.scheduler import WorkStealingScheduling

        return WorkStealingScheduling(config, log)
    return None


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Frees each test module's compiled programs when the module is done.

    An xdist worker runs a thousand tests and compiles several thousand programs; kept alive by JAX's
    caches, a worker grew to ~6 GB and a late compile crashed inside XLA (SIGSEGV / SIGABRT in
    ``backend_compile_and_load``, at the same test in two runs of the same order; jax-ml/jax#27201
    reports XLA:CPU's JIT memory manager failing after many compiles). With the release a worker
    stayed near 2.4 GB and the next full runs passed. Programs shared inside a module stay compiled
    for the whole module.
    """
    yield
    jax.clear_caches()
