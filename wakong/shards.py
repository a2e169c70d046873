"""Building the shards of a part: in this process, or by worker processes that each build whole shards.

Shard ``k`` of a part holds a contiguous range of the part's records (:func:`shard_ranges`), made by
:func:`wakong.examples.make_outcomes` in batches of :data:`BATCH` records and written in record
order, so its bytes depend neither on the batch size nor on which process built it. With workers,
every worker writes its own shards (nothing funnels through one writer) and sends back only their
counts, mask statistics and file descriptions; the throughput grows with the worker count up to
``num_shards``.

Workers are fresh interpreters (``python -c``): they inherit no thread, lock or library state of the
calling process (ArrayRecord's and Arrow's thread pools do not survive a ``fork``), never re-run the
calling script (no ``if __name__ == "__main__"`` guard needed), import only this module's light
dependencies (no JAX, no grain), and receive the job pickled (the shipped sources pickle small: a text
source's record index is shared through a file). They ignore Ctrl-C, which the calling process
handles; a worker that fails sends its error back, and one that dies (killed, out of memory) fails the
build with an error naming its exit code, never a hang.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

from wakong import records
from wakong.accounting import Tally
from wakong.config import BuildConfig
from wakong.examples import Outcome, make_outcomes

#: Records per :func:`~wakong.examples.make_outcomes` call (the bytes written do not depend on it).
BATCH = 256


def shard_ranges(n_records: int, num_shards: int) -> list[range]:
    """The positions (in a part's record order) each shard holds: ``num_shards`` contiguous ranges.

    >>> shard_ranges(10, 4)
    [range(0, 3), range(3, 5), range(5, 8), range(8, 10)]
    """
    bounds = [-(-k * n_records // num_shards) for k in range(num_shards + 1)]
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def fill_shard(writer: records.ShardWriter, shard: int, source, config: BuildConfig, tokenizer,
               indices: Sequence[int], tally: Tally, progress: Callable[[list[Outcome]], None] | None = None) -> None:
    """Writes the outcomes of the records ``indices`` of ``source`` to ``shard`` of ``writer``, in record
    order, made in batches of :data:`BATCH`; adds them to ``tally`` and calls ``progress`` per batch."""
    for at in range(0, len(indices), BATCH):
        outcomes = make_outcomes(source, config, tokenizer, indices[at : at + BATCH])
        writer.write_many(shard, [data for outcome in outcomes for data in outcome.records])
        tally.add(outcomes)
        if progress is not None:
            progress(outcomes)


class ShardJob:
    """Builds shard ``k`` of a part (``job(k)``): writes it to ``staging`` and returns ``files`` (its
    description) and ``tally`` (a :class:`Tally` state); ``progress(outcomes)`` follows each batch."""

    def __init__(self, source, config: BuildConfig, tokenizer, staging: str, prefix: str, indices: range):
        self.source, self.config, self.tokenizer = source, config, tokenizer
        self.staging, self.prefix, self.indices = staging, prefix, indices
        self.progress: Callable[[list[Outcome]], None] | None = None

    def __call__(self, shard: int) -> dict:
        config, num_shards, tally = self.config, self.config.output.num_shards, Tally(self.config)
        positions = shard_ranges(len(self.indices), num_shards)[shard]
        with records.ShardWriter(self.staging, self.prefix, num_shards, shards=[shard]) as writer:
            indices = self.indices[positions.start : positions.stop]
            fill_shard(writer, shard, self.source, config, self.tokenizer, indices, tally, self.progress)
            files = writer.commit()
        result = {"files": files, "tally": tally.state()}
        write_summary(self.staging, shard, num_shards, result)
        return result


def _done_name(shard: int, num_shards: int) -> str:
    return f"done-shard-{shard:05d}-of-{num_shards:05d}.json"


def write_summary(directory: str, shard: int, num_shards: int, result: dict) -> str:
    """Writes the summary of a finished shard (``{"files": [its description], "tally": Tally state}``, what
    :func:`finished` reads back) into ``directory``, after the shard itself; returns its file name."""
    name = _done_name(shard, num_shards)
    records.write_json_atomic(os.path.join(directory, name), result)
    return name


def finished(staging: str, num_shards: int) -> dict[int, dict]:
    """The shards a killed build of the same part already finished in ``staging`` (their summaries,
    each checked against its file's size and sha256)."""
    done = {}
    for shard in range(num_shards):
        try:
            with open(os.path.join(staging, _done_name(shard, num_shards)), encoding="utf-8") as f:
                result = json.load(f)
            (file,) = result["files"]
            path = os.path.join(staging, file["file"])
            if os.path.getsize(path) == file["bytes"] and records.file_sha256(path) == file["sha256"]:
                done[shard] = result
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return done


def build_shards(job: ShardJob, workers: int, progress: Callable[[Outcome], None] | None = None,
                 halfway: Callable[[], None] | None = None, done: dict[int, dict] | None = None) -> list[dict]:
    """Every shard's summary, in shard order: built here (``workers == 0``) or by ``min(workers,
    shards to build)`` worker processes, except the shards ``done`` already holds. ``progress(outcome)``
    is called once per record built (without its serialised ``records`` when a worker made it);
    ``halfway()`` once, when half the part is done."""
    num_shards, done = job.config.output.num_shards, dict(done or {})
    todo = [k for k in range(num_shards) if k not in done]
    total = sum(len(r) for k, r in enumerate(shard_ranges(len(job.indices), num_shards)) if k in todo)
    built = 0

    def follow(outcomes) -> None:
        nonlocal built
        for outcome in outcomes:
            if progress is not None:
                progress(outcome)
        if built <= total // 2 < built + len(outcomes) and halfway is not None:
            halfway()
        built += len(outcomes)
        records.check_interrupt()

    if not workers:
        job.progress = follow
        done.update((k, job(k)) for k in todo)
    elif todo:
        done.update(_with_workers(job, todo, min(workers, len(todo)), follow))
    return [done[k] for k in range(num_shards)]


def _with_workers(job: ShardJob, todo: list[int], workers: int,
                  follow: Callable[[list[Outcome]], None]) -> dict[int, dict]:
    """Runs shards ``todo`` on ``workers`` fresh interpreters (``python -c``, :func:`_serve`): each gets
    the pickled job on its stdin, then shard numbers one at a time, and answers on a pipe of its own."""
    payload = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
    code = (f"import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import sys; sys.path[:0] = {sys.path!r}; "
            "from wakong.shards import _serve; _serve(int(sys.argv[1]))")
    messages: queue.Queue = queue.Queue()
    workers_ = []
    try:
        for _ in range(workers):
            read, write = os.pipe()
            process = subprocess.Popen([sys.executable, "-c", code, str(write)], stdin=subprocess.PIPE,
                                       pass_fds=(write,))
            os.close(write)
            answers = os.fdopen(read, "rb")
            threading.Thread(target=_relay, args=(answers, process, messages), daemon=True).start()
            process.stdin.write(payload)
            workers_.append(process)
        pending, results = list(todo), {}
        for process in workers_:
            _assign(process, pending)
        while len(results) < len(todo):
            process, kind, data = messages.get()
            if kind == "progress":
                follow(data)
            elif kind == "shard":
                results[data[0]] = data[1]
                _assign(process, pending)
            elif kind == "error":
                raise data
            else:
                raise RuntimeError(f"a build worker died (exit code {data}); nothing was committed")
        return results
    finally:
        for process in workers_:
            if process.poll() is None:
                process.kill()
            process.wait()


def _assign(process, pending: list[int]) -> None:
    """Sends the next shard (or the end) to a worker."""
    process.stdin.write(pickle.dumps(pending.pop(0) if pending else None))
    process.stdin.flush()


def _relay(answers, process, messages: queue.Queue) -> None:
    """Forwards a worker's answers; its death (end of its pipe before it finished) as ``("died", code)``."""
    with answers:
        while True:
            try:
                kind, data = pickle.load(answers)
            except (EOFError, pickle.UnpicklingError):
                break
            if kind == "done":
                return
            messages.put((process, kind, data))
            if kind == "error":
                return
    messages.put((process, "died", process.wait()))


def _serve(fd: int) -> None:
    """A worker: reads the job, then shard numbers from stdin until ``None``; answers on ``fd``. It
    exits as soon as the calling process is gone (killed), so no orphan keeps writing."""
    answers = os.fdopen(fd, "wb")
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True).start()

    def send(kind: str, data) -> None:
        pickle.dump((kind, data), answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()

    job = pickle.load(sys.stdin.buffer)
    job.progress = lambda outcomes: send("progress", [_summary(o) for o in outcomes])
    while (shard := pickle.load(sys.stdin.buffer)) is not None:
        try:
            send("shard", (shard, job(shard)))
        except Exception as err:  # sent back whole when it pickles (it names the file), else as text
            try:
                pickle.dumps(err)
            except Exception:
                err = RuntimeError(f"{type(err).__name__}: {err}")
            send("error", err)
            return
    send("done", None)


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def _summary(outcome: Outcome) -> Outcome:
    return Outcome(outcome.index, [], outcome.dropped, outcome.events, outcome.tokens, outcome.source_tokens)
