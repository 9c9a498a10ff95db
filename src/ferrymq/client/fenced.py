"""Writing a fenced topic (issue 18; the broker's rules are in `ferrymq.broker.fence`).

A fenced topic has one queue on one broker group and exactly one writer: a writer claims an
epoch with a compare-and-set append (`op="claim"`, epoch = the current epoch + 1), then appends
snapshots and writes under that (epoch, writer). The broker refuses anything else with FENCED,
naming the current holder (`FencedError`), and stores nothing.

```python
async with FencedTopicWriter(namesrv, "connect-configs") as log:
    holder = await log.holder()
    await log.append(b"...", op="claim", epoch=holder.epoch + 1, writer="w1", url=my_url)
    await log.append(b"...", op="write", epoch=holder.epoch + 1, writer="w1")
```

`append` answers once the record is committed (every SyncStateSet member has it, with a
SYNC_MASTER group). It goes to the master of the topic's queue, refreshing the route and trying
again only while the record was surely not stored (no connection, or a broker that is not the
master); a request that left and got no answer raises `SendOutcomeUnknownError`, never a retry.

Reading the topic back: apply a record iff its logical offset (its `FERRY_FENCE_COPY` property,
else its queue offset) is greater than the last one applied; start from `holder()`'s
`live_start_offset` (`ferrymq.broker.fence` rules 5 and 6).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Literal, Self

from ferrymq import clock
from ferrymq.client.routing import Routes, TopicRoute
from ferrymq.errors import (
    ConnectError,
    FencedError,
    FencedTopicError,
    InvalidMessageError,
    NotCommittedError,
    ProtocolError,
    RemoteError,
    RpcError,
    SendFailedError,
    SendOutcomeUnknownError,
)
from ferrymq.model import validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.wire import properties as props
from ferrymq.wire.bodies import FencedRemark, decode_body
from ferrymq.wire.bodies import FenceHolder as FenceHolderBody
from ferrymq.wire.broker import (
    GetFenceRequestHeader,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.msgid import UniqueIdGenerator, decode_offset_msg_id
from ferrymq.wire.properties import (
    FENCE_COPY,
    FENCE_EPOCH,
    FENCE_MAX_URL_CHARS,
    FENCE_MAX_WRITER_CHARS,
    FENCE_OP,
    FENCE_URL,
    FENCE_WRITER,
    encode_properties,
    is_property_text,
)

__all__ = [
    "FENCE_COPY",
    "FENCE_EPOCH",
    "FENCE_OP",
    "FENCE_URL",
    "FENCE_WRITER",
    "FenceHolder",
    "FencedAppend",
    "FencedTopicWriter",
    "fence_holder",
    "fenced_error",
    "route_queue",
]

_OPS: Final = ("claim", "snapshot", "write")
_GROUP: Final = "FERRY_FENCED_WRITER"
_MAX_ATTEMPTS: Final = 200
"""A bound beside `timeout_s`: tries of one append (refusals that stored nothing)."""
_RETRY_PAUSE_S: Final = 0.1
_RETRY_CODES: Final = frozenset(
    {
        ResponseCode.NO_PERMISSION,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.NOT_LEADER_FOR_QUEUE,
        ResponseCode.TOPIC_NOT_EXIST,
    }
)
"""Refusals that stored nothing and that a fresh route or a moment may cure (a new master)."""
_NOT_COMMITTED: Final[dict[int, str]] = {
    ResponseCode.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
    ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE",
}


@dataclass(frozen=True, slots=True)
class FencedAppend:
    """Where an accepted record was stored."""

    queue_offset: int
    log_offset: int


@dataclass(frozen=True, slots=True)
class FenceHolder:
    """A fenced topic's holder and the queue offset its live tail starts at."""

    epoch: int
    writer: str
    url: str
    live_start_offset: int


