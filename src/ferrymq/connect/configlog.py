"""Following the config log: every worker pulls the fenced config topic into its `ConfigState`.

Seed 002: followers replay the log the leader writes; a worker that starts reads it from its
start to its end (after retention: the copied-forward live tail, which starts at a snapshot).
The reader long-polls the topic's single queue, applies records in queue order
(`ConfigState.apply`, with the logical-offset rule of `records`), and wakes whoever waits for an
offset: a leader for its own write (a 2xx means committed *and* applied), a read with
`?minOffset=` (read-your-writes on any worker), `/health` for the end of the first replay.

A reader starts at the topic's live start (`GET_FENCE`: the latest snapshot, the first copy of
a whole copied-forward block, or offset 0), not at the first stored record: records between the
two would be applied to an empty state and hide the copies behind them (logical-offset rule).
A reader whose next record was deleted by retention starts again there, with an empty state
of its own (`_Rebuild`): `state` and `config_offset` keep the last whole state, which the worker
answers from and runs tasks by, until that replay reaches the queue's end and replaces it at once
(a half-read state would stop the worker's tasks and answer 404 for its connectors meanwhile).

`config_offset` is the queue offset after the last record read: what `X-Ferry-Config-Offset`
reports and `?minOffset=` compares with.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.message import Message
from ferrymq.connect.records import EPOCH, OP, WRITER, Record, decode_record, logical_offset
from ferrymq.connect.state import ConfigState
from ferrymq.errors import FerryError
from ferrymq.model import MessageQueue

__all__ = ["ConfigLog", "LoggedRecord", "decode_logged"]

log = logging.getLogger(__name__)

_PULL_BATCH = 256
_LONG_POLL_S = 1.0
_RETRY_S = 0.2


@dataclass(slots=True)
class _Rebuild:
    """The live tail read again, aside, after retention took the reader's next record."""

    state: ConfigState
    offset: int
    """The queue offset after the last record read into `state`."""
    end: int
    """The queue's end when the replay started: `state` replaces the reader's on reaching it."""
    applied: list[tuple[Record, int]]
    """(record, logical offset) applied, told to `on_applied` once `state` is published."""


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """A config-log record with where and by whom it was written (`ferry connect log`)."""

    queue_offset: int
    logical_offset: int
    op: str
    epoch: int | None
    writer: str
    store_timestamp_ms: int
    record: Record | None
    """None when the body is not a config record (the error is in `problem`)."""
    problem: str = ""


def decode_logged(message: Message) -> LoggedRecord:
    """A pulled message as a config-log record (never raises)."""
    props = message.properties
    epoch_text = props.get(EPOCH, "")
    record: Record | None = None
    problem = ""
    try:
        record = decode_record(message.body)
    except msgspec.DecodeError as exc:
        problem = str(exc)
    return LoggedRecord(
        queue_offset=message.queue_offset,
        logical_offset=logical_offset(message.queue_offset, props),
        op=props.get(OP, ""),
        epoch=int(epoch_text) if epoch_text.isdigit() else None,
        writer=props.get(WRITER, ""),
        store_timestamp_ms=message.store_timestamp_ms,
        record=record,
        problem=problem,
    )


