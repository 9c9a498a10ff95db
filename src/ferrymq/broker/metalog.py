"""Broker metadata through the replicated commit log: the master writes, slaves apply.

ARCHITECTURE.md section 6 item 5 (RocketMQ polls the master's tables every 10 s instead, and a
failover loses what changed since; reference section 9 item 6). Every change of a master's
topic, subscription-group, consumer-offset or delay-offset table (with the timer progress)
becomes a JSON record of the system topic `METADATA_TOPIC` (one queue). Slaves replicate it
like any record, so it is committed and visible under the same confirm offset, and
`MetadataFollower` applies each record to the slave's tables in log order. Offset changes of one
loop turn share one record. A full snapshot is written when a master starts and every
`snapshot_interval`, so a slave that starts after old segments expired still gets every table
whole.

A topic deleted on the master (a TopicChange to None, or missing from a snapshot) also loses its
consume queues on the slave, so a topic created again under the same name starts from queue
offset 0 on every replica. Records are applied again at every start, from the last snapshot
(`MetadataFollower.from_last_snapshot`; the oldest record kept when the log holds none): a queue
is dropped only if none of its entries lies after the delete record in the log and it holds no
record waiting above the confirm offset, so replaying an old delete never drops a later
incarnation of the topic. Offsets follow the master's own offset records. In controller mode
the table's controller topic version (`TopicTable.controller_version`) travels too. POP
consumption events (`pop.py`: pops, acks, changes of invisible time) travel as `PopChanges`, in
the order the master applied them, and its whole state in every snapshot. ACL 2.0 users and
ACLs travel as `AuthChange` events (`security/acl2.py`), and every user and ACL in snapshots.

Snapshots bound what a start replays (issue 21: every POP ack is a record). Besides the one at
master start and the periodic one, the master writes one once `SNAPSHOT_MIN_RECORDS` records and
`SNAPSHOT_BYTES_FACTOR` times the last snapshot's size were appended since it: a start then
applies at most about that many records after it, and snapshots cost at most 1 /
`SNAPSHOT_BYTES_FACTOR` of the log's metadata bytes. A snapshot record carries the tag
`SNAPSHOT_TAG`, so a start finds the last one from its consume-queue entries alone, walking
back from the end; pending changes are written before a snapshot, so no event applied before
it is applied again after it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import msgspec

from ferrymq.broker.metadata import METADATA_TOPIC, GroupConfig, TimerProgress
from ferrymq.broker.pop import PopEvent, QueuePop
from ferrymq.broker.state import BrokerState
from ferrymq.errors import FerryError
from ferrymq.security.acl2 import (
    Acl2Error,
    Event,
    auth_events,
    event_from_json,
    event_to_json,
    replay,
)
from ferrymq.store.store import GetStatus
from ferrymq.wire.bodies import TopicConfig
from ferrymq.wire.properties import TAGS
from ferrymq.wire.records import BatchItem, decode_record, pack_host, tags_hash

__all__ = [
    "SNAPSHOT_BYTES_FACTOR",
    "SNAPSHOT_MIN_RECORDS",
    "SNAPSHOT_TAG",
    "MetadataFollower",
    "MetadataLog",
]

log = logging.getLogger(__name__)

_BORN: Final = pack_host("127.0.0.1", 0)


class TopicChange(msgspec.Struct, tag="topic"):
    """A topic created or replaced (config) or deleted (None)."""

    topic: str
    config: TopicConfig | None


class TopicVersionChange(msgspec.Struct, tag="topicVersion"):
    """Controller mode: the controller topic version the master's topic table now reflects."""

    version: int


class GroupChange(msgspec.Struct, tag="group"):
    """A subscription group created or replaced (config) or deleted (None)."""

    group: str
    config: GroupConfig | None


class OffsetChanges(msgspec.Struct, tag="offsets"):
    """Consumer offsets: (`topic@group`, queue id, offset); offset -1 deletes."""

    changes: list[tuple[str, int, int]]


class DelayChanges(msgspec.Struct, tag="delay"):
    """Delay-level delivery offsets: (level, offset)."""

    changes: list[tuple[int, int]]


