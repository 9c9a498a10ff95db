"""The producer: send messages to a topic's queues, with retries that never hide an unknown outcome.

- Queues are chosen round-robin over the topic's write queues, avoiding broker groups that failed
  in the last few seconds. A send that surely failed (refused, or never sent) is retried up to
  `retries` times on another queue, preferring another group, after refreshing the route.
- A send to an explicit queue (ordered messages) is never moved to another queue. A queue
  being moved to another broker group (issue 20 section 4) takes it once the move is over:
  the send waits for that (up to `_MOVE_WAIT_S`), then goes to the queue's new group, so
  the queue keeps its order.
- A send whose request left but got no answer raises `SendOutcomeUnknownError`: the message may be
  stored. It is not retried by default, so the SDK never turns one send into two silently.
- Scheduled messages: `delay_level` (RocketMQ 4 levels: 1 s, 5 s, 10 s, 30 s, 1 m, ...), or a
  delivery time (RocketMQ 5 timer messages): `delay_ms` from when the broker stores it
  (TIMER_DELAY_MS, so the producer's clock does not matter), or `deliver_at_ms`, epoch
  milliseconds (TIMER_DELIVER_MS). A time already past delivers at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from types import TracebackType
from typing import Final, Self

from ferrymq.client.credentials import Credentials, with_credentials
from ferrymq.client.message import SendResult
from ferrymq.client.routing import Routes
from ferrymq.errors import (
    ConnectError,
    InvalidMessageError,
    NotCommittedError,
    RpcError,
    SendFailedError,
    SendOutcomeUnknownError,
)
from ferrymq.model import MessageQueue, validate_group, validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.wire import properties as props
from ferrymq.wire.broker import SendMessageRequestHeader, SendMessageRequestHeaderV2
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.msgid import UniqueIdGenerator
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import BatchItem, encode_batch

__all__ = ["Producer"]

log = logging.getLogger(__name__)

_MOVE_WAIT_S: Final = 30.0
"""How long a send to a queue being moved waits for the move to end."""
_MOVE_POLL_S: Final = 0.1
_RETRY_CODES: Final = frozenset(
    {
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.NO_PERMISSION,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.NOT_LEADER_FOR_QUEUE,
    }
)
"""Refusals that mean "not here": another queue or a fresh route may take the message."""

_NOT_COMMITTED_CODES: Final[dict[int, str]] = {
    ResponseCode.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
    ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE",
}
"""Stored, but not as durable as asked: `NotCommittedError`, never a success."""


def _client_ip() -> bytes:
    return bytes([127, 0, 0, 1])


def _check_schedule(delay_level: int, delay_ms: int | None, deliver_at_ms: int | None) -> None:
    if delay_level == 0 and delay_ms is None and deliver_at_ms is None and type(delay_level) is int:
        return  # not scheduled: the common case, checked per send
    for name, value in (
        ("delay_level", delay_level),
        ("delay_ms", delay_ms),
        ("deliver_at_ms", deliver_at_ms),
    ):
        if value is not None and (type(value) is not int or value < 0):
            raise InvalidMessageError(f"{name} must be a non-negative int, not {value!r}")
    chosen = [
        name
        for name, value in (
            ("delay_level", delay_level or None),
            ("delay_ms", delay_ms),
            ("deliver_at_ms", deliver_at_ms),
        )
        if value is not None
    ]
    if len(chosen) > 1:
        raise InvalidMessageError(f"give one of {' and '.join(chosen)}, not both")


class Producer:
    """Sends messages; use as an async context manager (or `start`/`close`)."""

    def __init__(
        self,
        namesrv_addr: str,
        group: str = "DEFAULT_PRODUCER",
        *,
        send_timeout: float = 3.0,
        retries: int = 2,
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
        self._send_timeout = send_timeout
        self._retries = retries
        self._ids = UniqueIdGenerator(_client_ip(), os.getpid())
        self._turn = itertools.count()

    async def start(self) -> None:
        """Nothing to do until the first send; kept for symmetry with consumers."""

    async def close(self) -> None:
        """Close connections (when this producer owns them)."""
        if self._owns_rpc:
            await self._rpc.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues, in a stable order (to pick one by a key's hash)."""
        route = await self.routes.get(validate_topic(topic))
        return list(route.named_write_queues) if route.queue_map else list(route.write_queues)

    def new_msg_id(self) -> str:
        """A fresh unique key in RocketMQ's UNIQ_KEY layout."""
        return self._ids.next_id(time.time_ns() // 1_000_000)

    def _properties(
        self,
        tags: str | None,
        keys: list[str] | str | None,
        properties: dict[str, str] | None,
        delay_level: int,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> dict[str, str]:
        result = dict(properties or {})
        _check_schedule(delay_level, delay_ms, deliver_at_ms)
        if delay_ms is not None:
            result[props.TIMER_DELAY_MS] = str(delay_ms)
        if deliver_at_ms is not None:
            result[props.TIMER_DELIVER_MS] = str(deliver_at_ms)
        if tags:
            result[props.TAGS] = tags
        if keys:
            result[props.KEYS] = keys if isinstance(keys, str) else props.KEY_SEPARATOR.join(keys)
        if delay_level > 0:
            result[props.DELAY_TIME_LEVEL] = str(delay_level)
        result.setdefault(props.UNIQ_KEY, self.new_msg_id())
        result.setdefault(props.WAIT_STORE_MSG_OK, "true")
        return result

    def _choose(self, queues: list[MessageQueue], avoid: str | None) -> MessageQueue:
        """The next queue in turn, avoiding failed groups; `queues` must not be empty."""
        turn = next(self._turn)
        if avoid is None and queues and self.routes.all_healthy:
            return queues[turn % len(queues)]
        healthy = [
            q for q in queues if self.routes.is_healthy(q.broker_name) and q.broker_name != avoid
        ]
        pool = healthy or [q for q in queues if q.broker_name != avoid] or queues
        return pool[turn % len(pool)]

    async def send(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: list[str] | str | None = None,
        properties: dict[str, str] | None = None,
        queue: MessageQueue | None = None,
        delay_level: int = 0,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> SendResult:
        """Send one message and wait until the broker stored it.

        At most one of `delay_level`, `delay_ms` (delivered that many milliseconds after the
        broker stores it) and `deliver_at_ms` (epoch milliseconds) schedules the message.

        Raises:
            InvalidMessageError: a bad schedule (negative, not an int, two kinds at once, or
                further ahead than the broker's `timerMaxDelaySec`); nothing was stored.
            SendFailedError: the message was surely not stored.
            SendOutcomeUnknownError: the request left but no answer came.
            NotCommittedError: stored, but not replicated or flushed in time (a
                `SendOutcomeUnknownError`: it may appear later, or be lost in a failover).
            TopicNotFoundError: the topic has no route.
        """
        validate_topic(topic)
        if (
            tags is None
            and keys is None
            and properties is None
            and delay_level == 0
            and delay_ms is None
            and deliver_at_ms is None
        ):
            # a plain message: its two properties written directly (what `_properties` and
            # `encode_properties` give for it; a unit test holds the two paths equal)
            msg_id = self.new_msg_id()
            encoded = f"{props.UNIQ_KEY}\x01{msg_id}\x02{props.WAIT_STORE_MSG_OK}\x01true\x02"
            return await self._send(
                topic, RequestCode.SEND_MESSAGE_V2, body, encoded.encode(), msg_id, queue
            )
        message_properties = self._properties(
            tags, keys, properties, delay_level, delay_ms, deliver_at_ms
        )
        msg_id = message_properties[props.UNIQ_KEY]
        return await self._send(
            topic,
            RequestCode.SEND_MESSAGE_V2,
            body,
            encode_properties(message_properties),
            msg_id,
            queue,
        )

    async def send_oneway(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: list[str] | str | None = None,
        properties: dict[str, str] | None = None,
        queue: MessageQueue | None = None,
    ) -> str:
        """Send one message without waiting for any answer (RocketMQ `sendOneway`).

        For logs and metrics that may be lost: the broker does not answer, so nothing tells
        whether the message was stored. Returns its unique key (msg id).

        Raises:
            SendFailedError: it could not even be sent (no route, no connection).
            TopicNotFoundError: the topic has no route.
        """
        validate_topic(topic)
        message_properties = self._properties(tags, keys, properties, 0, None, None)
        route = await self.routes.get(topic)
        if queue is None and not route.write_queues:
            raise SendFailedError(f"topic {topic} has no writable queue")
        target = queue if queue is not None else self._choose(route.write_queues, None)
        target = route.send_target(target) or target  # a moving queue: its source refuses
        address = route.master(target.broker_name)
        if address is None and self.routes.refetch_soon(topic):
            address = (await self.routes.get(topic)).master(target.broker_name)
        if address is None:
            raise SendFailedError(f"broker group {target.broker_name} has no master")
        request = self._request(
            topic,
            RequestCode.SEND_MESSAGE_V2,
            target,
            body,
            encode_properties(message_properties),
            False,
            0,
        )
        try:
            await self._rpc.oneway(address, request)
        except RpcError as exc:
            self.routes.mark_failed(target.broker_name)
            raise SendFailedError(f"oneway send to {address} failed: {exc}") from exc
        return message_properties[props.UNIQ_KEY]

    async def send_batch(
        self,
        topic: str,
        bodies: list[bytes],
        *,
        tags: str | None = None,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        """Send several messages to one queue in one request (consecutive queue offsets)."""
        validate_topic(topic)
        items: list[BatchItem] = []
        first_id = ""
        for body in bodies:
            item_properties = self._properties(tags, None, None, 0)
            first_id = first_id or item_properties[props.UNIQ_KEY]
            items.append(BatchItem.of(body, item_properties))
        return await self._send(
            topic,
            RequestCode.SEND_BATCH_MESSAGE,
            encode_batch(items),
            b"",
            first_id,
            queue,
            batch=True,
        )

    async def _send(
        self,
        topic: str,
        code: int,
        body: bytes,
        properties: bytes,
        msg_id: str,
        queue: MessageQueue | None,
        *,
        batch: bool = False,
        sys_flag: int = 0,
    ) -> SendResult:
        avoid: str | None = None
        last_failure = "no attempt"
        attempts = 1 if queue is not None else 1 + self._retries
        move_deadline = time.monotonic() + _MOVE_WAIT_S
        attempt = -1
        while attempt + 1 < attempts:
            attempt += 1
            route = (attempt == 0 and self.routes.fresh(topic)) or await self.routes.get(
                topic, refresh=attempt > 0
            )
            if queue is None and not route.write_queues:
                # every group read-only in this route (drained, or a master in a switchover):
                # the next attempt, and the next send, ask the NameServers again
                last_failure = f"topic {topic} has no writable queue"
                self.routes.invalidate(topic)
                continue
            chosen = queue if queue is not None else self._choose(route.write_queues, avoid)
            target = route.send_target(chosen)
            if target is None:  # the queue is being moved: wait for its new group
                last_failure = f"queue {chosen.queue_id} of {chosen.broker_name} is being moved"
                if time.monotonic() >= move_deadline:
                    break
                await asyncio.sleep(_MOVE_POLL_S)
                self.routes.invalidate(topic)
                attempt -= 1
                continue
            address = route.master(target.broker_name)
            if address is None and self.routes.refetch_soon(topic):
                # the route may predate the election: ask again now, not at the next refresh
                address = (await self.routes.get(topic)).master(target.broker_name)
            if address is None:
                last_failure = f"broker group {target.broker_name} has no master"
                self.routes.mark_failed(target.broker_name)
                avoid = target.broker_name
                continue
            request = self._request(topic, code, target, body, properties, batch, sys_flag)
            try:
                response = await self._rpc.call(address, request, self._send_timeout)
            except ConnectError as exc:
                last_failure = str(exc)
                self.routes.mark_failed(target.broker_name)
                avoid = target.broker_name
                continue
            except RpcError as exc:
                self.routes.mark_failed(target.broker_name)
                # a master that stopped answering may have been replaced: the next send asks
                # the NameServers again instead of waiting for the periodic refresh
                self.routes.invalidate(topic)
                raise SendOutcomeUnknownError(str(exc), msg_id) from exc
            status = _NOT_COMMITTED_CODES.get(response.code)
            if status is not None:
                raise NotCommittedError(
                    f"{address} stored it as {target} offset "
                    f"{response.ext_fields.get('queueOffset', '?')} but answered {status}: "
                    f"{response.remark}",
                    msg_id,
                    status,
                )
            if response.code == ResponseCode.SUCCESS:
                return SendResult(
                    msg_id=msg_id,
                    offset_msg_id=response.ext_fields.get("msgId", ""),
                    queue=chosen,  # the logical queue: its offsets are the same everywhere
                    queue_offset=int(response.ext_fields.get("queueOffset", "-1")),
                    transaction_id=response.ext_fields.get("transactionId"),
                )
            last_failure = f"{address} refused: {response.remark} (code {response.code})"
            if response.code == ResponseCode.MESSAGE_ILLEGAL:
                raise InvalidMessageError(f"send to {topic} refused: {response.remark}")
            if response.code not in _RETRY_CODES:
                break
            self.routes.invalidate(topic)
            if (
                queue is not None
                and response.code == ResponseCode.NO_PERMISSION
                and "sealed" in (response.remark or "")
                and time.monotonic() < move_deadline
            ):
                # a route older than a move: the queue's old group sealed it
                await asyncio.sleep(_MOVE_POLL_S)
                attempt -= 1
                continue
            avoid = target.broker_name
        raise SendFailedError(f"send to {topic} failed: {last_failure}")

    def _request(
        self,
        topic: str,
        code: int,
        queue: MessageQueue,
        body: bytes,
        properties: bytes,
        batch: bool,
        sys_flag: int,
    ) -> RemotingCommand:
        born_timestamp = time.time_ns() // 1_000_000
        if code == RequestCode.SEND_MESSAGE_V2 and not batch:
            # the hot path: SendMessageRequestHeaderV2's extFields written directly (a header
            # object and its flattening cost a fifth of a send's client CPU); a unit test
            # (tests/unit/client/test_send_request.py) checks it equals the header's flattening
            fields = {
                "a": self.group,
                "b": topic,
                "c": "TBW102",
                "d": "4",
                "e": str(queue.queue_id),
                "f": str(sys_flag),
                "g": str(born_timestamp),
                "h": "0",
            }
            if properties:
                fields["i"] = properties.decode()
            return RemotingCommand(code=code, ext_fields=fields, body=body)
        header = SendMessageRequestHeader(
            producer_group=self.group,
            topic=topic,
            default_topic="TBW102",
            default_topic_queue_nums=4,
            queue_id=queue.queue_id,
            sys_flag=sys_flag,
            born_timestamp=born_timestamp,
            flag=0,
            properties=properties.decode() if properties else None,
            batch=batch or None,
        )
        fields = (
            to_ext_fields(SendMessageRequestHeaderV2.from_v1(header))
            if code == RequestCode.SEND_MESSAGE_V2
            else to_ext_fields(header)
        )
        return RemotingCommand(code=code, ext_fields=fields, body=body)
