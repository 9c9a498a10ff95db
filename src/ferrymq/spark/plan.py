"""Offsets, partition numbers and read ranges, as pure functions: what a micro-batch covers.

Rules:
1. A queue is named by (broker group name, queue id), `QueueKey`, in every offset the source
   stores or reads, never by its position in a route: a route changes (queues added, a group
   leaving while all its replicas are down, a group returning, a queue count shrinking), a
   queue's name does not.
2. Checkpoint offsets are `{"topic": {"broker-a": {"0": 12, "1": 5}, "broker-b": {"0": 7}}}`
   (the next queue offset to read). Spark compares the JSON text of offsets, so `offsets_json`
   orders topics and brokers by name and queue ids by number (a changing key order makes Spark
   run empty micro-batches forever).
3. The `partition` column is `stable_partition(broker, queue id)`: `group_code(broker) << 10 |
   queue id`, a pure function of the queue's name (queue ids are below 1024, a broker's limit),
   always >= 1024 and a non-negative int32. Two groups of one topic with one code fail the
   planning (`PartitionCollisionError`); they are never merged.
4. Ranges come from the offsets alone (`plan_ranges`): every queue whose end is above its start
   is read, whether or not its group is in the route at that moment (the read then waits for it,
   and fails the query retryably if it stays away). A queue of the end but not of the start (new
   in this batch) is read from EARLIEST only when the read starts there (`from_earliest`); else
   it joins from the next batch on.
5. `next_offsets` keeps the offsets of queues absent from the route now; queues new in the route
   join at their min offset; `cap_rows` applies `maxOffsetsPerTrigger`, split over queues in
   proportion to their backlog (Kafka's `rateLimit`: a share below one still advances by one).
6. Checkpoints of the old positional layout (`{"topic": {"3": 100}}`) are read only when they
   map unambiguously (`parse_offsets`, `LegacyOffsets`), or refused with `LegacyOffsetsError`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from ferrymq.errors import FerryError

__all__ = [
    "EARLIEST",
    "LATEST",
    "MAX_QUEUES_PER_GROUP",
    "Bounds",
    "LegacyOffsets",
    "LegacyOffsetsError",
    "Offsets",
    "PartitionCollisionError",
    "QueueKey",
    "QueueRange",
    "cap_rows",
    "check_group_codes",
    "group_code",
    "highs",
    "is_stable_partition",
    "legacy_topics",
    "next_offsets",
    "offsets_json",
    "parse_offsets",
    "partition_queue",
    "plan_ranges",
    "split_ranges",
    "stable_partition",
]

EARLIEST: Final = -2
LATEST: Final = -1
"""Kafka's sentinels for a starting or ending offset."""

MAX_QUEUES_PER_GROUP: Final = 1024
"""A broker takes queue numbers 1..1024 (`broker.admin`): queue ids fit in 10 bits."""

_QUEUE_BITS: Final = 10
_GROUP_CODES: Final = 2**21 - 1
"""Codes are 1.._GROUP_CODES, so `code << 10 | queue id` is >= 1024 and below 2**31."""


@dataclass(frozen=True, slots=True, order=True)
class QueueKey:
    """A queue of a topic, by name: its broker group and its queue id there."""

    broker_name: str
    queue_id: int


Offsets = dict[str, dict[QueueKey, int]]
"""topic -> queue -> queue offset."""

Bounds = dict[str, dict[QueueKey, tuple[int, int]]]
"""topic -> routed queue -> (min offset, max offset), as the brokers said at one moment."""


class PartitionCollisionError(FerryError):
    """Two broker groups of one topic have one group code: their partition numbers would clash."""

    def __init__(self, topic: str, first: str, second: str, code: int) -> None:
        super().__init__(
            f"topic {topic}: broker groups {first!r} and {second!r} have the same group code "
            f"{code}, so their stable partition numbers would be the same; rename one group"
        )
        self.topic = topic
        self.groups = (first, second)
        self.code = code


