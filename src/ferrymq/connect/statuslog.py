"""The status topic's I/O: sending this worker's task states, following everyone's.

A report is queued and sent by one sender task (the newest report of a task replaces an unsent
older one; a failed send is retried, so a broker failover delays reports and loses none). The
follower reads the topic's single queue from two republish periods back (by store time) and
feeds `StatusTable`, whose guard keeps zombies' reports out.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.connect.state import TaskKey
from ferrymq.connect.status import StatusTable, TaskStatus, decode_status, encode_status
from ferrymq.errors import FerryError
from ferrymq.model import MessageQueue

__all__ = ["StatusLog"]

log = logging.getLogger(__name__)

_RETRY_S = 0.5
_LONG_POLL_S = 1.0


class StatusLog:
    """Sends and follows task states on `topic`."""

    def __init__(
        self,
        producer: Producer,
        consumer: PullConsumer,
        topic: str,
        *,
        lookback_ms: int,
    ) -> None:
        self._producer = producer
        self._consumer = consumer
        self.topic = topic
        self.table = StatusTable()
        self._lookback_ms = lookback_ms
        self._pending: dict[TaskKey, TaskStatus] = {}
        self._wanted = asyncio.Event()

    def publish(self, status: TaskStatus) -> None:
        """Queue a report (applied to this worker's own table at once)."""
        self.table.put(status)
        self._pending[status.key] = status
        self._wanted.set()

    async def send_forever(self) -> None:
        """Send queued reports, forever."""
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            while self._pending:
                key = next(iter(self._pending))
                status = self._pending.pop(key)
                try:
                    queue = await self._queue()
                    await self._producer.send(self.topic, encode_status(status), queue=queue)
                except (FerryError, OSError) as exc:
                    log.warning("status of %s/%d not sent (%s); retrying", key[0], key[2], exc)
                    self._pending.setdefault(key, status)
                    await asyncio.sleep(_RETRY_S)

    async def _queue(self) -> MessageQueue:
        queues = await self._producer.queues(self.topic)
        if not queues:
            raise FerryError(f"the status topic {self.topic} has no writable queue")
        return queues[0]

    async def follow_forever(self) -> None:
        """Follow the topic from two republish periods back, forever."""
        offset: int | None = None
        queue: MessageQueue | None = None
        while True:
            try:
                if queue is None:
                    queues = await self._consumer.queues(self.topic)
                    if not queues:
                        raise FerryError(f"the status topic {self.topic} has no queue")
                    queue = queues[0]
                if offset is None:
                    since_ms = time.time_ns() // 1_000_000 - self._lookback_ms
                    offset = await self._consumer.offset_for_time(queue, since_ms)
                result = await self._consumer.pull(
                    queue, offset, max_messages=256, wait=_LONG_POLL_S
                )
                if result.status is PullStatus.FOUND:
                    for message in result.messages:
                        try:
                            self.table.put(decode_status(message.body))
                        except msgspec.DecodeError:
                            log.warning(
                                "status topic offset %d: not a status record", message.queue_offset
                            )
                offset = max(offset, result.next_offset)
            except (FerryError, OSError) as exc:
                log.warning("following the status topic %s: %s; retrying", self.topic, exc)
                queue = None
                await asyncio.sleep(_RETRY_S)
