"""Record accounting of a build: counts, drop reasons, events and mask statistics, mergeable.

A part manifest's ``counts`` and ``mask_stats`` sum the :class:`wakong.examples.Outcome` s of the part.
Tallies of disjoint record ranges merge by addition, so every runner sums them the same way: the
in-process build per shard (:mod:`wakong.shards`, also in worker processes), the Beam runner per
shard task with a Beam combiner (:mod:`wakong.beam`).
"""

from __future__ import annotations

from wakong import records
from wakong.config import BuildConfig
from wakong.examples import DROP_REASONS, Outcome
from wakong.report import MaskStats


class Tally:
    """What a part's manifest sums over outcomes: ``counts``, drop reasons, events and mask statistics.

    ``add(outcomes)`` for made outcomes, ``merge(tally.state())`` for the tallies of other records
    (``state()`` is JSON-able and pickles small); ``manifest_counts()`` is the manifest's ``counts``
    entry and ``stats.state()`` its ``mask_stats``.
    """

    def __init__(self, config: BuildConfig):
        self.counts = {"records_in": 0, "records_written": 0, "examples": 0, "tokens": 0, "source_tokens": 0}
        self.dropped, self.events = dict.fromkeys(DROP_REASONS, 0), {}
        self.stats = MaskStats(config.noise.spans)

    def add(self, outcomes: list[Outcome]) -> None:
        counts = self.counts
        for outcome in outcomes:
            counts["records_in"] += 1
            if outcome.dropped is None:
                counts["records_written"] += 1
            else:
                self.dropped[outcome.dropped] += 1
            counts["examples"] += len(outcome.records)
            counts["tokens"] += outcome.tokens
            counts["source_tokens"] += outcome.source_tokens
            records.add_counts(self.events, outcome.events)
        drawn = [pair for outcome in outcomes for pair in outcome.schemes]
        self.stats.add_many([n for n, _ in drawn], [scheme for _, scheme in drawn])

    def state(self) -> dict:
        return {"counts": self.counts, "dropped": self.dropped, "events": self.events, "stats": self.stats.state()}

    def merge(self, state: dict) -> "Tally":
        records.add_counts(self.counts, state["counts"])
        records.add_counts(self.dropped, state["dropped"])
        records.add_counts(self.events, state["events"])
        self.stats.merge(state["stats"])
        return self

    def manifest_counts(self) -> dict:
        return {**self.counts, "records_dropped": self.dropped, "events": dict(sorted(self.events.items()))}