class LegacyOffsetsError(FerryError):
    """Checkpoint offsets of the old positional layout that cannot be mapped safely."""

    def __init__(self, topic: str, positions: Mapping[int, int], why: str) -> None:
        layout = "{" + ", ".join(f'"{p}": {o}' for p, o in sorted(positions.items())) + "}"
        super().__init__(
            f"the checkpoint holds offsets of topic {topic} in the old positional layout "
            f"({layout}: a partition was the queue's position in the topic's route, which a "
            f"route change shifts); they cannot be mapped to queues safely: {why}. Start a new "
            "checkpoint with explicit startingOffsets in the new form "
            f'({{"{topic}": {{"broker-a": {{"0": 12}}}}}}), or set the option '
            "legacyOffsets=currentRoute to map positions by the topic's current route, if it "
            "has not changed since the checkpoint was written"
        )
        self.topic = topic
        self.why = why


class LegacyOffsets(StrEnum):
    """How checkpoint offsets of the old positional layout are read (option `legacyOffsets`)."""

    AUTO = "auto"
    """Only when unambiguous: the topic's route has one broker group whose queue ids are
    exactly the old positions 0..n-1; otherwise refused."""
    CURRENT_ROUTE = "currentRoute"
    """Position i is the i-th readable queue of the current route (broker name, then queue id):
    the user asserts the route has not changed since the checkpoint was written."""


# ---------------------------------------------------------------- partition numbers


def group_code(broker_name: str) -> int:
    """A broker group's code, 1..2**21-1: CRC-32 of its UTF-8 name, never 0."""
    return zlib.crc32(broker_name.encode()) % _GROUP_CODES + 1


def stable_partition(broker_name: str, queue_id: int) -> int:
    """The `partition` number of a queue: `group_code << 10 | queue_id` (>= 1024, an int32)."""
    if not 0 <= queue_id < MAX_QUEUES_PER_GROUP:
        raise ValueError(f"queue id {queue_id} is not in 0..{MAX_QUEUES_PER_GROUP - 1}")
    return group_code(broker_name) << _QUEUE_BITS | queue_id


def is_stable_partition(partition: int) -> bool:
    """Whether a partition number is a stable one (else a position, below 1024)."""
    return MAX_QUEUES_PER_GROUP <= partition < 2**31


def partition_queue(partition: int) -> tuple[int, int]:
    """The (group code, queue id) a stable partition number names."""
    if not is_stable_partition(partition):
        raise ValueError(f"{partition} is not a stable partition number (1024..2**31-1)")
    return partition >> _QUEUE_BITS, partition & (MAX_QUEUES_PER_GROUP - 1)


def check_group_codes(topic: str, broker_names: Iterable[str]) -> None:
    """Raise `PartitionCollisionError` if two of a topic's groups share a group code."""
    seen: dict[int, str] = {}
    for name in sorted(set(broker_names)):
        code = group_code(name)
        if code in seen:
            raise PartitionCollisionError(topic, seen[code], name, code)
        seen[code] = name


# ---------------------------------------------------------------- offsets JSON


def offsets_json(offsets: Mapping[str, Mapping[QueueKey, int]]) -> dict[str, Any]:
    """Offsets in their stable JSON shape: topics and brokers by name, queue ids by number."""
    result: dict[str, Any] = {}
    for topic in sorted(offsets):
        queues = offsets[topic]
        brokers: dict[str, dict[str, int]] = {}
        for key in sorted(queues):
            brokers.setdefault(key.broker_name, {})[str(key.queue_id)] = int(queues[key])
        result[topic] = brokers
    return result


def _is_int(value: object) -> bool:
    return type(value) is int


def legacy_topics(data: Mapping[str, Any]) -> list[str]:
    """The topics of checkpoint offsets in the old positional layout (`{"3": 100}`)."""
    return sorted(
        topic
        for topic, queues in data.items()
        if isinstance(queues, Mapping) and queues and all(map(_is_int, queues.values()))
    )


