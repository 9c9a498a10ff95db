"""The push consumer: a group's queues shared among its clients, messages handed to a listener.

RocketMQ's `DefaultMQPushConsumer`, in asyncio:
- clustering: each client of the group gets an even share of every subscribed topic's queues
  (`AllocateMessageQueueAveragely`), recomputed when the broker says the group changed
  (NOTIFY_CONSUMER_IDS_CHANGED) and every `rebalance_interval`; broadcasting: every client reads
  every queue and keeps its offsets itself;
- one long-polling pull loop per owned queue, paused while the queue has `max_cached_messages`
  or `max_cached_bytes` waiting (flow control);
- concurrent listeners run up to `concurrency` messages at once; an orderly consumer locks its
  queues at the broker and handles each queue's messages one at a time, in order;
- a listener that raises asks for the message again: concurrent consumers send it back to the
  broker (`%RETRY%<group>`, later, up to `max_reconsume_times`, then the DLQ); orderly consumers
  retry it in place after `suspend` seconds, then dead-letter it;
- the committed offset of a queue is the lowest offset still being processed (or the next one to
  pull): messages are never skipped, and after a crash or rebalance only messages handled since
  the last commit come again. Offsets are committed every `commit_interval` and on `close`;
- GET_CONSUMER_RUNNING_INFO (mqadmin consumerStatus, through the broker) is answered with
  RocketMQ's `ConsumerRunningInfo`: properties, subscriptions and each owned queue's state;
- CONSUME_MESSAGE_DIRECTLY (the Dashboard's resend, through the broker) runs the listener on
  the message once more and answers RocketMQ's `ConsumeMessageDirectlyResult`; it commits
  nothing;
- an online offset reset (mqadmin resetOffsetByTime: the broker pushes RESET_CONSUMER_CLIENT_OFFSET
  with the new offsets) drops the named queues without committing their old position and
  starts them again at the new offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Self

from ferrymq.client.consumer import PullConsumer, PullStatus, decode_messages
from ferrymq.client.message import Message
from ferrymq.errors import FerryError
from ferrymq.model import MessageQueue, validate_group, validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.security.acl import credentials_of
from ferrymq.wire.bodies import (
    ConsumeMessageDirectlyResult,
    ConsumerData,
    ConsumerIdList,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueueBody,
    SubscriptionData,
    decode_body,
    decode_reset_offsets,
    encode_body,
    encode_directly_result,
)
from ferrymq.wire.broker import (
    ConsumeMessageDirectlyResultRequestHeader,
    ConsumerSendMsgBackRequestHeader,
    GetConsumerListByGroupRequestHeader,
    ResetOffsetRequestHeader,
    UnregisterClientRequestHeader,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.fastjson import encode_object_map, encode_sorted, mq_key
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields

__all__ = ["ConsumeFrom", "MessageModel", "PushConsumer", "allocate_average"]

log = logging.getLogger(__name__)

Listener = Callable[[Message], Awaitable[None]]


class MessageModel(StrEnum):
    """How a group shares its topics."""

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFrom(StrEnum):
    """Where a queue with no committed offset starts."""

    LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


def allocate_average(
    queues: list[MessageQueue], client_ids: list[str], me: str
) -> list[MessageQueue]:
    """RocketMQ's `AllocateMessageQueueAveragely`: contiguous, even shares, extras to the first."""
    if me not in client_ids or not queues:
        return []
    ordered = sorted(queues)
    clients = sorted(client_ids)
    index = clients.index(me)
    share, extra = divmod(len(ordered), len(clients))
    size = share + (1 if index < extra else 0)
    start = index * share + min(index, extra)
    return ordered[start : start + size]


def _reset_offsets_of(request: RemotingCommand, group: str) -> dict[MessageQueue, int]:
    """The queues and offsets of a RESET_CONSUMER_CLIENT_OFFSET for `group` (else nothing)."""
    try:
        header = from_ext_fields(ResetOffsetRequestHeader, request.ext_fields)
        if header.group != group:
            return {}
        offsets = decode_reset_offsets(request.body)
    except FerryError as exc:
        log.warning("ignored a bad offset reset for %s: %s", group, exc)
        return {}
    return {MessageQueue(t, b, q): offset for (t, b, q), offset in offsets.items()}


