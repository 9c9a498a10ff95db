"""Delayed messages, delivered to their topic once their delay level has passed.

RocketMQ's `ScheduleMessageService`.
A message sent with a DELAY level is stored in SCHEDULE_TOPIC_XXXX, queue `level - 1`, with its
real topic and queue in properties. Every queue of that topic holds messages of one delay in
store order, so each is delivered strictly in order: the first message not yet due stops its
level. Delivery stores a copy in the real topic, then advances the level's offset, which is saved
to `delayOffset.json` with the consumer offsets; a crash between the two delivers a message twice,
never zero times.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from ferrymq.broker.forward import Forwarder, deliver_elsewhere
from ferrymq.broker.metadata import SCHEDULE_TOPIC
from ferrymq.broker.send import put_messages
from ferrymq.broker.state import BrokerState
from ferrymq.errors import FerryError, RequestError
from ferrymq.store.store import GetStatus
from ferrymq.wire import properties as props
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import BatchItem, MessageRecord, decode_record

__all__ = ["ScheduleService"]

log = logging.getLogger(__name__)

_TICK_S: Final = 0.1
_BATCH: Final = 64


class ScheduleService:
    """Moves due messages from the schedule topic to their topics."""

    def __init__(self, state: BrokerState, forwarder: Forwarder | None = None) -> None:
        self._state = state
        self._forwarder = forwarder
        self._failing_since: dict[int, float] = {}
        """Log offset -> when its delivery first found no open queue on the group."""
        self.delivered = 0

    async def run(self) -> None:
        """Deliver due messages, forever."""
        while True:
            if self._state.is_master:
                try:
                    await self.deliver_due()
                except FerryError as exc:
                    log.error("delayed delivery failed, retrying: %s", exc)
            await asyncio.sleep(_TICK_S)

    async def deliver_due(self) -> int:
        """One pass over every level; returns how many messages were delivered."""
        state = self._state
        delays = state.config.delay_levels_ms
        now_ms = state.wall_ms()
        delivered = 0
        for level, delay_ms in enumerate(delays, 1):
            queue_id = level - 1
            offset = state.delay_offsets.offsets.get(level, 0)
            if state.store.max_queue_offset(SCHEDULE_TOPIC, queue_id) <= offset:
                continue  # nothing waits at this level: skip the read
            while True:
                result = state.store.get(SCHEDULE_TOPIC, queue_id, offset, _BATCH)
                if result.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
                    offset = result.next_queue_offset
                    state.delay_offsets.set(level, offset)
                    continue
                if not result.records:
                    if result.next_queue_offset > offset:  # skipped fillers or removed entries
                        offset = result.next_queue_offset
                        state.delay_offsets.set(level, offset)
                        continue
                    break
                due = 0
                for queue_offset, raw in zip(result.queue_offsets, result.records, strict=True):
                    record = decode_record(raw)
                    if record.store_timestamp_ms + delay_ms > now_ms:
                        break
                    await self._deliver(record)
                    due += 1
                    offset = queue_offset + 1
                    state.delay_offsets.set(level, offset)
                delivered += due
                if due < len(result.records):
                    break
        self.delivered += delivered
        return delivered

    async def _deliver(self, record: MessageRecord) -> None:
        properties = dict(record.properties)
        topic = properties.pop(props.REAL_TOPIC, None)
        queue_text = properties.pop(props.REAL_QUEUE_ID, "0")
        properties.pop(props.DELAY_TIME_LEVEL, None)
        properties.pop(props.PROPERTY_CRC32, None)
        if topic is None:
            log.error("delayed message at %d has no real topic; dropped", record.log_offset)
            return
        queue_id = int(queue_text) if queue_text.isdigit() else 0
        item = BatchItem(record.body, encode_properties(properties), record.flag)
        try:
            await put_messages(
                self._state,
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
                since = self._failing_since.setdefault(record.log_offset, self._state.clock())
                await deliver_elsewhere(
                    self._state,
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
            log.error("delayed message at %d for fenced topic %s dropped", record.log_offset, topic)
