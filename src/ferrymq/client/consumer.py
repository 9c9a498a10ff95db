"""The offset-addressed pull consumer: read any queue from any queue offset.

What the CLI, benchmarks and the Spark source use: the caller decides which queues and which
offsets; the consumer turns that into PULL_MESSAGE requests to the broker group holding the
queue, and commits offsets when asked. `fetch_range` reads exactly `[start, end)`.

Queues moved between broker groups (issue 20 section 4, `wire.queuemap`): the caller names a
queue as it always was (its logical queue) and gets the same offsets; each request goes to the
physical queue of the segment holding the offset. A pull that reaches a closed segment's end
goes on in the next one; one that reaches the end of a sealed queue whose next segment the
route does not show yet (`ferrySealed`) asks the NameServers again. Committed offsets live on
the physical queue of the segment read (and later segments: a reset back is not hidden);
`committed` takes the highest of the segments'.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import Self

from ferrymq.client.credentials import Credentials, with_credentials
from ferrymq.client.message import Message
from ferrymq.client.routing import MASTER_ID, Routes
from ferrymq.errors import ConnectError, RemoteError, RpcError
from ferrymq.model import MessageQueue, validate_group
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.broker import (
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader, to_ext_fields
from ferrymq.wire.queuemap import QueueSegment
from ferrymq.wire.records import (
    RecordBuffers,
    decode_buffers,
    decode_record,
    peek_record_size,
)

__all__ = ["ColumnPull", "PullConsumer", "PullResult", "PullStatus"]

_MAX_SEGMENT_HOPS = 8
"""Segments one pull may step through (each closed one read to its end)."""


def _name(queue: MessageQueue) -> tuple[str, int]:
    return queue.broker_name, queue.queue_id


_SEALED_FIELD = "ferrySealed"
_SEALED_PAUSE_S = 0.05
"""A pause before pulling a sealed queue's end again while the route shows no next segment."""
_SYSFLAG_SUSPEND = 2
_SYSFLAG_SUBSCRIPTION = 4


class PullStatus(Enum):
    """What a pull found (RocketMQ `PullStatus`)."""

    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True, slots=True)
class PullResult:
    """Messages from one queue, and where to continue."""

    status: PullStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[Message] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ColumnPull:
    """Records from one queue as column buffers (`RecordBuffers`), and where to continue."""

    status: PullStatus
    next_offset: int
    min_offset: int
    max_offset: int
    records: RecordBuffers


_STATUS: dict[int, PullStatus] = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


def decode_messages(body: bytes, broker_name: str) -> list[Message]:
    """The messages of a pull response body (stored records, back to back)."""
    messages: list[Message] = []
    position = 0
    while position < len(body):
        size, _ = peek_record_size(body, position)
        messages.append(Message.from_record(decode_record(body, position), broker_name))
        position += size
    return messages