class ConfigLog:
    """Pulls the config topic into `state`; the one writer of `state` in the worker."""

    def __init__(
        self,
        consumer: PullConsumer,
        topic: str,
        state: ConfigState,
        *,
        live_start: Callable[[], Awaitable[int]],
        on_applied: Callable[[Record, int], None] | None = None,
    ) -> None:
        self._consumer = consumer
        self._live_start = live_start
        self.topic = topic
        self.state = state
        self.config_offset = 0
        """The queue offset after the last record read into `state`."""
        self.end_at_start: int | None = None
        """The queue's end when the worker started; None until the broker answered."""
        self._on_applied = on_applied
        self._moved = asyncio.Event()
        self._queue: MessageQueue | None = None
        self._rebuild: _Rebuild | None = None
        self.last_error: str = ""

    @property
    def replayed(self) -> bool:
        """Whether the first replay reached the end the log had when the worker started."""
        return self.end_at_start is not None and self.config_offset >= self.end_at_start

    async def queue(self) -> MessageQueue:
        """The config topic's single queue (from its route)."""
        if self._queue is None:
            queues = await self._consumer.queues(self.topic)
            if len(queues) != 1:
                raise FerryError(
                    f"the config topic {self.topic} must have exactly one queue on one broker "
                    f"group; its route has {len(queues)}: {', '.join(map(str, queues))}"
                )
            self._queue = queues[0]
        return self._queue

    async def end_offset(self) -> int:
        """The config queue's end now (one broker call).

        Raises:
            FerryError: the broker did not answer.
        """
        return await self._consumer.max_offset(await self.queue())

    async def run(self) -> None:
        """Follow the log forever (errors are logged and retried)."""
        while True:
            try:
                await self._follow()
            except (FerryError, OSError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("config log %s: %s; retrying", self.topic, self.last_error)
                self._queue = None
                await asyncio.sleep(_RETRY_S)

    async def _follow(self) -> None:
        queue = await self.queue()
        if self.end_at_start is None:
            self.end_at_start = await self._consumer.max_offset(queue)
            self.config_offset = await self._live_start()
        while True:
            rebuild = self._rebuild
            offset = self.config_offset if rebuild is None else rebuild.offset
            wait = 0.0 if not self.replayed or rebuild is not None else _LONG_POLL_S
            result = await self._consumer.pull(queue, offset, max_messages=_PULL_BATCH, wait=wait)
            self.last_error = ""
            if result.status is PullStatus.FOUND:
                for message in result.messages:
                    self._apply(message)
                if rebuild is None:
                    self.config_offset = max(self.config_offset, result.next_offset)
                    self._wake()
                else:
                    rebuild.offset = max(rebuild.offset, result.next_offset)
                    if rebuild.offset >= rebuild.end:
                        self._publish(rebuild)
            elif result.next_offset > offset:
                # retention deleted records this worker had not read: their live tail was
                # copied forward; read it from its start into an empty state, aside
                start = await self._live_start()
                end = await self._consumer.max_offset(queue)
                log.warning(
                    "config log %s: records from offset %d are gone; replaying the live tail "
                    "from offset %d to %d",
                    self.topic,
                    offset,
                    start,
                    end,
                )
                self._rebuild = _Rebuild(ConfigState(), start, end, [])
                if start >= end:
                    self._publish(self._rebuild)
            elif result.status is not PullStatus.NO_NEW_MSG:
                await asyncio.sleep(_RETRY_S)  # a replica catching up (PULL_RETRY_IMMEDIATELY)
            elif rebuild is not None:
                self._publish(rebuild)  # at the queue's end (a failover cut it below `end`)
            elif self.config_offset < self.end_at_start:
                # the queue ends below where it ended at start: a failover truncated it
                self.end_at_start = self.config_offset
                self._wake()

    def _apply(self, message: Message) -> None:
        rebuild = self._rebuild
        if message.queue_offset < (self.config_offset if rebuild is None else rebuild.offset):
            return
        logged = decode_logged(message)
        applied = False
        if logged.record is None:
            log.error(
                "config log %s offset %d: not a config record (%s); skipped",
                self.topic,
                message.queue_offset,
                logged.problem,
            )
        elif rebuild is not None:
            if rebuild.state.apply(logged.record, logged.logical_offset):
                rebuild.applied.append((logged.record, logged.logical_offset))
        else:
            applied = self.state.apply(logged.record, logged.logical_offset)
        if rebuild is not None:
            rebuild.offset = message.queue_offset + 1
            return
        self.config_offset = message.queue_offset + 1
        if applied and logged.record is not None and self._on_applied is not None:
            self._on_applied(logged.record, logged.logical_offset)

    def _publish(self, rebuild: _Rebuild) -> None:
        """The live tail read again becomes `state`, in one step."""
        self._rebuild = None
        self.state.replace(rebuild.state)
        self.config_offset = rebuild.offset
        log.info(
            "config log %s: live tail read again to offset %d (%d records applied)",
            self.topic,
            rebuild.offset,
            len(rebuild.applied),
        )
        if self._on_applied is not None:
            for record, logical in rebuild.applied:
                self._on_applied(record, logical)
        self._wake()

    def _wake(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()

    async def wait_for(self, offset: int, timeout_s: float) -> bool:
        """Wait until the records before queue offset `offset` are applied; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.config_offset < offset:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._moved.wait(), remaining)
            except TimeoutError:
                return self.config_offset >= offset
        return True

    async def wait_replayed(self, timeout_s: float) -> bool:
        """Wait for the end of the first replay; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.replayed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._moved.wait(), min(remaining, 0.5))
            except TimeoutError:
                continue
        return True
