"""Logical queues: a topic's queues mapped to physical queues across broker groups.

Issue 20 section 4 (seed 003 section 7: partition reassignment), after RocketMQ 5's static
topics (RIP-21: a logic queue is a list of `LogicQueueMappingItem`s, physical queues each
holding a range of its offsets; the newest is written, the older ones are read to their end).

A topic's **logical queues** are named as they always were: (broker group, queue id), the
group that first held the queue. While a queue never moved it is exactly that physical queue.
A moved queue is a list of **segments**, each a physical queue (group, queue id) holding the
logical queue's offsets [start, end); the last one is open (end -1) and takes the writes, the
older ones are read-only. ferrymq differs from RIP-21 in one point that removes every offset
translation: a segment's physical queue *starts at its logical start offset* (a moved queue's
new physical queue begins at the offset where the old one ended, as a queue whose first
entries retention deleted), so a queue offset means the same message in every segment, for
every client, in every broker request (pull, offsets, commits), and in every stored record.
Offsets of a logical queue keep growing across a move, without a hole.

Where the map travels (the controller decides it, `controller/topics.py`):
- in each group's `TopicConfig` as the attribute `ferry.queueMap` (the JSON of `QueueMap`),
  only for topics with a moved or moving queue: brokers act on it (`broker/queuemap.py`), slaves
  get it with the topic table, masters register it;
- in routes as `logicalQueues` (the newest a group registered), for ferrymq's clients. Clients
  that know nothing of it (the official 4.x client) see physical queues: the old segment
  read-only, the new one as a queue of its group whose offsets start where the old one ended.

Rules:
1. Segments are contiguous: a segment's start is its predecessor's end. A closed segment's
   physical queue never takes a message again (sealed); only the open one does.
2. A queue being moved (`moving`) keeps its open segment until the move finishes; its source
   group's master stops writing to it as soon as its topic table reflects `since_version`.
3. A segment's physical queue id on its group is unique within the topic on that group, never
   reused while the map names it: a moved queue gets the next id above every physical queue of
   the topic on the target group.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import msgspec

from ferrymq.errors import ProtocolError

__all__ = [
    "QUEUE_MAP_ATTRIBUTE",
    "LogicalQueue",
    "QueueMap",
    "QueueMove",
    "QueueSegment",
    "decode_queue_map",
    "encode_queue_map",
]

QUEUE_MAP_ATTRIBUTE: Final = "ferry.queueMap"
"""The TopicConfig attribute holding a topic's `QueueMap` (set by the controller only)."""

OPEN: Final = -1
"""The end offset of the open (last, writable) segment."""


class QueueSegment(msgspec.Struct, array_like=True, frozen=True):
    """`[brokerName, queueId, startOffset, endOffset]`: one physical queue of a logical queue."""

    broker_name: str
    queue_id: int
    start_offset: int
    end_offset: int = OPEN

    @property
    def is_open(self) -> bool:
        """Whether this is the writable segment."""
        return self.end_offset == OPEN

    @property
    def physical(self) -> tuple[str, int]:
        """(broker group, queue id) of the physical queue."""
        return self.broker_name, self.queue_id


