"""The simple consumer: POP consumption (RocketMQ 5's `SimpleConsumer`) over remoting.

`receive` pops up to `max_messages` messages of a topic from a broker group's master (each
group in turn); each stays invisible to every consumer of the group for `invisible_duration`
and comes back (its delivery attempt one higher) unless it is acknowledged (`ack`) in time.
`ack_batch` acknowledges many at once: one BATCH_ACK_MESSAGE per broker group (RocketMQ's
`batchAckMessageAsync`), stale handles among them skipped by the broker.
`change_invisible_duration` gives a message more (or less) time and a new receipt handle. A
FIFO consumer (`fifo=True`) pops orderly: a queue is handed to one receiver at a time, and its
messages come in queue order, an unacknowledged one again before anything newer.

No offsets to commit and no rebalance: the broker keeps the state (`broker/pop.py`), replicated
with its metadata, so consumers come and go freely.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self

import msgspec

from ferrymq.client.message import Message
from ferrymq.client.routing import Routes
from ferrymq.errors import ConnectError, RemoteError, RpcError
from ferrymq.model import validate_group
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader, to_ext_fields
from ferrymq.wire.pop import (
    NORMAL_FLAG,
    RETRY_FLAG,
    AckMessageRequestHeader,
    BatchAck,
    BatchAckMessageRequestBody,
    ChangeInvisibleTimeRequestHeader,
    PopMessageRequestHeader,
    ReceiptHandle,
    encode_bit_set,
    parse_info,
)
from ferrymq.wire.records import decode_record, peek_record_size

__all__ = ["ReceivedMessage", "SimpleConsumer", "batch_acks"]

_NOT_FOUND: Final = frozenset({ResponseCode.PULL_NOT_FOUND, ResponseCode.POLLING_TIMEOUT})
_INIT_MIN: Final = 0
_INIT_MAX: Final = 1


@dataclass(slots=True)
class ReceivedMessage:
    """A popped message, with what acknowledging it takes."""

    message: Message
    receipt_handle: str
    """RocketMQ's `extraInfo` string; `change_invisible_duration` replaces it."""
    delivery_attempt: int
    """1 on the first delivery."""
    popped_topic: str
    """The topic popped (the message's own; a retried one is stored in the POP retry topic)."""

    @property
    def handle(self) -> ReceiptHandle:
        """The parsed receipt handle."""
        return ReceiptHandle.parse(self.receipt_handle)