class PullConsumer:
    """Pulls by queue offset for one consumer group."""

    def __init__(
        self,
        namesrv_addr: str,
        group: str = "DEFAULT_CONSUMER",
        *,
        request_timeout: float = 5.0,
        rpc: RpcClient | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """`access_key`/`secret_key` (or `credentials`): sign every request (ACL 1.0, issue 23)."""
        self.group = validate_group(group)
        self._rpc = with_credentials(rpc, access_key, secret_key, credentials)
        self._owns_rpc = rpc is None
        self.routes = Routes(self._rpc, [a.strip() for a in namesrv_addr.split(";") if a.strip()])
        self._read_from: dict[MessageQueue, int] = {}
        """Per queue, the replica the broker suggested reading next (suggestWhichBrokerId)."""
        self._timeout = request_timeout

    async def close(self) -> None:
        """Close connections (when this consumer owns them)."""
        if self._owns_rpc:
            await self._rpc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues."""
        return (await self.routes.get(topic)).read_queues

    async def _call(
        self,
        queue: MessageQueue,
        code: int,
        header: CommandHeader,
        timeout: float | None = None,
        broker_id: int = MASTER_ID,
        *,
        master_only: bool = False,
    ) -> RemotingCommand:
        route = await self.routes.get(queue.topic)
        address = route.brokers.get(queue.broker_name, {}).get(broker_id)
        if address is None and broker_id == MASTER_ID:
            # a route fetched while the group had no master: the new one registers within
            # moments, so fetch again soon instead of reading a slave until the route's timer
            # (a slave that tells the reader to pull the master would hold it there: `ferry chaos`)
            self.routes.refetch_soon(queue.topic)
        if address is None and not master_only:
            address = route.any_replica(queue.broker_name)
        if address is None:
            self.routes.invalidate(queue.topic)  # ask the NameServers again next time
            if master_only:
                raise ConnectError(queue.broker_name, "the broker group has no master in the route")
            # the topic has a route, without this group now (all its replicas unregistered)
            raise ConnectError(queue.broker_name, f"no replica of the group routes {queue.topic}")
        request = RemotingCommand(code=code, ext_fields=to_ext_fields(header))
        try:
            response = await self._rpc.call(address, request, timeout or self._timeout)
        except RpcError:
            # the replica may be gone (a failover): the next call asks the NameServers again
            self.routes.invalidate(queue.topic)
            self._read_from.pop(queue, None)
            raise
        if response.code in (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.NO_PERMISSION):
            self.routes.invalidate(queue.topic)
        return response

    async def _segment(
        self, queue: MessageQueue, offset: int
    ) -> tuple[MessageQueue, QueueSegment | None]:
        """The physical queue holding `offset` of a (logical) queue, and its segment."""
        segment = (await self.routes.get(queue.topic)).segment(queue, offset)
        if segment is None:
            return queue, None
        return MessageQueue(queue.topic, segment.broker_name, segment.queue_id), segment

    async def _pull_logical(
        self,
        queue: MessageQueue,
        offset: int,
        max_messages: int,
        max_bytes: int | None,
        expression: str,
        wait: float,
        min_bytes: int = 0,
    ) -> tuple[PullStatus, RemotingCommand, MessageQueue]:
        """`_pull` on the segment holding `offset`, on to the next ones past a closed end."""
        for _ in range(_MAX_SEGMENT_HOPS):
            physical, segment = await self._segment(queue, offset)
            status, response = await self._pull(
                physical, offset, max_messages, max_bytes, expression, wait, min_bytes
            )
            if status is PullStatus.FOUND:
                return status, response, physical
            fields = response.ext_fields
            if (
                segment is not None
                and segment.start_offset > 0
                and status is PullStatus.OFFSET_ILLEGAL
                and int(fields.get("nextBeginOffset", offset)) < segment.start_offset
            ):
                # a new segment's group that has not opened it yet (a route ahead of the
                # group): never send the reader back below the segment; ask again soon
                self.routes.invalidate(queue.topic)
                await asyncio.sleep(_SEALED_PAUSE_S)
                fields["nextBeginOffset"] = str(offset)
                return PullStatus.NO_NEW_MSG, response, physical
            if response.ext_fields.get(_SEALED_FIELD) == "true":
                # the queue moved (or is moving) and this route does not show where: ask again
                self.routes.invalidate(queue.topic)
                await asyncio.sleep(_SEALED_PAUSE_S)
                if (await self._segment(queue, offset))[0] != physical:
                    continue  # read on in the next segment, at the same offset
            return status, response, physical
        raise RemoteError(ResponseCode.SYSTEM_ERROR, f"{queue}: too many segments at {offset}")

    async def _pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_messages: int,
        max_bytes: int | None,
        expression: str,
        wait: float,
        min_bytes: int = 0,
    ) -> tuple[PullStatus, RemotingCommand]:
        header = PullMessageRequestHeader(
            consumer_group=self.group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            queue_offset=offset,
            max_msg_nums=max_messages,
            sys_flag=_SYSFLAG_SUBSCRIPTION | (_SYSFLAG_SUSPEND if wait > 0 else 0),
            commit_offset=0,
            suspend_timeout_millis=int(wait * 1000),
            subscription=expression,
            max_msg_bytes=max_bytes,
            min_msg_bytes=min_bytes or None,
            ferry_follows_map=True,
        )
        response = await self._call(
            queue,
            RequestCode.PULL_MESSAGE,
            header,
            self._timeout + wait,
            self._read_from.get(queue, MASTER_ID),
        )
        suggested = response.ext_fields.get("suggestWhichBrokerId")
        if suggested is not None and suggested.isdigit():
            # the broker says which replica to read next (a slave for a consumer far behind)
            self._read_from[queue] = int(suggested)
        status = _STATUS.get(response.code)
        if status is None:
            raise RemoteError(response.code, response.remark)
        return status, response

    async def pull(
        self,
        queue: MessageQueue,
        offset: int,
        *,
        max_messages: int = 32,
        max_bytes: int | None = None,
        expression: str = "*",
        wait: float = 0.0,
        min_bytes: int = 0,
    ) -> PullResult:
        """Up to `max_messages` messages from `offset`; with `wait`, long-poll for new ones.

        With `wait` and `min_bytes`, a ferrymq broker holds the pull until the messages it can
        return reach `min_bytes` (or `max_messages` / `max_bytes`) or `wait` is over, and then
        answers with what there is (a RocketMQ broker ignores `min_bytes`).
        """
        status, response, physical = await self._pull_logical(
            queue, offset, max_messages, max_bytes, expression, wait, min_bytes
        )
        fields = response.ext_fields
        return PullResult(
            status=status,
            next_offset=int(fields.get("nextBeginOffset", offset)),
            min_offset=int(fields.get("minOffset", 0)),
            max_offset=int(fields.get("maxOffset", 0)),
            messages=decode_messages(response.body, physical.broker_name)
            if status is PullStatus.FOUND
            else [],
        )

    async def pull_columns(
        self,
        queue: MessageQueue,
        offset: int,
        *,
        max_messages: int = 32,
        max_bytes: int | None = None,
    ) -> ColumnPull:
        """`pull`, with the records as column buffers (`decode_buffers`), not `Message`s."""
        status, response, _ = await self._pull_logical(
            queue, offset, max_messages, max_bytes, "*", 0.0
        )
        fields = response.ext_fields
        return ColumnPull(
            status=status,
            next_offset=int(fields.get("nextBeginOffset", offset)),
            min_offset=int(fields.get("minOffset", 0)),
            max_offset=int(fields.get("maxOffset", 0)),
            records=decode_buffers(response.body)
            if status is PullStatus.FOUND
            else RecordBuffers(),
        )

    async def fetch_range(
        self, queue: MessageQueue, start: int, end: int, *, max_bytes: int | None = None
    ) -> list[Message]:
        """Exactly the messages at queue offsets `[start, end)` (fewer if retention took some)."""
        messages: list[Message] = []
        offset = start
        while offset < end:
            result = await self.pull(
                queue, offset, max_messages=min(1024, end - offset), max_bytes=max_bytes
            )
            if result.status is PullStatus.OFFSET_ILLEGAL and result.next_offset > offset:
                offset = result.next_offset
                continue
            if result.status is not PullStatus.FOUND:
                break
            messages += [m for m in result.messages if m.queue_offset < end]
            offset = result.next_offset
        return messages

    async def _offset(self, queue: MessageQueue, code: int, header: CommandHeader) -> int:
        response = await self._call(queue, code, header)
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return int(response.ext_fields["offset"])

    async def max_offset(self, queue: MessageQueue) -> int:
        """The offset the queue's next message will get."""
        queue = await self._last(queue)
        header = GetMaxOffsetRequestHeader(topic=queue.topic, queue_id=queue.queue_id)
        return await self._offset(queue, RequestCode.GET_MAX_OFFSET, header)

    async def min_offset(self, queue: MessageQueue) -> int:
        """The first offset still stored."""
        queue, _ = await self._segment(queue, 0)
        header = GetMinOffsetRequestHeader(topic=queue.topic, queue_id=queue.queue_id)
        return await self._offset(queue, RequestCode.GET_MIN_OFFSET, header)

    async def offset_for_time(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after `timestamp_ms` (in the queue's newest segment)."""
        queue = await self._last(queue)
        header = SearchOffsetRequestHeader(
            topic=queue.topic, queue_id=queue.queue_id, timestamp=timestamp_ms
        )
        return await self._offset(queue, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, header)

    async def _last(self, queue: MessageQueue) -> MessageQueue:
        route = await self.routes.get(queue.topic)
        if route.queue_map is None:
            return queue
        logical = route.queue_map.logical(queue.broker_name, queue.queue_id)
        if logical is None:
            return queue
        current = logical.current
        return MessageQueue(queue.topic, current.broker_name, current.queue_id)

    async def committed(self, queue: MessageQueue) -> int | None:
        """The group's committed offset in the queue (asked of the master), or None.

        A moved queue: the highest of its segments' (each commit goes to the segment read).
        """
        route = await self.routes.get(queue.topic)
        logical = route.queue_map.logical(*_name(queue)) if route.queue_map else None
        if logical is None:
            return await self._committed(queue)
        found: list[int] = []
        for segment in logical.segments:
            physical = MessageQueue(queue.topic, segment.broker_name, segment.queue_id)
            try:
                offset = await self._committed(physical)
            except ConnectError:
                if segment.is_open:
                    raise
                continue  # a closed segment's group gone (forgotten): the later ones count
            if offset is not None:
                found.append(offset)
        return max(found) if found else None

    async def _committed(self, queue: MessageQueue) -> int | None:
        header = QueryConsumerOffsetRequestHeader(
            consumer_group=self.group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            set_zero_if_not_found=False,
        )
        # only the master: a slave outside the SyncStateSet may hold an older position than one
        # the master acknowledged (commit-regression found by `ferry chaos` when the master died
        # and only a stranded slave was left in the route); without a master this raises
        response = await self._call(
            queue, RequestCode.QUERY_CONSUMER_OFFSET, header, master_only=True
        )
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return int(response.ext_fields["offset"])

    async def commit(self, queue: MessageQueue, offset: int) -> None:
        """Commit the group's position in the queue (the next offset to read).

        A moved queue: on the segment holding `offset`, and the same offset on every later
        segment, so a reset back into an older segment is not hidden by a commit made further
        on (`committed` takes the highest of the segments').
        """
        physical, segment = await self._segment(queue, offset)
        await self._commit(physical, offset)
        route = await self.routes.get(queue.topic)
        logical = route.queue_map.logical(*_name(queue)) if route.queue_map else None
        if segment is None or logical is None:
            return
        later = False
        for known in logical.segments:
            if later:
                await self._commit(
                    MessageQueue(queue.topic, known.broker_name, known.queue_id), offset
                )
            later = later or known.physical == segment.physical

    async def _commit(self, queue: MessageQueue, offset: int) -> None:
        header = UpdateConsumerOffsetRequestHeader(
            consumer_group=self.group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            commit_offset=offset,
        )
        # only the master: a slave would acknowledge a commit the master never hears of (and
        # its copy is overwritten by the master's replicated offsets): found by `ferry chaos`
        response = await self._call(
            queue, RequestCode.UPDATE_CONSUMER_OFFSET, header, master_only=True
        )
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