class QueueMove(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A move in progress: where the queue goes, and the topic version that started it."""

    broker_name: str
    queue_id: int
    since_version: int


class LogicalQueue(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A logical queue: its name, its segments (oldest first) and the move in progress."""

    broker_name: str
    queue_id: int
    segments: tuple[QueueSegment, ...]
    moving: QueueMove | None = None

    @classmethod
    def identity(cls, broker_name: str, queue_id: int) -> LogicalQueue:
        """A queue that never moved: its own physical queue, from offset 0."""
        return cls(
            broker_name=broker_name,
            queue_id=queue_id,
            segments=(QueueSegment(broker_name, queue_id, 0),),
        )

    @property
    def name(self) -> tuple[str, int]:
        """(group, queue id): the queue's name."""
        return self.broker_name, self.queue_id

    @property
    def current(self) -> QueueSegment:
        """The open segment (the last one)."""
        return self.segments[-1]

    def segment_at(self, queue_offset: int) -> QueueSegment:
        """The segment holding `queue_offset` (the first one for offsets below every start)."""
        for segment in reversed(self.segments):
            if segment.start_offset <= queue_offset:
                return segment
        return self.segments[0]

    def next_after(self, segment: QueueSegment) -> QueueSegment | None:
        """The segment that follows `segment`, if any."""
        for i, known in enumerate(self.segments[:-1]):
            if known.physical == segment.physical:
                return self.segments[i + 1]
        return None


class QueueMap(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A topic's logical queues: names per group (`placement`) and the moved ones (`queues`).

    `placement` is the controller's: group -> (read, write) queue counts, the logical queues
    (group, 0..read-1), writable below `write`. A logical queue absent from `queues` never
    moved.
    """

    version: int
    placement: dict[str, tuple[int, int]]
    queues: tuple[LogicalQueue, ...] = ()

    def moved(self) -> dict[tuple[str, int], LogicalQueue]:
        """The moved (or moving) logical queues by name."""
        return {q.name: q for q in self.queues}

    def is_name(self, broker_name: str, queue_id: int) -> bool:
        """Whether (group, queue id) names a logical queue of the topic."""
        counts = self.placement.get(broker_name)
        return counts is not None and 0 <= queue_id < counts[0]

    def is_writable_name(self, broker_name: str, queue_id: int) -> bool:
        """Whether the logical queue takes writes by the placement's write count."""
        counts = self.placement.get(broker_name)
        return counts is not None and 0 <= queue_id < counts[1]

    def logical(self, broker_name: str, queue_id: int) -> LogicalQueue | None:
        """The logical queue of that name (None: not a name of the topic)."""
        for queue in self.queues:
            if queue.name == (broker_name, queue_id):
                return queue
        if self.is_name(broker_name, queue_id):
            return LogicalQueue.identity(broker_name, queue_id)
        return None

    def logical_queues(self) -> Iterator[LogicalQueue]:
        """Every logical queue, by group name then queue id."""
        moved = self.moved()
        for broker_name, (read, _) in sorted(self.placement.items()):
            for queue_id in range(read):
                yield moved.get((broker_name, queue_id)) or LogicalQueue.identity(
                    broker_name, queue_id
                )

    def physical_ids(self, broker_name: str, *, moving_targets: bool = False) -> set[int]:
        """Physical queue ids of the topic on a group: its never-moved queues and segments.

        With `moving_targets`, also the ids moves in progress will open there (rule 3).
        """
        moved = self.moved()
        read = self.placement.get(broker_name, (0, 0))[0]
        ids = {q for q in range(read) if (broker_name, q) not in moved}
        for queue in self.queues:
            ids.update(s.queue_id for s in queue.segments if s.broker_name == broker_name)
            move = queue.moving
            if moving_targets and move is not None and move.broker_name == broker_name:
                ids.add(move.queue_id)
        return ids

    def physical_count(self, broker_name: str) -> int:
        """How many queue ids the group's TopicConfig must offer (0: the topic is not there)."""
        ids = self.physical_ids(broker_name)
        return max(ids) + 1 if ids else 0

    def next_physical_id(self, broker_name: str) -> int:
        """The queue id a queue moved to the group gets (rule 3)."""
        ids = self.physical_ids(broker_name, moving_targets=True)
        read = self.placement.get(broker_name, (0, 0))[0]
        return max([read - 1, *ids]) + 1

    def owner(self, broker_name: str, queue_id: int) -> tuple[LogicalQueue, QueueSegment] | None:
        """The logical queue a physical queue holds offsets of, and its segment there.

        None for an id the topic does not use on the group. A logical queue's own physical
        queue whose segment was forgotten (`ForgetSegmentsEvent`) still belongs to it, with a
        closed empty segment.
        """
        for queue in self.queues:
            for segment in queue.segments:
                if segment.physical == (broker_name, queue_id):
                    return queue, segment
        named = self.logical(broker_name, queue_id)
        if named is None:
            return None
        if named.segments[0].physical == (broker_name, queue_id):
            return named, named.segments[0]
        first = named.segments[0].start_offset
        return named, QueueSegment(broker_name, queue_id, first, first)

    def is_sealed(self, broker_name: str, queue_id: int) -> bool:
        """Whether the physical queue takes no more messages (rules 1 and 2)."""
        found = self.owner(broker_name, queue_id)
        if found is None:
            return False
        queue, segment = found
        return not segment.is_open or queue.moving is not None

    def hosted_starts(self, broker_name: str) -> dict[int, int]:
        """Physical queue id -> start offset of the segments on a group that do not start at 0."""
        return {
            s.queue_id: s.start_offset
            for queue in self.queues
            for s in queue.segments
            if s.broker_name == broker_name and s.start_offset > 0
        }


_encoder: Final = msgspec.json.Encoder(order="deterministic")
_decoder: Final = msgspec.json.Decoder(QueueMap)


def encode_queue_map(queue_map: QueueMap) -> str:
    """The attribute text of a map (deterministic)."""
    return _encoder.encode(queue_map).decode()


def decode_queue_map(text: str | bytes) -> QueueMap:
    """Parse a map.

    Raises:
        ProtocolError: the text is not a queue map.
    """
    try:
        return _decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"queue map: {exc}") from None