class SimpleConsumer:
    """Receives, acknowledges and delays messages of one consumer group by POP."""

    def __init__(
        self,
        namesrv_addr: str,
        group: str,
        *,
        fifo: bool = False,
        from_first: bool = True,
        request_timeout: float = 5.0,
        rpc: RpcClient | None = None,
    ) -> None:
        """Create a consumer (no connection until the first request).

        Args:
            namesrv_addr: NameServer addresses, `;` between.
            group: the consumer group.
            fifo: pop orderly (FIFO groups).
            from_first: a queue the group never consumed starts at its first message (else at
                its end). A queue the group committed an offset in starts there.
            request_timeout: seconds per request, on top of `wait`.
            rpc: a shared connection pool (closed by its owner).
        """
        self.group = validate_group(group)
        self.fifo = fifo
        self._init_mode = _INIT_MIN if from_first else _INIT_MAX
        self._rpc = rpc or RpcClient()
        self._owns_rpc = rpc is None
        self.routes = Routes(self._rpc, [a.strip() for a in namesrv_addr.split(";") if a.strip()])
        self._timeout = request_timeout
        self._turn = itertools.count()

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

    async def _master(self, topic: str, broker_name: str) -> str:
        route = await self.routes.get(topic)
        address = route.master(broker_name)
        if address is None:
            self.routes.invalidate(topic)
            raise ConnectError(broker_name, "the broker group has no master in the route")
        return address

    async def _call(
        self,
        topic: str,
        broker_name: str,
        code: int,
        header: CommandHeader | None,
        wait: float = 0.0,
        body: bytes = b"",
    ) -> RemotingCommand:
        address = await self._master(topic, broker_name)
        fields = to_ext_fields(header) if header is not None else {}
        request = RemotingCommand(code=code, ext_fields=fields, body=body)
        try:
            response = await self._rpc.call(address, request, self._timeout + wait)
        except RpcError:
            self.routes.invalidate(topic)  # a failover: ask the NameServers again next time
            raise
        if response.code in (ResponseCode.NO_PERMISSION, ResponseCode.TOPIC_NOT_EXIST):
            self.routes.invalidate(topic)
        return response

    async def receive(
        self,
        topic: str,
        *,
        max_messages: int = 16,
        invisible_duration: float = 30.0,
        wait: float = 0.0,
        expression: str = "*",
    ) -> list[ReceivedMessage]:
        """Pop up to `max_messages` messages of `topic` (tag `expression`) from one broker group.

        With `wait`, the broker holds the request up to that many seconds for a message. An
        empty list: nothing to receive there now.

        Raises:
            RemoteError: the broker refused (its code and remark).
            RpcError: the broker did not answer.
        """
        route = await self.routes.get(topic)
        names = sorted({q.broker_name for q in route.read_queues})
        if not names:
            raise ConnectError(topic, "the topic has no readable queue")
        broker_name = names[next(self._turn) % len(names)]
        header = PopMessageRequestHeader(
            consumer_group=self.group,
            topic=topic,
            queue_id=-1,
            max_msg_nums=max_messages,
            invisible_time=int(invisible_duration * 1000),
            poll_time=int(wait * 1000),
            born_time=int(time.time() * 1000),
            init_mode=self._init_mode,
            exp_type="TAG",
            exp=expression,
            order=self.fifo,
        )
        response = await self._call(topic, broker_name, RequestCode.POP_MESSAGE, header, wait)
        if response.code in _NOT_FOUND:
            return []
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return _received(response, topic, broker_name)

    async def ack(self, received: ReceivedMessage) -> None:
        """Acknowledge a message: it is consumed and never delivered again.

        Raises:
            RemoteError: NO_MESSAGE when the handle is stale (the message was delivered again
                since, or acknowledged already); other refusals with their code.
            RpcError: the broker did not answer (the ack may or may not have been taken).
        """
        handle = received.handle
        header = AckMessageRequestHeader(
            consumer_group=self.group,
            topic=received.popped_topic,
            queue_id=handle.queue_id,
            extra_info=received.receipt_handle,
            offset=handle.queue_offset,
        )
        response = await self._call(
            received.popped_topic, handle.broker_name, RequestCode.ACK_MESSAGE, header
        )
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)

    async def ack_batch(self, messages: Sequence[ReceivedMessage]) -> None:
        """Acknowledge many messages: one request per broker group, the groups concurrently.

        A stale handle among them (delivered again since, changed, or acked already) is skipped,
        as RocketMQ's broker does: that message is not acknowledged and is not an error.

        Raises:
            RemoteError: a broker refused its part (its code and remark); the other brokers'
                parts were still sent.
            RpcError: a broker did not answer (its part may or may not have been taken).
        """
        parts = batch_acks(self.group, messages)
        route_by = {m.handle.broker_name: m.popped_topic for m in messages}
        results = await asyncio.gather(
            *(self._batch_ack(route_by[name], name, acks) for name, acks in parts.items()),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _batch_ack(self, topic: str, broker_name: str, acks: list[BatchAck]) -> None:
        body = msgspec.json.encode(BatchAckMessageRequestBody(acks, broker_name))
        response = await self._call(
            topic, broker_name, RequestCode.BATCH_ACK_MESSAGE, None, body=body
        )
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)

    async def change_invisible_duration(self, received: ReceivedMessage, duration: float) -> None:
        """Make a message invisible for `duration` seconds from now; its handle is replaced.

        Raises:
            RemoteError: NO_MESSAGE when the handle is stale; other refusals with their code.
            RpcError: the broker did not answer.
        """
        handle = received.handle
        header = ChangeInvisibleTimeRequestHeader(
            consumer_group=self.group,
            topic=received.popped_topic,
            queue_id=handle.queue_id,
            extra_info=received.receipt_handle,
            offset=handle.queue_offset,
            invisible_time=int(duration * 1000),
        )
        response = await self._call(
            received.popped_topic,
            handle.broker_name,
            RequestCode.CHANGE_MESSAGE_INVISIBLETIME,
            header,
        )
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        fields = response.ext_fields
        received.receipt_handle = str(
            ReceiptHandle(
                handle.ck_queue_offset,
                int(fields["popTime"]),
                int(fields["invisibleTime"]),
                int(fields["reviveQid"]),
                handle.retry,
                handle.broker_name,
                handle.queue_id,
                handle.queue_offset,
            )
        )