@dataclass(eq=False)
class _QueueState:
    queue: MessageQueue
    next_offset: int
    processing: set[int] = field(default_factory=set)
    cached_bytes: int = 0
    committed: int = -1
    dropped: bool = False
    locked: bool = False
    room: asyncio.Event = field(default_factory=asyncio.Event)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    ordered: asyncio.Queue[Message] | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    last_pull_ms: int = 0
    last_consume_ms: int = 0

    @property
    def commit_offset(self) -> int:
        """Everything below this offset has been handled."""
        return min(self.processing) if self.processing else self.next_offset


class PushConsumer:
    """Consumes subscribed topics as one client of a group; use as an async context manager."""

    def __init__(
        self,
        namesrv_addr: str,
        group: str,
        listener: Listener,
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET,
        consume_timestamp_ms: int = 0,
        orderly: bool = False,
        concurrency: int = 20,
        max_cached_messages: int = 1000,
        max_cached_bytes: int = 64 * 1024 * 1024,
        pull_batch: int = 32,
        pull_wait: float = 5.0,
        commit_interval: float = 5.0,
        heartbeat_interval: float = 10.0,
        rebalance_interval: float = 10.0,
        max_reconsume_times: int = 16,
        suspend: float = 1.0,
        drain_timeout: float = 30.0,
        client_id: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        """`access_key`/`secret_key`: sign every request (ACL 1.0, issue 23)."""
        self.group = validate_group(group)
        self.listener = listener
        self.message_model = message_model
        self.consume_from = consume_from
        self.consume_timestamp_ms = consume_timestamp_ms
        self.orderly = orderly
        self._namesrv_addr = namesrv_addr
        self._concurrency = concurrency
        self._started_ms = 0
        self.client_id = client_id or f"127.0.0.1@{os.getpid()}#{random.getrandbits(32):08x}"
        self._rpc = RpcClient(self._on_push, credentials=credentials_of(access_key, secret_key))
        self._puller = PullConsumer(namesrv_addr, group, rpc=self._rpc, request_timeout=5.0)
        self._subscriptions: dict[str, str] = {}
        self._states: dict[MessageQueue, _QueueState] = {}
        self._local_offsets: dict[MessageQueue, int] = {}
        self._slots = asyncio.Semaphore(concurrency)
        self._max_cached_messages = max_cached_messages
        self._max_cached_bytes = max_cached_bytes
        self._pull_batch = pull_batch
        self._pull_wait = pull_wait
        self._commit_interval = commit_interval
        self._heartbeat_interval = heartbeat_interval
        self._rebalance_interval = rebalance_interval
        self._max_reconsume_times = max_reconsume_times
        self._suspend = suspend
        self._drain_timeout = drain_timeout
        self._rebalance_now = asyncio.Event()
        self._membership = asyncio.Lock()
        """Held by a rebalance and by an offset reset: each sees the other's queues whole."""
        self._reset_offsets: dict[MessageQueue, int] = {}
        """Offsets a reset gave, taken by the next start of those queues."""
        self._loops: list[asyncio.Task[None]] = []
        self._resets: set[asyncio.Task[None]] = set()
        self._closing = False
        self.consumed = 0
        """Messages the listener handled successfully."""

    # ------------------------------------------------------------------ public API

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume `topic`, filtered by a tag expression (`TagA || TagB`, or `*`)."""
        self._subscriptions[validate_topic(topic)] = expression

    @property
    def assigned(self) -> list[MessageQueue]:
        """Queues this client consumes now."""
        return sorted(q for q, s in self._states.items() if not s.dropped)

    async def start(self) -> None:
        """Join the group and start consuming."""
        if not self._subscriptions:
            raise ValueError("subscribe to at least one topic before start()")
        if self.message_model is MessageModel.CLUSTERING:
            self._subscriptions.setdefault(f"%RETRY%{self.group}", "*")
        self._started_ms = int(time.time() * 1000)
        await self._heartbeat()
        await self._rebalance()
        for work in (self._heartbeat_loop(), self._rebalance_loop(), self._commit_loop()):
            self._loops.append(asyncio.get_running_loop().create_task(work))

    async def close(self) -> None:
        """Stop pulling, let running listeners finish, commit, leave the group."""
        self._closing = True
        for task in [*self._loops, *self._resets]:
            task.cancel()
        for task in [*self._loops, *self._resets]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for state in list(self._states.values()):
            await self._drop(state)
        await self._unregister()
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

    # ------------------------------------------------------------------ group membership

    async def _on_push(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        if request.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            self._rebalance_now.set()
            return None
        if request.code == RequestCode.GET_CONSUMER_RUNNING_INFO:
            return request.make_response(ResponseCode.SUCCESS, body=self.running_info())
        if request.code == RequestCode.CONSUME_MESSAGE_DIRECTLY:
            return await self._consume_directly(request)
        if request.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            offsets = _reset_offsets_of(request, self.group)
            if offsets:
                task = asyncio.get_running_loop().create_task(self._reset(offsets))
                self._resets.add(task)
                task.add_done_callback(self._resets.discard)
            return None  # RocketMQ's client answers nothing (the broker sends it oneway)
        return request.make_response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark="not served")

    async def _consume_directly(self, request: RemotingCommand) -> RemotingCommand:
        """CONSUME_MESSAGE_DIRECTLY (309): run the listener on the message the broker sent.

        RocketMQ's `consumeMessageDirectly` (ConsumeMessageConcurrentlyService and
        OrderlyService): the answer is a `ConsumeMessageDirectlyResult`; no offset is
        committed, nothing is sent back and `consumed` does not count it. A listener that
        raises is CR_THROW_EXCEPTION with the error as remark.
        """
        header = from_ext_fields(ConsumeMessageDirectlyResultRequestHeader, request.ext_fields)
        if header.consumer_group != self.group:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                remark=f"The Consumer Group <{header.consumer_group}> not exist in this consumer",
            )
        try:
            (message,) = decode_messages(request.body, header.broker_name or "")
        except (FerryError, ValueError) as exc:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR, remark=f"the message does not decode: {exc}"
            )
        result = ConsumeMessageDirectlyResult(order=self.orderly)
        started = time.monotonic()
        try:
            await self.listener(message)
            result.consume_result = "CR_SUCCESS"
        except Exception as exc:  # noqa: BLE001 - the failure is the answer
            result.consume_result = "CR_THROW_EXCEPTION"
            result.remark = f"{type(exc).__name__}: {exc}"
        result.spent_time_mills = int((time.monotonic() - started) * 1000)
        return request.make_response(ResponseCode.SUCCESS, body=encode_directly_result(result))

    def running_info(self) -> bytes:
        """RocketMQ's `ConsumerRunningInfo` of this client, as FastJSON writes it.

        Properties (consume type, orderly, concurrency, start time, NameServers), subscriptions,
        and per owned queue a `ProcessQueueInfo` (commit offset, cached messages, lock, last
        pull and consume times). `statusTable` (pull/consume RT and TPS) is not kept: empty.
        """
        properties = {
            "PROP_CLIENT_VERSION": "ferrymq",
            "PROP_CONSUMEORDERLY": "true" if self.orderly else "false",
            "PROP_CONSUMER_START_TIMESTAMP": str(self._started_ms),
            "PROP_CONSUME_TYPE": "CONSUME_PASSIVELY",
            "PROP_NAMESERVER_ADDR": self._namesrv_addr,
            "PROP_THREADPOOL_CORE_SIZE": str(self._concurrency),
            "consumerGroup": self.group,
            "messageModel": self.message_model.value,
            "pullBatchSize": str(self._pull_batch),
        }
        subscriptions = [
            SubscriptionData(topic=topic, sub_string=expression)
            for topic, expression in sorted(self._subscriptions.items())
        ]
        queues = []
        for queue, state in sorted(self._states.items()):
            if state.dropped:
                continue
            info: dict[str, object] = {
                "cachedMsgCount": len(state.processing),
                "cachedMsgSizeInMiB": state.cached_bytes // (1024 * 1024),
                "commitOffset": state.commit_offset,
                "droped": False,  # RocketMQ's spelling
                "lastConsumeTimestamp": state.last_consume_ms,
                "lastPullTimestamp": state.last_pull_ms,
                "locked": state.locked,
            }
            if state.processing:
                info["cachedMsgMaxOffset"] = max(state.processing)
                info["cachedMsgMinOffset"] = min(state.processing)
            queues.append((mq_key(queue.topic, queue.broker_name, queue.queue_id), info))
        return (
            b'{"mqTable":'
            + encode_object_map(queues)
            + b',"properties":'
            + encode_sorted(properties)
            + b',"statusTable":{},"subscriptionSet":'
            + encode_sorted(subscriptions)
            + b"}"
        )

    async def _brokers(self) -> set[str]:
        addresses: set[str] = set()
        for topic in self._subscriptions:
            try:
                route = await self._puller.routes.get(topic)
            except FerryError:
                continue
            addresses |= {addr for addr in (route.master(b) for b in route.brokers) if addr}
        return addresses

    def _heartbeat_body(self) -> bytes:
        data = HeartbeatData(
            client_id=self.client_id,
            consumer_data_set=[
                ConsumerData(
                    group_name=self.group,
                    message_model=self.message_model.value,
                    consume_from_where=self.consume_from.value,
                    subscription_data_set=[
                        SubscriptionData(topic=t, sub_string=e)
                        for t, e in sorted(self._subscriptions.items())
                    ],
                )
            ],
        )
        return encode_body(data)

    async def _heartbeat(self) -> None:
        body = self._heartbeat_body()
        for address in await self._brokers():
            try:
                await self._rpc.call(
                    address, RemotingCommand(code=RequestCode.HEART_BEAT, body=body), 5.0
                )
            except FerryError as exc:
                log.warning("heartbeat to %s failed: %s", address, exc)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_interval)
            await self._heartbeat()

    async def _unregister(self) -> None:
        header = to_ext_fields(
            UnregisterClientRequestHeader(client_i_d=self.client_id, consumer_group=self.group)
        )
        for address in await self._brokers():
            with contextlib.suppress(FerryError):
                await self._rpc.call(
                    address,
                    RemotingCommand(code=RequestCode.UNREGISTER_CLIENT, ext_fields=dict(header)),
                    2.0,
                )

    async def _client_ids(self, topic: str) -> list[str]:
        route = await self._puller.routes.get(topic)
        header = to_ext_fields(GetConsumerListByGroupRequestHeader(consumer_group=self.group))
        for broker_name in sorted(route.brokers):
            address = route.master(broker_name)
            if address is None:
                continue
            try:
                response = await self._rpc.call(
                    address,
                    RemotingCommand(
                        code=RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields=dict(header)
                    ),
                    5.0,
                )
            except FerryError:
                continue
            if response.code == ResponseCode.SUCCESS:
                return decode_body(response.body, ConsumerIdList).consumer_id_list
        return []

    # ------------------------------------------------------------------ rebalance

    async def _rebalance_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._rebalance_interval):
                    await self._rebalance_now.wait()
            self._rebalance_now.clear()
            try:
                async with self._membership:
                    await self._rebalance()
            except FerryError as exc:
                log.warning("rebalance of %s failed: %s", self.group, exc)

    async def _rebalance(self) -> None:
        wanted: set[MessageQueue] = set()
        for topic in list(self._subscriptions):
            try:
                queues = await self._puller.queues(topic)
            except FerryError as exc:
                log.debug("no route for %s yet: %s", topic, exc)
                continue
            if self.message_model is MessageModel.BROADCASTING:
                wanted |= set(queues)
            else:
                wanted |= set(
                    allocate_average(queues, await self._client_ids(topic), self.client_id)
                )
        for queue in [q for q in self._states if q not in wanted]:
            await self._drop(self._states.pop(queue))
        for queue in sorted(wanted - set(self._states)):
            try:
                offset = await self._initial_offset(queue)
            except FerryError as exc:
                # e.g. no master in the group's route during a failover: the others start now,
                # this one at a rebalance a second from now
                log.warning("cannot start %s of %s yet: %s", queue, self.group, exc)
                asyncio.get_running_loop().call_later(1.0, self._rebalance_now.set)
                continue
            state = _QueueState(queue, offset, committed=offset)
            state.room.set()
            if self.orderly:
                state.ordered = asyncio.Queue()
                state.tasks.append(
                    asyncio.get_running_loop().create_task(self._consume_in_order(state))
                )
            state.tasks.append(asyncio.get_running_loop().create_task(self._pull_loop(state)))
            self._states[queue] = state
            log.info(
                "%s consumes %s/%s/%d from offset %d",
                self.client_id,
                queue.topic,
                queue.broker_name,
                queue.queue_id,
                offset,
            )
        if self.orderly:
            await self._lock_all()

    async def _initial_offset(self, queue: MessageQueue) -> int:
        if queue in self._reset_offsets:
            return self._reset_offsets.pop(queue)
        if self.message_model is MessageModel.BROADCASTING:
            known = self._local_offsets.get(queue)
        else:
            known = await self._puller.committed(queue)
        if known is not None:
            return known
        if queue.topic.startswith("%RETRY%") or self.consume_from is ConsumeFrom.FIRST_OFFSET:
            return await self._puller.min_offset(queue)
        if self.consume_from is ConsumeFrom.TIMESTAMP:
            return await self._puller.offset_for_time(queue, self.consume_timestamp_ms)
        return await self._puller.max_offset(queue)

    async def _reset(self, offsets: dict[MessageQueue, int]) -> None:
        """Start the named queues again at the given offsets (an online offset reset).

        Their pull loops stop and nothing of their old position is committed; the new offsets
        are committed (the broker already holds them), then the queues start again there.
        """
        async with self._membership:
            for queue, offset in offsets.items():
                state = self._states.pop(queue, None)
                if state is not None:
                    await self._drop(state, commit=False)
                self._reset_offsets[queue] = offset
                done = _QueueState(queue, offset, committed=-1)
                await self._commit(done)
                log.info(
                    "%s: offset of %s/%s/%d reset to %d",
                    self.group,
                    queue.topic,
                    queue.broker_name,
                    queue.queue_id,
                    offset,
                )
            try:
                await self._rebalance()
            except FerryError as exc:  # the rebalance loop starts them within a second
                log.warning("rebalance after the offset reset of %s failed: %s", self.group, exc)
                asyncio.get_running_loop().call_later(1.0, self._rebalance_now.set)
            # queues this client does not own now: their owner starts them from the commit
            for queue in offsets:
                if queue not in self._states:
                    self._reset_offsets.pop(queue, None)

    async def _drop(self, state: _QueueState, *, commit: bool = True) -> None:
        state.dropped = True
        state.room.set()
        for task in state.tasks:
            task.cancel()
        for task in state.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if state.processing:  # let running listeners finish their messages
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._drain_timeout):
                    await state.idle.wait()
        if commit:
            await self._commit(state)
        if self.orderly and state.locked:
            await self._lock_request(RequestCode.UNLOCK_BATCH_MQ, [state.queue])

    # ------------------------------------------------------------------ pulling

    async def _pull_loop(self, state: _QueueState) -> None:
        expression = self._subscriptions.get(state.queue.topic, "*")
        while not state.dropped:
            if (
                len(state.processing) >= self._max_cached_messages
                or state.cached_bytes >= self._max_cached_bytes
            ):
                state.room.clear()
                await state.room.wait()
                continue
            if self.orderly and not state.locked:
                await asyncio.sleep(self._suspend)
                continue
            try:
                result = await self._puller.pull(
                    state.queue,
                    state.next_offset,
                    max_messages=self._pull_batch,
                    expression=expression,
                    wait=self._pull_wait,
                )
            except FerryError as exc:
                log.debug("pull %s failed: %s", state.queue, exc)
                self._puller.routes.invalidate(state.queue.topic)
                await asyncio.sleep(1.0)
                continue
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning(
                    "offset %d of %s is illegal; moving to %d",
                    state.next_offset,
                    state.queue,
                    result.next_offset,
                )
                state.next_offset = result.next_offset
                continue
            for message in result.messages:
                state.idle.clear()
                state.processing.add(message.queue_offset)
                state.cached_bytes += len(message.body)
                if state.ordered is not None:
                    state.ordered.put_nowait(message)
                else:
                    await self._slots.acquire()
                    task = asyncio.get_running_loop().create_task(self._consume_one(state, message))
                    task.add_done_callback(lambda _: self._slots.release())
            state.next_offset = max(state.next_offset, result.next_offset)
            state.last_pull_ms = int(time.time() * 1000)

    def _done(self, state: _QueueState, message: Message) -> None:
        state.last_consume_ms = int(time.time() * 1000)
        state.processing.discard(message.queue_offset)
        state.cached_bytes -= len(message.body)
        state.room.set()
        if not state.processing:
            state.idle.set()

    async def _consume_one(self, state: _QueueState, message: Message) -> None:
        """Handle one message until it succeeds or is sent back for a later retry.

        If it can be neither (the broker is unreachable), it stays unacknowledged: its offset
        holds the queue's commit offset back, so whoever owns the queue next gets it again.
        """
        while True:
            try:
                await self.listener(message)
                self.consumed += 1
                break
            except Exception as exc:  # noqa: BLE001 - a listener failure asks for redelivery
                log.info("listener failed on %s (%s); sending it back", message.msg_id, exc)
                if await self._send_back(message, 0):
                    break
                if state.dropped:
                    return
                await asyncio.sleep(self._suspend)
        self._done(state, message)

    async def _consume_in_order(self, state: _QueueState) -> None:
        assert state.ordered is not None
        while True:
            message = await state.ordered.get()
            attempts = 0
            while True:
                try:
                    await self.listener(message)
                    self.consumed += 1
                    break
                except Exception as exc:  # noqa: BLE001 - a listener failure asks for a retry
                    attempts += 1
                    if attempts > self._max_reconsume_times:
                        log.warning(
                            "giving %s up after %d attempts: dead-lettered",
                            message.msg_id,
                            attempts,
                        )
                        await self._send_back(message, -1)
                        break
                    log.info("listener failed on %s (%s); retrying in order", message.msg_id, exc)
                    await asyncio.sleep(self._suspend)
            self._done(state, message)

    async def _send_back(self, message: Message, delay_level: int) -> bool:
        """CONSUMER_SEND_MSG_BACK to the broker that holds the message; False if not done."""
        header = ConsumerSendMsgBackRequestHeader(
            offset=message.log_offset,
            group=self.group,
            delay_level=delay_level,
            origin_msg_id=message.msg_id,
            origin_topic=message.topic,
            max_reconsume_times=self._max_reconsume_times,
        )
        address = self._puller.routes.master_of(message.broker_name)
        if address is None:
            return False
        try:
            response = await self._rpc.call(
                address,
                RemotingCommand(
                    code=RequestCode.CONSUMER_SEND_MSG_BACK, ext_fields=to_ext_fields(header)
                ),
                5.0,
            )
        except FerryError as exc:
            log.warning("could not send %s back: %s", message.msg_id, exc)
            return False
        return response.code == ResponseCode.SUCCESS

    # ------------------------------------------------------------------ orderly locks

    async def _lock_request(self, code: int, queues: list[MessageQueue]) -> list[MessageQueue]:
        locked: list[MessageQueue] = []
        by_broker: dict[str, list[MessageQueue]] = {}
        for queue in queues:
            by_broker.setdefault(queue.broker_name, []).append(queue)
        for broker_name, group_queues in by_broker.items():
            route = await self._puller.routes.get(group_queues[0].topic)
            address = route.master(broker_name)
            if address is None:
                continue
            body = LockBatchRequestBody(
                consumer_group=self.group,
                client_id=self.client_id,
                mq_set=[
                    MessageQueueBody(topic=q.topic, broker_name=q.broker_name, queue_id=q.queue_id)
                    for q in group_queues
                ],
            )
            try:
                response = await self._rpc.call(
                    address, RemotingCommand(code=code, body=encode_body(body)), 5.0
                )
            except FerryError:
                continue
            if code == RequestCode.LOCK_BATCH_MQ and response.code == ResponseCode.SUCCESS:
                granted = decode_body(response.body, LockBatchResponseBody).lock_o_k_m_q_set
                locked += [MessageQueue(q.topic, q.broker_name, q.queue_id) for q in granted]
        return locked

    async def _lock_all(self) -> None:
        queues = [q for q, s in self._states.items() if not s.dropped]
        locked = (
            set(await self._lock_request(RequestCode.LOCK_BATCH_MQ, queues)) if queues else set()
        )
        for queue, state in self._states.items():
            state.locked = queue in locked

    # ------------------------------------------------------------------ offsets

    async def _commit(self, state: _QueueState) -> None:
        offset = state.commit_offset
        if offset == state.committed:
            return
        if self.message_model is MessageModel.BROADCASTING:
            self._local_offsets[state.queue] = offset
            state.committed = offset
            return
        try:
            await self._puller.commit(state.queue, offset)
            state.committed = offset
        except FerryError as exc:
            log.warning("commit of %s at %d failed: %s", state.queue, offset, exc)

    async def commit_now(self) -> None:
        """Commit every queue's offset now."""
        for state in list(self._states.values()):
            await self._commit(state)

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self._commit_interval)
            await self.commit_now()
            if self.orderly:
                await self._lock_all()