def _new_form(topic: str, brokers: Mapping[str, Any]) -> dict[QueueKey, int]:
    parsed: dict[QueueKey, int] = {}
    for broker, queues in brokers.items():
        if not isinstance(queues, Mapping):
            raise ValueError(f"offsets of topic {topic}, broker {broker}: not an object")
        for queue_id, offset in queues.items():
            if not str(queue_id).isdecimal() or not _is_int(offset):
                raise ValueError(f"offsets of topic {topic}/{broker}/{queue_id}: not integers")
            parsed[QueueKey(broker, int(queue_id))] = offset
    return parsed


def _positions(topic: str, queues: Mapping[str, Any]) -> dict[int, int]:
    positions: dict[int, int] = {}
    for position, offset in queues.items():
        if not str(position).isdecimal():
            raise ValueError(f"offsets of topic {topic}: {position!r} is not a partition")
        positions[int(position)] = offset
    return positions


def _map_legacy(
    topic: str, positions: dict[int, int], route: Sequence[QueueKey] | None, mode: LegacyOffsets
) -> dict[QueueKey, int]:
    """Old positions as queues (the rules of `LegacyOffsets`), or `LegacyOffsetsError`."""
    if route is None or not route:
        raise LegacyOffsetsError(topic, positions, "the topic has no route now")
    ordered = sorted(route)
    if mode is LegacyOffsets.CURRENT_ROUTE:
        beyond = [p for p in positions if p >= len(ordered)]
        if beyond:
            why = f"the current route has {len(ordered)} queues; position {beyond[0]} is not one"
            raise LegacyOffsetsError(topic, positions, why)
        return {ordered[p]: offset for p, offset in positions.items()}
    groups = sorted({key.broker_name for key in ordered})
    if len(groups) != 1:
        why = (
            f"the topic's current route has {len(groups)} broker groups ({', '.join(groups)}), "
            "and a position does not say which group's queue it was"
        )
        raise LegacyOffsetsError(topic, positions, why)
    ids = sorted(key.queue_id for key in ordered)
    if sorted(positions) != ids or ids != list(range(len(ids))):
        why = (
            f"the old partitions 0..{max(positions)} are not exactly the queue ids of "
            f"{groups[0]} now (0..{len(ids) - 1}), so the topic's queues changed since"
        )
        raise LegacyOffsetsError(topic, positions, why)
    return {QueueKey(groups[0], p): offset for p, offset in positions.items()}


def parse_offsets(
    data: Mapping[str, Any],
    routes: Mapping[str, Sequence[QueueKey]] | None = None,
    mode: LegacyOffsets = LegacyOffsets.AUTO,
) -> Offsets:
    """Offsets from their JSON shape (what Spark hands back from its checkpoint).

    A topic in the old positional layout (`legacy_topics`) is mapped by its current readable
    queues in `routes` under `mode`.

    Raises:
        LegacyOffsetsError: old offsets that cannot be mapped safely.
        ValueError: JSON of neither shape.
    """
    legacy = set(legacy_topics(data))
    offsets: Offsets = {}
    for topic, queues in data.items():
        if not isinstance(queues, Mapping):
            raise ValueError(f"offsets of topic {topic}: not an object")
        if topic in legacy:
            route = (routes or {}).get(topic)
            offsets[topic] = _map_legacy(topic, _positions(topic, queues), route, mode)
        else:
            offsets[topic] = _new_form(topic, queues)
    return offsets


# ---------------------------------------------------------------- ranges


@dataclass(frozen=True, slots=True)
class QueueRange:
    """Queue offsets `[start, end)` of one queue: the unit a Spark task reads.

    `start` is EARLIEST for a queue read from its min offset at read time (rule 4).
    """

    topic: str
    partition: int
    """The stable partition number (`stable_partition`)."""
    broker_name: str
    queue_id: int
    start: int
    end: int

    @property
    def key(self) -> QueueKey:
        """The queue's name."""
        return QueueKey(self.broker_name, self.queue_id)

    @property
    def size(self) -> int:
        """Messages in the range at most (before retention took any)."""
        return max(0, self.end - max(self.start, 0))