def fenced_error(remark: str) -> FencedError:
    """The `FencedError` a FENCED answer's remark describes."""
    try:
        found = decode_body(remark.encode(), FencedRemark)
    except ProtocolError:
        return FencedError("?", 0, "", "", remark)
    return FencedError(found.topic, found.epoch, found.writer, found.url, found.reason)


def route_queue(route: TopicRoute) -> str:
    """The broker group of a fenced topic's one queue.

    Raises:
        FencedTopicError: the route has several queues or groups, or no writable queue.
    """
    groups = {q.broker_name for q in (*route.write_queues, *route.read_queues)}
    if len(groups) > 1:
        raise FencedTopicError(route.topic, f"it is on {len(groups)} broker groups")
    if len(route.write_queues) != 1 or len(route.read_queues) > 1:
        raise FencedTopicError(
            route.topic,
            f"it has {len(route.write_queues)} write and {len(route.read_queues)} read queues",
        )
    return route.write_queues[0].broker_name


def _check(op: str, epoch: int, writer: str, url: str | None) -> None:
    if op not in _OPS:
        raise InvalidMessageError(f"op must be one of {', '.join(_OPS)}, not {op!r}")
    if type(epoch) is not int or epoch < 1:
        raise InvalidMessageError(f"epoch must be an int >= 1, not {epoch!r}")
    if not writer or len(writer) > FENCE_MAX_WRITER_CHARS or not is_property_text(writer):
        raise InvalidMessageError(
            f"writer must be 1..{FENCE_MAX_WRITER_CHARS} characters without \\x01 or \\x02"
        )
    if op != "write" and not url:
        raise InvalidMessageError(f"a {op} needs the writer's url")
    if url is not None and (len(url) > FENCE_MAX_URL_CHARS or not is_property_text(url)):
        raise InvalidMessageError(
            f"url must be at most {FENCE_MAX_URL_CHARS} characters without \\x01 or \\x02"
        )