class TimerChange(msgspec.Struct, tag="timer"):
    """The timer messages' delivery progress."""

    progress: TimerProgress


class PopChanges(msgspec.Struct, tag="pop"):
    """POP consumption events, in the order the master applied them, then offset changes.

    The offsets of the same loop turn ride along (as in `OffsetChanges`): every POP ack moves
    the group's offset, and one record instead of two halves what a start replays.
    """

    events: list[PopEvent]
    offsets: list[tuple[str, int, int]] = []


class AuthChange(msgspec.Struct, tag="auth"):
    """An ACL 2.0 event (`acl2.event_to_json`): a user or an ACL put or deleted."""

    event: dict[str, Any]


class Snapshot(msgspec.Struct, tag="snapshot"):
    """Every table whole."""

    topics: dict[str, TopicConfig]
    groups: dict[str, GroupConfig]
    offsets: dict[str, dict[int, int]]
    delay_offsets: dict[int, int]
    timer_progress: TimerProgress | None = None
    controller_topic_version: int | None = None
    pop: list[tuple[str, str, int, QueuePop]] | None = None
    auth: list[dict[str, Any]] | None = None
    """Every user and ACL as put events (None: a snapshot of before ACL 2.0)."""


Change = (
    TopicChange
    | TopicVersionChange
    | GroupChange
    | OffsetChanges
    | DelayChanges
    | TimerChange
    | PopChanges
    | AuthChange
    | Snapshot
)

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Change).decode

SNAPSHOT_TAG: Final = "snapshot"
"""The tag of snapshot records (their consume-queue entries carry its hash code)."""
SNAPSHOT_MIN_RECORDS: Final = 256
"""A snapshot is due after at least this many records since the last one (module doc)..."""
SNAPSHOT_BYTES_FACTOR: Final = 4
"""... and at least this many times the last snapshot's bytes."""
_SNAPSHOT_CODE: Final = tags_hash(SNAPSHOT_TAG)
_SCAN_CHUNK: Final = 1024


_RETRY_S = 1.0
_EVENT_ENCODER: Final = msgspec.json.Encoder()
"""Measures POP events for `PopChanges` records of at most half a message."""
_EVENT_BYTES_MAX: Final = 4096
"""More than one POP event's JSON can be (names of <= 255 characters, <= 32 offsets)."""