def plan_ranges(start: Offsets, end: Offsets, *, from_earliest: bool) -> list[QueueRange]:
    """Every queue whose offset in `end` is above its offset in `start`, in (topic, queue) order.

    A queue of `end` absent from `start` starts at EARLIEST when `from_earliest` (the read's
    start; Spark asks `initialOffset` again when it replays batch 0, and a route changed since
    may miss queues the first answer had), else it has no range in this batch.

    Raises:
        PartitionCollisionError: two groups of a topic share a group code.
    """
    ranges: list[QueueRange] = []
    for topic in sorted(end):
        check_group_codes(topic, (key.broker_name for key in end[topic]))
        for key in sorted(end[topic]):
            stop = end[topic][key]
            begin = start.get(topic, {}).get(key)
            if begin is None:
                begin = EARLIEST if from_earliest else stop
            if stop > max(begin, 0):
                partition = stable_partition(key.broker_name, key.queue_id)
                ranges.append(
                    QueueRange(topic, partition, key.broker_name, key.queue_id, begin, stop)
                )
    return ranges


def highs(bounds: Bounds) -> Offsets:
    """Every queue's max offset: the end of an AvailableNow run."""
    return {topic: {key: b[1] for key, b in queues.items()} for topic, queues in bounds.items()}


def next_offsets(
    start: Offsets, bounds: Bounds, target: Offsets | None
) -> tuple[Offsets, list[tuple[str, QueueKey, int]]]:
    """Where the next micro-batch ends (before `cap_rows`), and the queues that joined.

    A queue of `start` absent from `bounds` (its group left the route, or the topic has fewer
    queues now) keeps its offset. A queue new in `bounds` joins at its min offset. The others
    advance to their max offset, or only to `target`'s (AvailableNow; a queue not in `target`
    stays).
    """
    end: Offsets = {topic: dict(queues) for topic, queues in start.items()}
    joined: list[tuple[str, QueueKey, int]] = []
    for topic in sorted(bounds):
        known = start.get(topic, {})
        for key, (low, high) in sorted(bounds[topic].items()):
            begin = known.get(key)
            if begin is None:
                end.setdefault(topic, {})[key] = low
                joined.append((topic, key, low))
                continue
            if target is not None:
                high = min(high, target.get(topic, {}).get(key, begin))
            end[topic][key] = max(begin, high)
    return end, joined


def cap_rows(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """`end`, lowered so that about `max_rows` messages lie between `start` and it.

    Queues absent from `start` (joining now) keep their `end`: they are not read in this batch.
    """
    lags = {
        (topic, key): end[topic][key] - start[topic][key]
        for topic in end
        for key in end[topic]
        if key in start.get(topic, {})
    }
    total = sum(lag for lag in lags.values() if lag > 0)
    capped: Offsets = {topic: dict(queues) for topic, queues in end.items()}
    if total <= max_rows:
        return capped
    for (topic, key), lag in lags.items():
        if lag <= 0:
            continue
        share = max_rows * lag / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        capped[topic][key] = min(start[topic][key] + step, end[topic][key])
    return capped


def split_ranges(ranges: list[QueueRange], min_partitions: int | None) -> list[QueueRange]:
    """Ranges cut so there are at least `min_partitions` of them (when messages allow).

    A range from EARLIEST (its start known only at read time) is never cut.
    """
    ranges = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    result: list[QueueRange] = []
    for r in ranges:
        if r.start < 0:
            result.append(r)
            continue
        pieces = max(1, min(r.size, round(min_partitions * r.size / total)))
        step = math.ceil(r.size / pieces)
        result += [
            QueueRange(r.topic, r.partition, r.broker_name, r.queue_id, s, min(s + step, r.end))
            for s in range(r.start, r.end, step)
        ]
    return result
