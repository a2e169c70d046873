"""Multi-host start-up and small host-side collectives, shared by every command line of the project.

Every CLI calls :func:`initialize` (through :func:`add_arguments` / :func:`from_args`) before anything
touches JAX. What it does depends on the settings, taken from the arguments first, then from the
environment:

=========================================  ==========================================================
nothing set                                single process; JAX is not touched
``JAXSAMPLE_DISTRIBUTED=1``                ``jax.distributed.initialize()``: JAX detects the cluster
(``--distributed``; what tpu_scripts set)  (Cloud TPU pods, Slurm, Open MPI)
coordinator + process count + process id   ``jax.distributed.initialize(...)`` with exactly these
(``--coordinator``, ``--num-processes``,   (any other cluster; ``JAXSAMPLE_COORDINATOR``,
``--process-id``)                          ``JAXSAMPLE_NUM_PROCESSES``, ``JAXSAMPLE_PROCESS_ID``)
=========================================  ==========================================================

``JAXSAMPLE_LOCAL_DEVICE_IDS`` / ``--local-device-ids`` (``0,1``) restrict the devices of a process in
either distributed mode. Partial explicit settings (say a coordinator without a process id) or settings
with ``JAXSAMPLE_DISTRIBUTED=0`` raise ``ValueError``; a second call that contradicts the first, or a
runtime that cannot start, :class:`DistributedError`, naming what is wrong. A second call with
compatible settings returns the same :class:`ProcessInfo`. (JAX must not have computed anything
before: importing ``jaxsample`` or ``wakong`` never starts a JAX backend.)

The collectives move small host data (manifests, statuses, a tokenizer) between processes through
``jax.experimental.multihost_utils`` and are no-ops for one process: :func:`barrier`,
:func:`allgather_bytes`, :func:`gather_bytes`, :func:`broadcast_bytes`, and :func:`together`, a block
that ends at a barrier which fails on every process if the block failed on any (so one host's error
never leaves the others waiting).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from typing import Iterator, Mapping, Sequence

import numpy as np

ENV_DISTRIBUTED = "JAXSAMPLE_DISTRIBUTED"
ENV_COORDINATOR = "JAXSAMPLE_COORDINATOR"
ENV_NUM_PROCESSES = "JAXSAMPLE_NUM_PROCESSES"
ENV_PROCESS_ID = "JAXSAMPLE_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "JAXSAMPLE_LOCAL_DEVICE_IDS"

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


class DistributedError(RuntimeError):
    """Another process of the job failed, or the processes disagree on what they are doing."""


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """This process in the job: ``index`` in ``[0, count)``; ``distributed``: JAX's runtime is up."""

    index: int = 0
    count: int = 1
    distributed: bool = False

    @property
    def is_main(self) -> bool:
        return self.index == 0


def _flag(environ: Mapping[str, str]) -> bool | None:
    raw = environ.get(ENV_DISTRIBUTED)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"{ENV_DISTRIBUTED} must be 0 or 1, got {raw!r}")
    return value in _TRUE


def _int(value, name: str, lo: int) -> int:
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str) and text.lstrip("-").isdigit():
        text = int(text)
    if isinstance(text, bool) or not isinstance(text, int) or text < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return text


def _coordinator(value, name: str) -> str:
    host, sep, port = str(value).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{name} must look like HOST:PORT (e.g. 10.0.0.1:1234), got {value!r}")
    return f"{host}:{port}"


def _device_ids(value, name: str) -> list[int]:
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        ids = [_int(i, name, 0) for i in items]
    except ValueError:
        ids = []
    if not ids:
        raise ValueError(f"{name} must be device ids like 0,1,2, got {value!r}")
    return ids


_ENV = {  # setting -> its variable
    "coordinator": ENV_COORDINATOR,
    "num_processes": ENV_NUM_PROCESSES,
    "process_id": ENV_PROCESS_ID,
    "local_device_ids": ENV_LOCAL_DEVICE_IDS,
}
_EXPLICIT = ("coordinator", "num_processes", "process_id")
_PARSE = {
    "coordinator": _coordinator,
    "num_processes": lambda value, name: _int(value, name, 1),
    "process_id": lambda value, name: _int(value, name, 0),
    "local_device_ids": _device_ids,
}


