"""POP consumption state (RocketMQ 5): pop positions and in-flight messages per group and queue.

Pure: no clock, no I/O. Times are wall-clock milliseconds passed in (`now_ms`), because the
state outlives a process: it is replicated to slaves and replayed by a new master.

Rules:
1. Per (group, topic, queue id) a `QueuePop` holds the pop position (`next_offset`, the next
   queue offset no pop has handed out) and the in-flight messages: handed out, not acknowledged,
   each with the pop time that names its receipt handle, the time it becomes visible again and
   how often this state delivered it.
2. `apply(event)` is the only mutator and is deterministic; `decide_*` read. The broker decides,
   stores the event in the replicated metadata log (`metalog.py`), then applies it, so slaves and
   a restarted or new master rebuild the same state by applying the same events.
3. An ack or a change of invisible time names the pop time of the delivery it answers: a handle
   of an earlier delivery of the same message is stale and changes nothing. Every pop of a
   queue names a later pop time than any pop or change of it before (`pop_time`), so a handle
   of a delivery before a reset (rule 6) never names a delivery after it.
4. An unordered message whose invisible time ran out is revived by the broker (copied to the POP
   retry topic with its reconsume times + 1, or to the DLQ past the group's limit) and then
   acknowledged here. An orderly queue keeps its expired messages in flight and delivers them
   again, in queue order, before anything newer; it is blocked while any of its messages is
   invisible, so one popper at a time holds it.
5. The group's committed consumer offset is the lowest in-flight offset, or the pop position
   when nothing is in flight (`committed_offset`): a pull consumer of the same group continues
   from there (RocketMQ shares one offset table between pull and pop).
6. An admin offset reset (`Reset`) moves the pop position to the reset offset, backwards too,
   and drops what is in flight in that queue (RocketMQ's `resetPopOffset` clears the queue's
   order block and buffered checkpoints): its handles are stale from then on. An offset
   committed offline (UPDATE_CONSUMER_OFFSET) that differs from rule 5's is a reset too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec

__all__ = [
    "Acked",
    "Changed",
    "InFlight",
    "PopEvent",
    "PopState",
    "Popped",
    "QueueKey",
    "QueuePop",
    "Reset",
]

QueueKey = tuple[str, str, int]
"""(group, topic, queue id)."""


class InFlight(msgspec.Struct, array_like=True, frozen=True):
    """One message handed out and not acknowledged."""

    pop_time_ms: int
    invisible_until_ms: int
    attempt: int
    """Deliveries by this state: 1 on the first pop; orderly redeliveries add one each."""


class QueuePop(msgspec.Struct):
    """A group's POP progress in one queue."""

    next_offset: int
    inflight: dict[int, InFlight] = msgspec.field(default_factory=dict)
    orderly: bool = False
    last_pop_ms: int = 0
    """The latest pop time a pop or change of this queue named (rule 3)."""


class Popped(msgspec.Struct, tag="popped"):
    """A pop handed out `offsets` (in flight until `invisible_until_ms`) and moved on."""

    group: str
    topic: str
    queue_id: int
    offsets: list[int]
    pop_time_ms: int
    invisible_until_ms: int
    next_offset: int
    orderly: bool = False


class Acked(msgspec.Struct, tag="acked"):
    """Messages acknowledged (or revived into the retry topic or the DLQ): out of flight."""

    group: str
    topic: str
    queue_id: int
    offsets: list[int]


class Changed(msgspec.Struct, tag="changed"):
    """A message's invisible time changed; its receipt handle now names `pop_time_ms`."""

    group: str
    topic: str
    queue_id: int
    queue_offset: int
    pop_time_ms: int
    invisible_until_ms: int


class Reset(msgspec.Struct, tag="reset"):
    """An admin reset the group's offset in a queue: pop from `next_offset`, nothing in flight."""

    group: str
    topic: str
    queue_id: int
    next_offset: int


PopEvent = Popped | Acked | Changed | Reset