class MetadataLog:
    """A master's writer: attach it to the tables, and every change is appended to the log."""

    def __init__(self, state: BrokerState, *, snapshot_interval: float = 600.0) -> None:
        self._state = state
        self.snapshot_interval = snapshot_interval
        self._offsets: dict[tuple[str, int], int] = {}
        self._delays: dict[int, int] = {}
        self._timer: TimerProgress | None = None
        self._pop: list[PopEvent] = []
        self._flush_scheduled = False
        self._last_end = 0
        self._snapshot_scheduled = False
        self._detached = False
        self._snapshot_bytes = 0
        self._since_records = 0
        self._since_bytes = 0
        self.snapshots = 0
        """Snapshots this writer appended."""
        state.topics.listener = self._topic_changed
        state.topics.version_listener = self._topic_version_changed
        state.groups.listener = self._group_changed
        state.offsets.listener = self._offset_changed
        state.delay_offsets.listener = self._delay_changed
        state.delay_offsets.timer_listener = self._timer_changed
        state.pop.listener = self._pop_changed
        state.auth.listener = self._auth_changed

    def snapshot(self) -> None:
        """Append every table whole, after the changes still pending.

        Skipped while the disk refuses pending changes: they would come after it in the log, and
        a POP pop applied twice counts a delivery twice (the periodic or next due one follows).
        """
        self._snapshot_scheduled = False
        if self._detached:  # a due snapshot after this broker stopped being the master
            return
        if self._flush_scheduled:
            self._flush()
        if self._offsets or self._delays or self._timer is not None or self._pop:
            return
        state = self._state
        self._append(
            Snapshot(
                dict(state.topics.configs),
                dict(state.groups.configs),
                {key: dict(queues) for key, queues in state.offsets.offsets.items()},
                dict(state.delay_offsets.offsets),
                state.delay_offsets.timer,
                state.topics.controller_version,
                state.pop.snapshot(),
                [event_to_json(e) for e in auth_events(state.auth.state)],
            )
        )

    def detach(self) -> None:
        """Stop logging changes (this broker is no longer the master)."""
        state = self._state
        self._detached = True
        state.topics.listener = None
        state.topics.version_listener = None
        state.groups.listener = None
        state.offsets.listener = None
        state.delay_offsets.listener = None
        state.pop.listener = None
        state.auth.listener = None

    async def run(self) -> None:
        """Write a snapshot every `snapshot_interval`, forever."""
        while True:
            await asyncio.sleep(self.snapshot_interval)
            self.snapshot()

    def _topic_changed(self, topic: str, config: TopicConfig | None) -> None:
        if config is None:  # its POP progress and stats go with it, here as on every replay
            self._before_delete()
            _forget_topic(self._state, topic)
        self._append(TopicChange(topic, config))

    def _topic_version_changed(self, version: int) -> None:
        self._append(TopicVersionChange(version))

    def _auth_changed(self, event: Event) -> None:
        self._append(AuthChange(event_to_json(event)))

    def _group_changed(self, group: str, config: GroupConfig | None) -> None:
        if config is None:  # likewise
            self._before_delete()
            _forget_group(self._state, group)
        self._append(GroupChange(group, config))

    def _before_delete(self) -> None:
        """Write the pending changes first.

        A slave must not apply a POP event of a deleted topic or group after its delete (it
        would bring its state back).
        """
        if self._flush_scheduled:
            self._flush()

    def _offset_changed(self, key: str, queue_id: int, queue_offset: int) -> None:
        self._offsets[(key, queue_id)] = queue_offset
        self._schedule_flush()

    def _delay_changed(self, level: int, queue_offset: int) -> None:
        self._delays[level] = queue_offset
        self._schedule_flush()

    def _pop_changed(self, event: PopEvent) -> None:
        self._pop.append(event)
        self._schedule_flush()

    def _timer_changed(self, progress: TimerProgress) -> None:
        self._timer = progress
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        offsets, self._offsets = self._offsets, {}
        delays, self._delays = self._delays, {}
        timer, self._timer = self._timer, None
        pop, self._pop = self._pop, []
        kept = True
        # POP events, and the offsets they moved after them (a slave applies them in this order),
        # in records the store takes: a turn's events (or a backlog the disk refused) can be
        # more than one message may be
        budget = max(self._state.store.config.max_message_bytes // 2, 1024)
        while pop:
            count = len(pop)
            if count * _EVENT_BYTES_MAX > budget:  # else they fit without measuring
                size, count = 0, 0
                for event in pop:
                    size += len(_EVENT_ENCODER.encode(event)) + 1
                    if count and size > budget:
                        break
                    count += 1
            chunk, rest = pop[:count], pop[count:]
            moved = [] if rest else [(k, q, o) for (k, q), o in offsets.items()]
            if not self._append(PopChanges(chunk, moved)):
                self._pop = pop + self._pop
                kept = False
                break
            pop = rest
            if not rest:
                offsets = {}
        if offsets and not self._append(
            OffsetChanges([(k, q, o) for (k, q), o in offsets.items()])
        ):
            self._offsets = {**offsets, **self._offsets}  # newer changes win
            kept = False
        if delays and not self._append(DelayChanges(list(delays.items()))):
            self._delays = {**delays, **self._delays}
            kept = False
        if timer is not None and not self._append(TimerChange(timer)):
            self._timer = timer  # none was queued meanwhile: _append ran synchronously
            kept = False
        if not kept:  # the disk refused: try again in a second, not in a tight loop
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(_RETRY_S, self._flush)

    def _append(self, change: Change) -> bool:
        state = self._state
        is_snapshot = isinstance(change, Snapshot)
        body = _encode(change)
        try:
            result = state.store.put(
                METADATA_TOPIC,
                0,
                [BatchItem.of(body, {TAGS: SNAPSHOT_TAG} if is_snapshot else None)],
                born_host=_BORN,
                born_timestamp_ms=state.wall_ms(),
            )
        except (FerryError, OSError) as exc:  # a full disk; slaves get it in a later snapshot
            log.error("could not log a metadata change (%s): %s", type(change).__name__, exc)
            return False
        self._last_end = result.end_log_offset
        if is_snapshot:
            self.snapshots += 1
            self._snapshot_bytes = len(body)
            self._since_records = self._since_bytes = 0
        else:
            self._since_records += 1
            self._since_bytes += len(body)
            if (
                not self._snapshot_scheduled
                and self._since_records >= SNAPSHOT_MIN_RECORDS
                and self._since_bytes >= SNAPSHOT_BYTES_FACTOR * self._snapshot_bytes
            ):
                self._snapshot_scheduled = True
                asyncio.get_running_loop().call_soon(self.snapshot)
        if state.replication is not None:
            state.replication.appended()
        state.schedule_dispatch()
        return True

    async def committed(self) -> bool:
        """Write pending changes now and wait until the SyncStateSet has them.

        False when they were not committed in `slaveTimeout` (or could not be written).
        """
        if self._flush_scheduled:
            self._flush()
            if self._offsets or self._delays or self._pop:
                return False  # the disk refused them; they are retried
        replication = self._state.replication
        if replication is None or not replication.config.sync:
            return True
        if replication.config.durable_only:  # SYNC_FLUSH: the master's own copy must be fsynced
            loop = asyncio.get_running_loop()

            def flushed(_: object) -> None:  # on the flusher thread
                if not loop.is_closed():
                    loop.call_soon_threadsafe(replication.appended)

            self._state.store.wait_flushed(self._last_end).add_done_callback(flushed)
        return await replication.wait_committed(self._last_end)


class MetadataFollower:
    """A slave's reader: applies the master's metadata records to this broker's tables."""

    def __init__(self, state: BrokerState, applied_queue_offset: int = 0) -> None:
        self._state = state
        self.applied_queue_offset = applied_queue_offset
        self.replayed = 0
        """Records applied (a start's replay cost: what follows the last snapshot)."""

    @classmethod
    def from_last_snapshot(cls, state: BrokerState) -> MetadataFollower:
        """A reader that starts at the last snapshot record this log holds (module doc).

        Every table is whole in a snapshot, so the records before it change nothing a start
        needs. Without one (a log of before snapshot tags) it starts at the oldest record.
        """
        store = state.store
        store.dispatch()
        queue = store.queues.find(METADATA_TOPIC, 0)
        if queue is None:
            return cls(state)
        end, low = queue.max_queue_offset, queue.min_queue_offset
        while end > low:
            start = max(low, end - _SCAN_CHUNK)
            entries = queue.entries(start, end - start)
            for entry in reversed(entries):
                if (
                    entry.tags_code == _SNAPSHOT_CODE
                    and entry.is_message
                    and _is_snapshot(store.get(METADATA_TOPIC, 0, entry.queue_offset, 1).records)
                ):
                    return cls(state, entry.queue_offset)
            end = start
        return cls(state, low)

    async def run(self) -> None:
        """Apply records as they become visible (committed), forever."""
        state = self._state
        while True:
            if not self.catch_up():
                await state.longpoll.wait(METADATA_TOPIC, 0, self.applied_queue_offset, 1.0)

    def catch_up(self) -> bool:
        """Apply up to 256 visible records now; returns whether there were any."""
        state = self._state
        result = state.store.get(METADATA_TOPIC, 0, self.applied_queue_offset, 256)
        if result.status is GetStatus.FOUND:
            for raw in result.records:
                record = decode_record(raw)
                self._apply(record.body, record.log_offset)
            self.replayed += len(result.records)
        self.applied_queue_offset = max(self.applied_queue_offset, result.next_queue_offset)
        return result.status is GetStatus.FOUND

    def apply_held(self) -> None:
        """Apply the records this log holds above its confirm offset too.

        When the log becomes the master's: a committed offset may be among them, acknowledged by
        the old master just before this replica heard the new watermark.
        """
        for raw in self._state.store.held_records(METADATA_TOPIC, 0):
            record = decode_record(raw)
            self._apply(record.body, record.log_offset)
            self.replayed += 1

    def _apply(self, body: bytes, log_offset: int) -> None:
        state = self._state
        try:
            change = _decode(body)
        except msgspec.ValidationError as exc:
            log.error("skipping a metadata record ferrymq cannot read: %s", exc)
            return
        if isinstance(change, TopicChange):
            if change.config is None:
                state.topics.delete(change.topic)
                _forget_topic(state, change.topic)
                self._drop_queues(change.topic, log_offset)
            else:
                state.topics.put(change.config)
        elif isinstance(change, TopicVersionChange):
            if change.version > state.topics.controller_version:
                state.topics.set_controller_version(change.version)
        elif isinstance(change, GroupChange):
            if change.config is None:
                state.groups.delete(change.group)
                _forget_group(state, change.group)
            else:
                state.groups.put(change.config)
        elif isinstance(change, OffsetChanges):
            for key, queue_id, queue_offset in change.changes:
                state.offsets.apply(key, queue_id, queue_offset)
        elif isinstance(change, DelayChanges):
            for level, queue_offset in change.changes:
                state.delay_offsets.set(level, queue_offset)
        elif isinstance(change, TimerChange):
            state.delay_offsets.set_timer(change.progress)
        elif isinstance(change, PopChanges):
            for event in change.events:
                state.pop.apply(event)
            for key, queue_id, queue_offset in change.offsets:
                state.offsets.apply(key, queue_id, queue_offset)
        elif isinstance(change, AuthChange):
            try:
                state.auth.apply(event_from_json(change.event))
            except Acl2Error as exc:
                log.error("skipping an auth record ferrymq cannot read: %s", exc)
        else:
            for topic in sorted(state.topics.configs.keys() - change.topics.keys()):
                self._drop_queues(topic, log_offset)
                state.stats.forget_topic(topic)
            for group in state.groups.configs.keys() - change.groups.keys():
                state.stats.forget_group(group)
            state.topics.replace_all(change.topics)
            version = change.controller_topic_version
            if version is not None and version > state.topics.controller_version:
                state.topics.set_controller_version(version)
            state.groups.replace_all(change.groups)
            state.offsets.replace_all(change.offsets)
            state.delay_offsets.replace_all(change.delay_offsets)
            if change.timer_progress is not None:
                state.delay_offsets.set_timer(change.timer_progress)
            if change.pop is not None:
                state.pop.replace_all(change.pop)
            if change.auth is not None:
                try:
                    events = [event_from_json(e) for e in change.auth]
                except Acl2Error as exc:
                    log.error("skipping the users and ACLs of a snapshot: %s", exc)
                else:
                    state.auth.replace_all(replay(events))

    def _drop_queues(self, topic: str, log_offset: int) -> None:
        """The master deleted `topic` at `log_offset`: drop its queues here too (module doc)."""
        store = self._state.store
        store.dispatch()
        queues = store.queues.queues_of(topic)
        if not queues or any(
            # an entry after the delete record, or records held above the confirm offset (so
            # after it too) that own the next queue offsets: a later incarnation, or a replay
            queue.max_log_offset > log_offset or queue.next_queue_offset > queue.max_queue_offset
            for queue in queues
        ):
            return
        self._state.fences.forget(topic)
        store.delete_topic(topic, log_offset)
        log.info("topic %s: queues dropped (deleted on the master)", topic)


def _is_snapshot(records: list[bytes]) -> bool:
    """Whether `records` is one snapshot record (a tag code may collide with another tag's)."""
    if len(records) != 1:
        return False
    try:
        return isinstance(_decode(decode_record(records[0]).body), Snapshot)
    except msgspec.DecodeError:
        return False


def _forget_topic(state: BrokerState, topic: str) -> None:
    """A deleted topic's POP progress and stats (RocketMQ's `deleteTopicInBroker`)."""
    state.pop.forget_topic(topic)
    state.stats.forget_topic(topic)


def _forget_group(state: BrokerState, group: str) -> None:
    """A deleted group's POP progress and stats (RocketMQ's `deleteSubscriptionGroup`)."""
    state.pop.forget_group(group)
    state.stats.forget_group(group)