def _resolve(
    coordinator=None,
    num_processes=None,
    process_id=None,
    local_device_ids=None,
    *,
    distributed: bool | None = None,
    environ: Mapping[str, str] = os.environ,
) -> tuple[bool, dict]:
    """``(initialise?, jax.distributed.initialize kwargs)``: arguments first, then ``environ``."""
    flag = distributed if distributed is not None else _flag(environ)
    values = dict(coordinator=coordinator, num_processes=num_processes, process_id=process_id)
    values["local_device_ids"] = local_device_ids
    given, where = {}, {}  # setting -> parsed value, and the argument or variable it came from
    for key, value in values.items():
        name = key
        if value is None:
            value, name = environ.get(_ENV[key]), _ENV[key]
        if value is not None and not (isinstance(value, str) and not value.strip()):
            given[key], where[key] = _PARSE[key](value, name), name
    if flag is False and given:
        names = ", ".join(where.values())
        raise ValueError(f"distributed settings ({names}) given with {ENV_DISTRIBUTED}=0 or distributed=False")
    explicit = [key for key in _EXPLICIT if key in given]
    if 0 < len(explicit) < len(_EXPLICIT):
        missing = ", ".join(f"{key} ({_ENV[key]})" for key in _EXPLICIT if key not in given)
        raise ValueError(
            f"incomplete distributed settings: missing {missing}; give coordinator, num_processes and "
            f"process_id together, or none of them with {ENV_DISTRIBUTED}=1 to let JAX detect the cluster "
            "(Cloud TPU, Slurm, Open MPI)"
        )
    if explicit and given["process_id"] >= given["num_processes"]:
        count, index = given["num_processes"], given["process_id"]
        raise ValueError(f"process_id must be in [0, num_processes={count}), got {index}")
    if "local_device_ids" in given and not explicit and not flag:
        raise ValueError(
            f"local_device_ids only apply to a distributed run (set {ENV_DISTRIBUTED}=1 or a coordinator)"
        )
    if explicit:
        given = {"coordinator_address": given.pop("coordinator"), **given}
    return bool(explicit or flag), given


def _jax_distributed() -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized()


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | str | None = None,
    *,
    distributed: bool | None = None,
    environ: Mapping[str, str] | None = None,
) -> ProcessInfo:
    """Starts JAX's distributed runtime when the settings ask for it (see the module docstring).

    Args:
      coordinator: ``HOST:PORT`` of process 0's coordination service (else ``JAXSAMPLE_COORDINATOR``).
      num_processes: processes in the job (else ``JAXSAMPLE_NUM_PROCESSES``).
      process_id: this process's index (else ``JAXSAMPLE_PROCESS_ID``).
      local_device_ids: devices this process uses (else ``JAXSAMPLE_LOCAL_DEVICE_IDS``).
      distributed: ``True``: initialise, auto-detecting what is not given; ``False``: never;
        ``None``: ``JAXSAMPLE_DISTRIBUTED``, or initialise when explicit settings are given.
      environ: where the ``JAXSAMPLE_*`` variables are read (default ``os.environ``).

    Returns:
      This process's :class:`ProcessInfo`. Without distributed settings it is ``ProcessInfo(0, 1)``
      and JAX is not touched, unless JAX's runtime was already started by the caller.

    Raises:
      ValueError: partial, malformed or contradictory settings.
      DistributedError: JAX's runtime could not start (e.g. the coordinator is unreachable, or JAX
        computed something before this call), or already runs with other settings.
    """
    enabled, want = _resolve(
        coordinator,
        num_processes,
        process_id,
        local_device_ids,
        distributed=distributed,
        environ=os.environ if environ is None else environ,
    )
    if not enabled and not _jax_distributed():
        return ProcessInfo()
    import jax

    if not jax.distributed.is_initialized():
        try:
            jax.distributed.initialize(**want)
        except Exception as err:  # unreachable coordinator, timeout, JAX already computing, ...
            how = ", ".join(f"{k}={v}" for k, v in want.items()) or "auto-detected settings"
            raise DistributedError(f"jax.distributed.initialize({how}) failed: {err}") from err
    info = ProcessInfo(jax.process_index(), jax.process_count(), True)
    if "num_processes" in want and (want["num_processes"], want["process_id"]) != (info.count, info.index):
        raise DistributedError(
            f"JAX's distributed runtime already runs as process {info.index} of {info.count}; "
            f"cannot initialise as process {want['process_id']} of {want['num_processes']}"
        )
    return info