class FencedTopicWriter:
    """Appends to one fenced topic; use as an async context manager."""

    def __init__(self, namesrv_addr: str, topic: str, *, rpc: RpcClient | None = None) -> None:
        self.topic = validate_topic(topic)
        self._rpc = rpc or RpcClient()
        self._owns_rpc = rpc is None
        self.routes = Routes(self._rpc, [a.strip() for a in namesrv_addr.split(";") if a.strip()])
        self._ids = UniqueIdGenerator(bytes([127, 0, 0, 1]), os.getpid())

    async def close(self) -> None:
        """Close connections (when this writer owns them)."""
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

    async def _master(self, deadline: float, refresh: bool) -> str:
        """The master of the topic's queue, waiting (until `deadline`) for one to be routed.

        Raises:
            FencedTopicError: the topic is not shaped as a fenced topic.
            ConnectError: no master within the deadline.
        """
        while True:
            route = await self.routes.get(self.topic, refresh=refresh)
            broker_name = route_queue(route)
            address = route.master(broker_name)
            if address is not None:
                return address
            if clock.mono() >= deadline:
                raise ConnectError(broker_name, "the broker group has no master")
            await asyncio.sleep(_RETRY_PAUSE_S)
            refresh = True

    async def append(
        self,
        body: bytes,
        *,
        op: Literal["claim", "snapshot", "write"],
        epoch: int,
        writer: str,
        url: str | None = None,
        timeout_s: float = 10.0,
    ) -> FencedAppend:
        """Append one record under (epoch, writer) and wait until it is committed.

        Raises:
            InvalidMessageError: a bad op, epoch, writer or url (nothing was sent).
            FencedError: the fence refused it (nothing was stored); it names the holder.
            NotCommittedError: stored but not committed in time (a failover may drop it).
            SendOutcomeUnknownError: the request left and no answer came.
            SendFailedError: refused for another reason, or no master within `timeout_s`.
            FencedTopicError: the topic's route is not one queue on one group.
        """
        _check(op, epoch, writer, url)
        msg_id = self._ids.next_id(time.time_ns() // 1_000_000)
        properties = {
            FENCE_OP: op,
            FENCE_EPOCH: str(epoch),
            FENCE_WRITER: writer,
            props.UNIQ_KEY: msg_id,
            props.WAIT_STORE_MSG_OK: "true",
        }
        if url is not None:
            properties[FENCE_URL] = url
        encoded = encode_properties(properties).decode()
        deadline = clock.mono() + timeout_s
        refresh = False
        last = "no attempt"
        for _ in range(_MAX_ATTEMPTS):
            try:
                address = await self._master(deadline, refresh)
            except ConnectError as exc:
                raise SendFailedError(f"append to {self.topic} failed: {exc}") from exc
            request = self._request(body, encoded)
            remaining = max(deadline - clock.mono(), 0.1)
            try:
                response = await self._rpc.call(address, request, remaining)
            except RpcError as exc:
                if exc.request_sent:
                    self.routes.invalidate(self.topic)
                    raise SendOutcomeUnknownError(str(exc), msg_id) from exc
                last = str(exc)
            else:
                code = response.code
                if code == ResponseCode.SUCCESS:
                    _, log_offset = decode_offset_msg_id(response.ext_fields.get("msgId", ""))
                    return FencedAppend(int(response.ext_fields["queueOffset"]), log_offset)
                if code == ResponseCode.FENCED:
                    raise fenced_error(response.remark or "")
                status = _NOT_COMMITTED.get(code)
                if status is not None:
                    raise NotCommittedError(
                        f"{address} stored it at queue offset "
                        f"{response.ext_fields.get('queueOffset', '?')} but answered {status}",
                        msg_id,
                        status,
                    )
                if code == ResponseCode.MESSAGE_ILLEGAL:
                    raise InvalidMessageError(f"append to {self.topic}: {response.remark}")
                last = f"{address} refused: {response.remark} (code {code})"
                if code not in _RETRY_CODES:
                    raise SendFailedError(f"append to {self.topic} failed: {last}")
            if clock.mono() >= deadline:
                break
            self.routes.invalidate(self.topic)
            refresh = True
            await asyncio.sleep(_RETRY_PAUSE_S)
        raise SendFailedError(f"append to {self.topic} failed within {timeout_s:g} s: {last}")

    def _request(self, body: bytes, properties: str) -> RemotingCommand:
        header = SendMessageRequestHeader(
            producer_group=_GROUP,
            topic=self.topic,
            default_topic="TBW102",
            default_topic_queue_nums=1,
            queue_id=0,
            sys_flag=0,
            born_timestamp=time.time_ns() // 1_000_000,
            flag=0,
            properties=properties,
        )
        return RemotingCommand(
            code=RequestCode.SEND_MESSAGE_V2,
            ext_fields=to_ext_fields(SendMessageRequestHeaderV2.from_v1(header)),
            body=body,
        )

    async def holder(self, *, timeout_s: float = 5.0) -> FenceHolder:
        """The topic's holder as its master knows it (GET_FENCE), and its live start.

        Raises:
            RemoteError: the broker refused (not a fenced topic, say).
            ConnectError: no master within `timeout_s`.
            FencedTopicError: the topic's route is not one queue on one group.
        """
        deadline = clock.mono() + timeout_s
        address = await self._master(deadline, False)
        return await fence_holder(self._rpc, address, self.topic, timeout_s)


async def fence_holder(rpc: RpcClient, address: str, topic: str, timeout_s: float) -> FenceHolder:
    """GET_FENCE at one broker.

    Raises:
        RemoteError: the broker refused (not a fenced topic, say).
    """
    request = RemotingCommand(
        code=RequestCode.GET_FENCE, ext_fields=to_ext_fields(GetFenceRequestHeader(topic=topic))
    )
    response = await rpc.call(address, request, timeout_s)
    if response.code != ResponseCode.SUCCESS:
        raise RemoteError(response.code, response.remark)
    found = decode_body(response.body, FenceHolderBody)
    return FenceHolder(found.epoch, found.writer, found.url, found.live_start_offset)
