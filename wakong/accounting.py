"""Record accounting of a build: counts, drop reasons, events and mask statistics, mergeable.

A part manifest's ``counts`` and ``mask_stats`` are the :meth:`Accounting.state` of every
:class:`wakong.pipeline.Outcome` of the part; states of disjoint record ranges merge by addition
(:mod:`wakong.beam` tallies each shard in its own task and sums the states with a Beam combiner).
"""

from __future__ import annotations

from wakong import records
from wakong.infilling import SpanSpec
from wakong.report import MaskStats


class Accounting:
    """Sums :class:`wakong.pipeline.Outcome` s (``add``) and other tallies' states (``merge``)."""

    def __init__(self, spans: SpanSpec):
        from wakong.pipeline import DROP_REASONS  # the pipeline imports this module's users

        self.counts = {"records_in": 0, "records_written": 0, "examples": 0, "tokens": 0, "source_tokens": 0,
                       "records_dropped": dict.fromkeys(DROP_REASONS, 0), "events": {}}
        self.stats = MaskStats(spans)

    def add(self, outcome) -> None:
        """Counts one record's outcome: read once, then written (examples, tokens) or dropped (reason)."""
        c = self.counts
        c["records_in"] += 1
        if outcome.dropped is None:
            c["records_written"] += 1
        else:
            c["records_dropped"][outcome.dropped] += 1
        c["examples"] += len(outcome.records)
        c["tokens"] += outcome.tokens
        c["source_tokens"] += outcome.source_tokens
        for key, value in outcome.events.items():
            c["events"][key] = c["events"].get(key, 0) + value
        for n, scheme in outcome.schemes:
            self.stats.add(n, scheme)

    def merge(self, state: dict) -> "Accounting":
        """Adds another tally's :meth:`state` (of other records)."""
        records._add_counts(self.counts, state["counts"])
        self.stats.merge(state["mask_stats"])
        return self

    def state(self) -> dict:
        """``{"counts": ..., "mask_stats": ...}`` as a part manifest holds them (JSON-able)."""
        events = dict(sorted(self.counts["events"].items()))
        return {"counts": {**self.counts, "events": events}, "mask_stats": self.stats.state()}