def add_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Adds the start-up flags (``--distributed``, ``--coordinator``, ``--num-processes``, ...) to a CLI."""
    group = parser.add_argument_group(
        "multi-host",
        f"JAX distributed start-up (default: one process). Each flag falls back to its JAXSAMPLE_* "
        f"variable; tpu_scripts/launch.sh sets {ENV_DISTRIBUTED}=1.",
    )
    group.add_argument(
        "--distributed",
        action="store_true",
        default=None,
        help=f"start JAX's runtime, detecting the cluster: TPU pod, Slurm, Open MPI ({ENV_DISTRIBUTED})",
    )
    for flag, metavar, kind, what in (
        ("--coordinator", "HOST:PORT", str, "process 0's address"),
        ("--num-processes", "N", int, "processes in the job"),
        ("--process-id", "I", int, "this process, 0..N-1"),
        ("--local-device-ids", "IDS", str, "this process's devices, e.g. 0,1"),
    ):
        env = _ENV[flag[2:].replace("-", "_")]
        group.add_argument(flag, type=kind, metavar=metavar, help=f"{what} ({env})")
    return group


def from_args(args: argparse.Namespace) -> ProcessInfo:
    """:func:`initialize` with the flags of :func:`add_arguments`."""
    settings = (args.coordinator, args.num_processes, args.process_id, args.local_device_ids)
    return initialize(*settings, distributed=args.distributed)


def current() -> ProcessInfo:
    """This process as JAX sees it (starts JAX's backend: call :func:`initialize` first)."""
    import jax

    return ProcessInfo(jax.process_index(), jax.process_count(), jax.distributed.is_initialized())


def process_index() -> int:
    """``jax.process_index()`` (starts JAX's backend: call :func:`initialize` first)."""
    import jax

    return jax.process_index()


def process_count() -> int:
    """``jax.process_count()`` (starts JAX's backend: call :func:`initialize` first)."""
    import jax

    return jax.process_count()


def is_main() -> bool:
    """Whether this is process 0, the one that writes shared results."""
    return process_index() == 0


def barrier(name: str) -> None:
    """Waits until every process reached ``barrier(name)`` (the same name everywhere)."""
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _words(data: bytes, size: int) -> np.ndarray:
    """``data`` zero-padded to ``size`` bytes (a multiple of 4) as int32 words (safe on every backend)."""
    return np.frombuffer(bytes(data).ljust(size, b"\0"), "<i4").astype(np.int32)


def _padded(n: int) -> int:
    """Buffer size for ``n`` bytes: a power of two (>= 64), so that few shapes are ever compiled."""
    return 1 << max(6, (n - 1).bit_length())


def allgather_bytes(data: bytes) -> list[bytes]:
    """Every process's ``data``, in process order, on every process (meant for small data).

    >>> allgather_bytes(b"part 0")
    [b'part 0']
    """
    if process_count() == 1:
        return [bytes(data)]
    from jax.experimental import multihost_utils

    if len(data) >= 2**31:
        raise ValueError(f"allgather_bytes is for small data, got {len(data):,} bytes")
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([len(data)], np.int32))).reshape(-1)
    size = _padded(int(sizes.max()))
    rows = np.asarray(multihost_utils.process_allgather(_words(data, size)))
    return [rows[k].astype("<i4").tobytes()[: int(n)] for k, n in enumerate(sizes)]


def gather_bytes(data: bytes) -> list[bytes] | None:
    """Every process's ``data`` on process 0 (in process order); ``None`` on the others."""
    gathered = allgather_bytes(data)
    return gathered if process_index() == 0 else None


def broadcast_bytes(data: bytes | None) -> bytes:
    """Process 0's ``data`` on every process (the others' argument is ignored)."""
    if process_count() == 1:
        return bytes(data or b"")
    from jax.experimental import multihost_utils

    main = process_index() == 0
    n = int(multihost_utils.broadcast_one_to_all(np.asarray([len(data) if main else 0], np.int32))[0])
    words = multihost_utils.broadcast_one_to_all(_words(data if main else b"", _padded(n)))
    return np.asarray(words).astype("<i4").tobytes()[:n]


@contextlib.contextmanager
def together(name: str) -> Iterator[None]:
    """Runs the block on every process, then agrees: all go on, or all raise.

    The block's own exception is re-raised on its process; every other process raises
    :class:`DistributedError` naming the failed process and its error. Processes that reach
    ``together`` blocks of different names also raise it. ``KeyboardInterrupt`` is not exchanged.
    """
    try:
        yield
    except Exception as err:
        _agree(name, f"{type(err).__name__}: {err}")
        raise
    _agree(name, None)


def _agree(name: str, error: str | None) -> None:
    if process_count() == 1:
        return
    status = name.encode() + b"\0" + (b"" if error is None else b"!" + error.encode())
    statuses = [s.partition(b"\0") for s in allgather_bytes(status)]
    names = {s[0] for s in statuses}
    if len(names) > 1:
        steps = ", ".join(f"process {k}: {s[0].decode()!r}" for k, s in enumerate(statuses))
        raise DistributedError(f"processes reached different steps ({steps})")
    if error is not None:
        return
    failed = [(k, s[2][1:].decode(errors="replace")) for k, s in enumerate(statuses) if s[2]]
    if failed:
        k, message = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise DistributedError(f"process {k} of {len(statuses)} failed in {name!r}{more}: {message}")


__all__ = [
    "DistributedError",
    "ENV_COORDINATOR",
    "ENV_DISTRIBUTED",
    "ENV_LOCAL_DEVICE_IDS",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ProcessInfo",
    "add_arguments",
    "allgather_bytes",
    "barrier",
    "broadcast_bytes",
    "current",
    "from_args",
    "gather_bytes",
    "initialize",
    "is_main",
    "process_count",
    "process_index",
    "together",
]