def batch_acks(group: str, messages: Sequence[ReceivedMessage]) -> dict[str, list[BatchAck]]:
    """The BATCH_ACK_MESSAGE entries acknowledging `messages`, per broker group.

    One `BatchAck` per (topic, retry, queue, pop checkpoint: start offset, pop time, revive
    queue, invisible time) as the receipt handles carry them (RocketMQ's client merges by retry,
    queue, start offset and pop time); its bit set holds each offset less the start offset.
    """
    found: dict[str, dict[tuple[str, bool, int, int, int, int, int], set[int]]] = {}
    for received in messages:
        h = received.handle
        key = (
            received.popped_topic,
            h.retry,
            h.queue_id,
            h.ck_queue_offset,
            h.pop_time_ms,
            h.revive_qid,
            h.invisible_ms,
        )
        found.setdefault(h.broker_name, {}).setdefault(key, set()).add(h.queue_offset)
    acks: dict[str, list[BatchAck]] = {}
    for broker_name, checkpoints in found.items():
        for (
            topic,
            retry,
            queue_id,
            ck,
            pop_time,
            revive_qid,
            invisible,
        ), offsets in checkpoints.items():
            start = min(ck, *offsets)  # a handle's offset is never below its start; if it were
            ack = BatchAck(
                c=group,
                t=topic,
                r=RETRY_FLAG if retry else NORMAL_FLAG,
                so=start,
                q=queue_id,
                rq=revive_qid,
                pt=pop_time,
                it=invisible,
                b=encode_bit_set(o - start for o in sorted(offsets)),
            )
            acks.setdefault(broker_name, []).append(ack)
    return acks


def _received(response: RemotingCommand, topic: str, broker_name: str) -> list[ReceivedMessage]:
    """A pop answer's messages, each with its receipt handle (RocketMQ `processPopResponse`)."""
    fields = response.ext_fields
    pop_time = int(fields["popTime"])
    invisible = int(fields["invisibleTime"])
    revive_qid = int(fields["reviveQid"])
    starts = parse_info(fields.get("startOffsetInfo"))
    orders = parse_info(fields.get("orderCountInfo"))
    body = response.body or b""
    found: list[ReceivedMessage] = []
    position = 0
    while position < len(body):
        size, _ = peek_record_size(body, position)
        record = decode_record(body, position)
        position += size
        retry = record.topic != topic
        flag = RETRY_FLAG if retry else "0"
        start = int(starts.get(f"{flag}@{record.queue_id}", record.queue_offset))
        handle = ReceiptHandle(
            start,
            pop_time,
            invisible,
            revive_qid,
            retry,
            broker_name,
            record.queue_id,
            record.queue_offset,
        )
        earlier = orders.get(f"{flag}@qo{record.queue_id}%{record.queue_offset}")
        reconsume = int(earlier) if earlier is not None else record.reconsume_times
        message = Message.from_record(record, broker_name)
        message.reconsume_times = reconsume
        found.append(ReceivedMessage(message, str(handle), reconsume + 1, topic))
    return found