SnapshotEntry = tuple[str, str, int, QueuePop]


class PopState:
    """Every group's POP progress on this broker."""

    def __init__(self) -> None:
        self.queues: dict[QueueKey, QueuePop] = {}
        self.listener: Callable[[PopEvent], None] | None = None
        """Hears every applied event (a master's metadata log writes it)."""
        self.reviving: set[tuple[QueueKey, int]] = set()
        """(key, offset) whose revive copy is being stored (a master's, not replicated): no ack,
        change or orderly redelivery takes them meanwhile, or the copy would deliver again what
        was just acknowledged (the reviver takes them out of flight once the copy is stored)."""
        self.polling: dict[tuple[str, str, int], int] = {}
        """(topic, group, queue id asked for) -> pops waiting for messages now (a master's, not
        replicated): what POLLING_INFO answers."""

    # ------------------------------------------------------------------ reads

    def position(self, key: QueueKey) -> int | None:
        """The pop position of a queue, None when never popped."""
        queue = self.queues.get(key)
        return None if queue is None else queue.next_offset

    def is_blocked(self, key: QueueKey, now_ms: int) -> bool:
        """Orderly: whether the queue has a message still invisible (rule 4)."""
        queue = self.queues.get(key)
        return queue is not None and any(
            f.invisible_until_ms > now_ms for f in queue.inflight.values()
        )

    def redeliveries(self, key: QueueKey, now_ms: int) -> list[int]:
        """Orderly: the in-flight offsets visible again, in queue order.

        Not within the millisecond of their last delivery: a new delivery's receipt handle must
        name another pop time than the last one's (rule 3).
        """
        queue = self.queues.get(key)
        if queue is None:
            return []
        reviving = self.reviving
        return sorted(
            o
            for o, f in queue.inflight.items()
            if f.invisible_until_ms <= now_ms
            and f.pop_time_ms < now_ms
            and (not reviving or (key, o) not in reviving)
        )

    def pop_time(self, keys: list[QueueKey], now_ms: int) -> int:
        """The pop time for a pop of `keys` now: later than any they named before (rule 3)."""
        queues = self.queues
        for key in keys:
            queue = queues.get(key)
            if queue is not None and queue.last_pop_ms >= now_ms:
                now_ms = queue.last_pop_ms + 1
        return now_ms

    def attempt(self, key: QueueKey, queue_offset: int) -> int:
        """How often this state delivered an in-flight message (0 if not in flight)."""
        queue = self.queues.get(key)
        found = queue.inflight.get(queue_offset) if queue else None
        return 0 if found is None else found.attempt

    def committed_offset(self, key: QueueKey) -> int | None:
        """The group's consumer offset in this queue as POP sees it (rule 5)."""
        queue = self.queues.get(key)
        if queue is None:
            return None
        return min(queue.inflight, default=queue.next_offset)

    def expired(self, now_ms: int) -> Iterator[tuple[QueueKey, int, InFlight, bool]]:
        """(key, offset, in-flight record, orderly) of every message visible again."""
        for key, queue in self.queues.items():
            for queue_offset, found in queue.inflight.items():
                if found.invisible_until_ms <= now_ms:
                    yield key, queue_offset, found, queue.orderly

    def next_expiry_ms(self) -> int | None:
        """The earliest invisible-until of an unordered in-flight message."""
        return min(
            (
                f.invisible_until_ms
                for q in self.queues.values()
                if not q.orderly
                for f in q.inflight.values()
            ),
            default=None,
        )

    def has_topic(self, group: str, topic: str) -> bool:
        """Whether the group popped any queue of the topic here."""
        return any(g == group and t == topic for g, t, _ in self.queues)

    def in_flight_count(self, key: QueueKey) -> int:
        """Messages of a queue in flight."""
        queue = self.queues.get(key)
        return 0 if queue is None else len(queue.inflight)

    # ------------------------------------------------------------------ decisions

    def decide_ack(self, key: QueueKey, offsets: list[tuple[int, int]]) -> Acked | None:
        """Acknowledge (queue offset, pop time) pairs; stale or unknown ones are left out.

        None when none of them is in flight under that pop time (rule 3), or being revived.
        """
        queue = self.queues.get(key)
        if queue is None:
            return None
        reviving = self.reviving
        hits = [
            o
            for o, t in offsets
            if (f := queue.inflight.get(o)) is not None
            and f.pop_time_ms == t
            and (not reviving or (key, o) not in reviving)
        ]
        return Acked(*key, sorted(set(hits))) if hits else None

    def decide_change(
        self, key: QueueKey, queue_offset: int, pop_time_ms: int, now_ms: int, invisible_ms: int
    ) -> Changed | None:
        """Make a message invisible for `invisible_ms` from now; None when the handle is stale."""
        queue = self.queues.get(key)
        found = queue.inflight.get(queue_offset) if queue else None
        if (
            found is None
            or found.pop_time_ms != pop_time_ms
            or (key, queue_offset) in self.reviving
        ):
            return None
        # a new handle must differ from the old one, even within the same millisecond
        new_pop_time = max(now_ms, pop_time_ms + 1)
        return Changed(*key, queue_offset, new_pop_time, new_pop_time + invisible_ms)

    # ------------------------------------------------------------------ the mutator

    def apply(self, event: PopEvent) -> None:
        """Apply one decided event (the only mutator; deterministic)."""
        key = (event.group, event.topic, event.queue_id)
        if isinstance(event, Popped):
            queue = self.queues.get(key)
            if queue is None:
                queue = self.queues[key] = QueuePop(event.next_offset)
            for queue_offset in event.offsets:
                before = queue.inflight.get(queue_offset)
                queue.inflight[queue_offset] = InFlight(
                    event.pop_time_ms,
                    event.invisible_until_ms,
                    1 if before is None else before.attempt + 1,
                )
            queue.next_offset = max(queue.next_offset, event.next_offset)
            queue.orderly = event.orderly
            queue.last_pop_ms = max(queue.last_pop_ms, event.pop_time_ms)
        elif isinstance(event, Acked):
            queue = self.queues.get(key)
            if queue is not None:
                for queue_offset in event.offsets:
                    queue.inflight.pop(queue_offset, None)
        elif isinstance(event, Reset):
            queue = self.queues.get(key)
            if queue is not None:
                queue.inflight.clear()
                queue.next_offset = event.next_offset
        else:
            queue = self.queues.get(key)
            found = queue.inflight.get(event.queue_offset) if queue else None
            if queue is not None and found is not None:
                queue.inflight[event.queue_offset] = InFlight(
                    event.pop_time_ms, event.invisible_until_ms, found.attempt
                )
                queue.last_pop_ms = max(queue.last_pop_ms, event.pop_time_ms)
        if self.listener is not None:
            self.listener(event)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> list[SnapshotEntry]:
        """Every queue's progress (for the metadata log's snapshot)."""
        return [
            (g, t, q, QueuePop(p.next_offset, dict(p.inflight), p.orderly, p.last_pop_ms))
            for (g, t, q), p in self.queues.items()
        ]

    def replace_all(self, entries: list[SnapshotEntry]) -> None:
        """Take a snapshot's progress whole (a slave applying the master's snapshot)."""
        self.queues = {
            (g, t, q): QueuePop(p.next_offset, dict(p.inflight), p.orderly, p.last_pop_ms)
            for g, t, q, p in entries
        }

    def forget_topic(self, topic: str) -> None:
        """A deleted topic: its progress goes (not logged: the topic delete record is)."""
        for key in [k for k in self.queues if k[1] == topic]:
            del self.queues[key]

    def forget_group(self, group: str) -> None:
        """A deleted subscription group: its progress in every queue goes, in flight or not.

        Its POP retry topic's too. Not logged: the group delete record is. A group created
        again pops from its committed offset, or as its `initMode` says.
        """
        for key in [k for k in self.queues if k[0] == group]:
            del self.queues[key]
