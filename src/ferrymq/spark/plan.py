"""Offsets and read ranges, as pure functions: what a micro-batch or a batch read covers.

- Offsets are `{"topic": {"partition": next queue offset}}`. Spark compares the JSON text of
  offsets, so `offsets_json` always orders topics by name and partitions by number (a changing
  key order makes Spark run empty micro-batches forever).
- `cap_rows` applies `maxOffsetsPerTrigger`, split over queues in proportion to their backlog
  (Kafka's `rateLimit`: a queue whose share rounds below one still advances by one).
- `split_ranges` cuts the ranges into about `minPartitions` pieces, largest first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Offsets", "QueueRange", "cap_rows", "offsets_json", "parse_offsets", "split_ranges"]

Offsets = dict[str, dict[int, int]]
"""topic -> partition -> queue offset."""


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Queue offsets `[start, end)` of one queue: the unit a Spark task reads."""

    topic: str
    partition: int
    broker_name: str
    queue_id: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """Messages in the range (before retention took any)."""
        return max(0, self.end - self.start)


def offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """Offsets in a stable JSON shape: sorted topics, partitions in numeric order, str keys."""
    return {
        topic: {str(p): int(offsets[topic][p]) for p in sorted(offsets[topic])}
        for topic in sorted(offsets)
    }


def parse_offsets(data: Mapping[str, Mapping[str, int]]) -> Offsets:
    """Offsets from their JSON shape (what Spark hands back from its checkpoint)."""
    return {topic: {int(p): int(o) for p, o in queues.items()} for topic, queues in data.items()}


def cap_rows(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """`end`, lowered so that about `max_rows` messages lie between `start` and it."""
    lags = {
        (topic, p): end[topic][p] - start.get(topic, {}).get(p, 0)
        for topic in end
        for p in end[topic]
    }
    total = sum(lag for lag in lags.values() if lag > 0)
    if total <= max_rows:
        return {topic: dict(queues) for topic, queues in end.items()}
    capped: Offsets = {}
    for (topic, p), lag in lags.items():
        begin = start.get(topic, {}).get(p, 0)
        if lag <= 0:
            capped.setdefault(topic, {})[p] = end[topic][p]
            continue
        share = max_rows * lag / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        capped.setdefault(topic, {})[p] = min(begin + step, end[topic][p])
    return capped


def split_ranges(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Ranges cut so there are at least `min_partitions` of them (when messages allow)."""
    ranges = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    result: list[QueueRange] = []
    for r in ranges:
        pieces = max(1, min(r.size, round(min_partitions * r.size / total)))
        step = math.ceil(r.size / pieces)
        result += [
            QueueRange(r.topic, r.partition, r.broker_name, r.queue_id, s, min(s + step, r.end))
            for s in range(r.start, r.end, step)
        ]
    return result
