"""Timer messages, delivered to their topic at the time they asked for (RocketMQ 5 timers).

`send.py` stores a message with a future delivery time (TIMER_DELIVER_MS, TIMER_DELAY_SEC,
TIMER_DELAY_MS) in queue 0 of `TIMER_TOPIC`, with the time as TIMER_OUT_MS and its real topic and
queue in properties. The commit log holds it, so it is flushed, replicated and recovered like any
message. This service, on a master, loads those messages into a heap ordered by delivery time and
stores each in its real topic when due (within one tick, `_TICK_S`).

Progress (`metadata.TimerProgress`, kept with the delay offsets, so it is saved and replicated the
same way) has three numbers, changed together in one loop turn:
1. `pending_floor_offset`: every message below it is delivered;
2. `scan_queue_offset`: every message below it has been loaded;
3. `delivered_ms`: of the loaded messages, every one due at or before it is delivered.
A master that starts (or is promoted) reloads from the floor and skips loaded messages due by
`delivered_ms`. Delivery comes before the progress record in the commit log, so a crash can
deliver a message twice (as RocketMQ's can), never zero times.

Unlike RocketMQ's on-disk timer wheel, pending messages are held in memory (about 100 bytes
each), and a message whose commit-log segment expires (`fileReservedTime`) before its time is
lost, as in RocketMQ.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from typing import Final

from ferrymq.broker.forward import Forwarder, deliver_elsewhere
from ferrymq.broker.metadata import TIMER_TOPIC, TimerProgress
from ferrymq.broker.send import put_messages
from ferrymq.broker.state import BrokerState
from ferrymq.errors import CorruptRecordError, FerryError, RequestError
from ferrymq.store.store import GetStatus
from ferrymq.wire import properties as props
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import BatchItem, decode_record

__all__ = ["TimerService"]

log = logging.getLogger(__name__)

_TICK_S: Final = 0.1
_SCAN_BATCH: Final = 256
_SCAN_MAX_PER_TICK: Final = 16_384
"""Records loaded per tick, so a large backlog does not hold the loop for long."""
_DELIVER_MAX_PER_TICK: Final = 4096
_TIMER_PROPERTIES: Final = (
    props.TIMER_OUT_MS,
    props.TIMER_DELIVER_MS,
    props.TIMER_DELAY_SEC,
    props.TIMER_DELAY_MS,
    props.REAL_TOPIC,
    props.REAL_QUEUE_ID,
    props.PROPERTY_CRC32,
)


class TimerService:
    """Moves due timer messages from the timer topic to their topics."""

    def __init__(self, state: BrokerState, forwarder: Forwarder | None = None) -> None:
        self._state = state
        self._forwarder = forwarder
        self._failing_since: dict[int, float] = {}
        """Log offset -> when its delivery first found no open queue on the group."""
        self._loaded = False
        self._due: list[tuple[int, int, int]] = []
        """Heap of (deliver_ms, queue_offset, log_offset) of loaded, undelivered messages."""
        self._pending: list[int] = []
        """Heap of queue offsets of loaded messages, delivered ones removed lazily."""
        self._delivered: set[int] = set()
        self._scan_offset = 0
        self._saved_scan_offset = -1
        self._delivered_ms = 0
        self._skip_below = 0
        self._skip_due_by_ms = 0
        """Loaded by an earlier master: below `_skip_below`, due by this, already delivered."""
        self.delivered = 0

    @property
    def pending(self) -> int:
        """Loaded messages waiting for their time."""
        return len(self._due)

    async def run(self) -> None:
        """Deliver due messages while this broker is a master, forever."""
        while True:
            if self._state.is_master:
                try:
                    await self.deliver_due()
                except FerryError as exc:
                    log.error("timer delivery failed, retrying: %s", exc)
            else:
                self._loaded = False  # reload from the replicated progress when promoted
            await asyncio.sleep(_TICK_S)

    def _start(self) -> None:
        progress = self._state.delay_offsets.timer
        self._due.clear()
        self._pending.clear()
        self._delivered.clear()
        self._scan_offset = progress.pending_floor_offset
        self._saved_scan_offset = progress.scan_queue_offset
        self._delivered_ms = progress.delivered_ms
        self._skip_below = progress.scan_queue_offset
        self._skip_due_by_ms = progress.delivered_ms
        self._loaded = True
        log.info(
            "timer messages resume at queue offset %d (delivered up to %d ms)",
            self._scan_offset,
            self._delivered_ms,
        )

    async def deliver_due(self) -> int:
        """Load new timer messages, deliver the due ones; returns how many were delivered."""
        if not self._loaded:
            self._start()
        state = self._state
        now_ms = state.wall_ms()
        self._scan()
        delivered = 0
        due = self._due
        try:
            while due and due[0][0] <= now_ms and delivered < _DELIVER_MAX_PER_TICK:
                _, queue_offset, log_offset = due[0]
                await self._deliver(log_offset)
                heapq.heappop(due)
                self._delivered.add(queue_offset)
                delivered += 1
        finally:
            # every loaded message due before the first one still waiting is delivered
            self._delivered_ms = now_ms if not due or due[0][0] > now_ms else due[0][0] - 1
            if delivered or self._scan_offset != self._saved_scan_offset:
                # only a change is logged: an idle master writes no progress record per tick
                self._save_progress()
            self.delivered += delivered
        return delivered

    def _scan(self) -> None:
        state = self._state
        offset = self._scan_offset
        loaded = 0
        while loaded < _SCAN_MAX_PER_TICK:
            result = state.store.get(TIMER_TOPIC, 0, offset, _SCAN_BATCH)
            if result.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
                log.warning(
                    "timer messages at queue offsets %d..%d expired before their time",
                    offset,
                    result.next_queue_offset,
                )
                offset = result.next_queue_offset
                continue
            if not result.records:
                if result.next_queue_offset > offset:
                    offset = result.next_queue_offset
                    continue
                break
            for queue_offset, raw in zip(result.queue_offsets, result.records, strict=True):
                record = decode_record(raw)
                text = record.properties.get(props.TIMER_OUT_MS, "")
                deliver_ms = int(text) if text.isdigit() else 0
                if queue_offset < self._skip_below and deliver_ms <= self._skip_due_by_ms:
                    continue  # delivered before this master took over
                heapq.heappush(self._due, (deliver_ms, queue_offset, record.log_offset))
                heapq.heappush(self._pending, queue_offset)
                loaded += 1
            offset = result.next_queue_offset
        self._scan_offset = offset

    async def _deliver(self, log_offset: int) -> None:
        state = self._state
        try:
            record = decode_record(state.store.read_record(log_offset))
        except CorruptRecordError as exc:
            log.error("timer message at %d is unreadable; dropped: %s", log_offset, exc)
            return
        topic = record.properties.get(props.REAL_TOPIC)
        if topic is None:
            log.error("timer message at %d has no real topic; dropped", log_offset)
            return
        queue_text = record.properties.get(props.REAL_QUEUE_ID, "0")
        properties = {k: v for k, v in record.properties.items() if k not in _TIMER_PROPERTIES}
        # consumers may read when it was due (RocketMQ keeps TIMER_OUT_MS on delivered messages)
        properties[props.TIMER_OUT_MS] = record.properties.get(props.TIMER_OUT_MS, "0")
        queue_id = int(queue_text) if queue_text.isdigit() else 0
        item = BatchItem(record.body, encode_properties(properties), record.flag)
        try:
            await put_messages(
                state,
                topic,
                queue_id,
                [item],
                born_host=record.born_host,
                born_timestamp_ms=record.born_timestamp_ms,
                sys_flag=record.sys_flag,
                reconsume_times=record.reconsume_times,
                wait_flush=False,
            )
        except RequestError as exc:
            if exc.code == ResponseCode.NO_PERMISSION:  # moved off the group (forward.py)
                since = self._failing_since.setdefault(log_offset, state.clock())
                await deliver_elsewhere(
                    state,
                    self._forwarder,
                    topic,
                    queue_id,
                    item,
                    born_host=record.born_host,
                    born_timestamp_ms=record.born_timestamp_ms,
                    failing_since=since,
                )
                self._failing_since.clear()
                return
            if exc.code != ResponseCode.FENCED:
                raise
            # the topic became fenced while the message waited: only fenced sends write it
            log.error("timer message at %d for fenced topic %s dropped", log_offset, topic)

    def _save_progress(self) -> None:
        self._saved_scan_offset = self._scan_offset
        pending, delivered = self._pending, self._delivered
        while pending and pending[0] in delivered:
            delivered.discard(heapq.heappop(pending))
        floor = pending[0] if pending else self._scan_offset
        self._state.delay_offsets.set_timer(
            TimerProgress(floor, self._scan_offset, self._delivered_ms)
        )
