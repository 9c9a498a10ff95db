"""POP consumption requests, and the revive of messages not acknowledged in time.

RocketMQ 5's `PopMessageProcessor`, `AckMessageProcessor`, `ChangeInvisibleTimeProcessor`,
`NotificationProcessor`, `PeekMessageProcessor` and `PollingInfoProcessor`.

The state is `pop.PopState` (pure); these handlers decide with it, apply the event (a master's
metadata log writes it into the replicated commit log) and answer. Only a master serves POP.

- POP_MESSAGE reads up to `maxMsgNums` records, the group's POP retry topic first
  (`%RETRY%<group>_<topic>`, unordered pops only), then the topic's queues (one, or all for
  queue id -1), filtered by tag, and answers with the stored bytes unchanged plus the header
  strings the client builds receipt handles from (`wire/pop.py`). Nothing there and `pollTime`
  set: held until a queue grows or the time passes (`longpoll.py`). A queue never popped starts
  at the group's committed consumer offset, else as `initMode` says.
- ACK_MESSAGE / BATCH_ACK_MESSAGE / CHANGE_MESSAGE_INVISIBLETIME name a delivery by its receipt
  handle; a stale handle (of an earlier delivery) is NO_MESSAGE. Their answer waits until the
  change is replicated (as an offset commit's does), so a failover never loses an ack.
- Pull and POP share the group's consumer offset (RocketMQ does too): every POP change commits
  the lowest unacknowledged offset, so a group switched from one to the other continues there.
- PEEK_MESSAGE reads what a pop would hand out next (from the pop position, or the group's
  committed offset) and changes nothing. POLLING_INFO answers how many pops wait for messages
  of a queue (or of any queue, -1) for a group now. POP_ROLLBACK is RocketMQ 5.3's
  `mqadmin exportPopRecord`: it moves POP records from RocketMQ's RocksDB store to its commit
  log; ferrymq's are always in the commit log (the metadata log), so it writes what is pending,
  waits until it is replicated and answers SUCCESS.
- An admin offset reset (INVOKE_BROKER_TO_RESET_OFFSET, `admin.reset_offset`) moves the pop
  position of each queue the group popped to the reset offset and drops its in-flight messages
  (`reset_pop_offsets`; `pop.py` rule 6). So does an offset committed with
  UPDATE_CONSUMER_OFFSET (the offline reset of `ferry admin offset reset` and of mqadmin's
  resetOffsetByTime when no consumer is online, or a pull consumer of a mixed group) that
  differs from POP's own (`follow_commit`): backwards too, as RocketMQ's pop offset follows the
  offset table once its buffered checkpoints are merged.
- `PopReviver` copies each unordered message whose invisible time ran out to the POP retry topic
  with reconsume times + 1 (the delivery attempt the client sees is that + 1), or to
  `%DLQ%<group>` past the group's `retryMaxTimes` (default `maxReconsumeTimes`, 16), then takes
  it out of flight: a crash between the two delivers it twice, never zero times. Orderly
  messages are delivered again in place, in order; past the limit they go to the DLQ too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass, field
from typing import Final

import msgspec

from ferrymq.broker.metadata import dlq_topic
from ferrymq.broker.pop import Acked, InFlight, PopEvent, Popped, QueueKey, Reset
from ferrymq.broker.pull import tag_codes
from ferrymq.broker.send import put_messages, topic_for_send
from ferrymq.broker.state import BrokerState
from ferrymq.errors import FerryError, InvalidNameError, ProtocolError, RequestError
from ferrymq.model import validate_topic
from ferrymq.rpc.connection import Connection
from ferrymq.store.store import GetStatus
from ferrymq.wire import properties as props
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.pop import (
    MAX_BATCH_ACK_BITS,
    POP_ORDER_REVIVE_QUEUE,
    AckMessageRequestHeader,
    BatchAck,
    BatchAckMessageRequestBody,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    NotificationRequestHeader,
    NotificationResponseHeader,
    PeekMessageRequestHeader,
    PollingInfoRequestHeader,
    PollingInfoResponseHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
    ReceiptHandle,
    format_msg_offset_info,
    format_order_count_info,
    format_start_offset_info,
    pop_retry_topic,
)
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import BatchItem, decode_record

__all__ = [
    "PopReviver",
    "ack_message",
    "batch_ack_message",
    "change_invisible_time",
    "follow_commit",
    "notification",
    "peek_message",
    "polling_info",
    "pop_message",
    "pop_rollback",
    "reset_pop_offsets",
]

log = logging.getLogger(__name__)

REVIVE_QID: Final = 0
"""The revive queue id an unordered pop's handles carry (ferrymq revives from one table)."""
_MAX_POP: Final = 32
_MAX_POLL_S: Final = 60.0
_MIN_INVISIBLE_MS: Final = 100
_REVIVE_TICK_S: Final = 0.2
_ORDERLY_RECHECK_S: Final = 0.2
_REVIVE_BATCH: Final = 256
_BATCH_ACK_BODY: Final = msgspec.json.Decoder(BatchAckMessageRequestBody)


def _check_master(state: BrokerState) -> None:
    if not state.is_master:
        raise RequestError(
            ResponseCode.NO_PERMISSION,
            f"the broker[{state.address}] is a slave: POP is served by the master",
        )


def _real_topic(group: str, topic: str, retry: bool) -> str:
    return pop_retry_topic(group, topic) if retry else topic


def _commit(state: BrokerState, key: QueueKey) -> None:
    """Rule 5 of `pop.py`: the group's consumer offset is POP's lowest unacknowledged offset."""
    committed = state.pop.committed_offset(key)
    if committed is not None:
        group, topic, queue_id = key
        state.offsets.commit(topic, group, queue_id, committed)


def _apply(state: BrokerState, event: PopEvent) -> None:
    state.pop.apply(event)
    _commit(state, (event.group, event.topic, event.queue_id))


async def _replicated(state: BrokerState, what: str) -> None:
    if state.metadata_committed is not None and not await state.metadata_committed():
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"the {what} was not replicated in time; send it again"
        )


@dataclass
class _Popped:
    """What one pop request gathered so far."""

    records: list[bytes] = field(default_factory=list)
    starts: list[tuple[bool, int, int]] = field(default_factory=list)
    offsets: list[tuple[bool, int, list[int]]] = field(default_factory=list)
    orders: list[tuple[bool, int, int, int]] = field(default_factory=list)
    rest: int = 0


_rotation = itertools.count()


def _candidates(
    state: BrokerState, header: PopMessageRequestHeader, orderly: bool
) -> list[tuple[str, int, bool]]:
    """(topic, queue id, retry) in the order this pop reads them."""
    topic = state.topics.get(header.topic)
    if topic is None:
        raise RequestError(
            ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist, apply first please!"
        )
    queues = max(topic.read_queue_nums, 1)
    if header.queue_id >= 0:
        if header.queue_id >= queues:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{header.queue_id}] is illegal, topic:[{header.topic}] "
                f"topicConfig.readQueueNums:[{topic.read_queue_nums}]",
            )
        found = [(header.topic, header.queue_id, False)]
    else:
        start = next(_rotation)
        found = [(header.topic, (start + i) % queues, False) for i in range(queues)]
    retry = pop_retry_topic(header.consumer_group, header.topic)
    retry_config = state.topics.get(retry)
    if not orderly and retry_config is not None:
        found[:0] = [(retry, q, True) for q in range(max(retry_config.read_queue_nums, 1))]
    return found


def _pop_queue(
    state: BrokerState,
    header: PopMessageRequestHeader,
    topic: str,
    queue_id: int,
    retry: bool,
    codes: frozenset[int] | None,
    now_ms: int,
    gathered: _Popped,
) -> None:
    orderly = bool(header.order)
    group = header.consumer_group
    key = (group, topic, queue_id)
    pop = state.pop
    store = state.store
    if orderly and pop.is_blocked(key, now_ms):
        return
    wanted = min(header.max_msg_nums, _MAX_POP) - len(gathered.records)
    redo = pop.redeliveries(key, now_ms)[:wanted] if orderly else []
    records: list[bytes] = []
    offsets: list[int] = []
    for queue_offset in redo:
        got = store.get(topic, queue_id, queue_offset, 1)
        if got.records and got.queue_offsets[0] == queue_offset:
            records.append(got.records[0])
            offsets.append(queue_offset)
        else:  # gone from the store (expired segment): nothing to deliver again
            _apply(state, Acked(group, topic, queue_id, [queue_offset]))
    known = pop.position(key)
    position = known
    minimum = store.min_queue_offset(topic, queue_id)
    maximum = store.max_queue_offset(topic, queue_id)
    committed = state.offsets.query(topic, group, queue_id)
    if position is None:
        if committed is not None:
            position = committed
        else:
            position = minimum if header.init_mode == 0 else maximum
    elif committed is not None and committed > position:
        position = committed  # a pull consumer of the group went further
    position = max(position, minimum)
    next_offset = position
    if len(records) < wanted and position < maximum:
        got = store.get(topic, queue_id, position, wanted - len(records), tags_codes=codes)
        if got.status is GetStatus.FOUND:
            records.extend(got.records)
            offsets.extend(got.queue_offsets)
        next_offset = max(got.next_queue_offset, position)
    gathered.rest += max(maximum - next_offset, 0)
    if not offsets and next_offset == known:
        return
    attempts = [pop.attempt(key, o) for o in offsets]
    pop_time = now_ms  # the answer's popTime: every handle of this pop names it
    invisible = max(header.invisible_time, _MIN_INVISIBLE_MS)
    _apply(
        state,
        Popped(
            group, topic, queue_id, offsets, pop_time, pop_time + invisible, next_offset, orderly
        ),
    )
    if offsets:
        gathered.records.extend(records)
        gathered.starts.append((retry, queue_id, offsets[0]))
        gathered.offsets.append((retry, queue_id, offsets))
        if orderly:
            gathered.orders.extend(
                (retry, queue_id, o, a) for o, a in zip(offsets, attempts, strict=True)
            )


async def pop_message(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """POP_MESSAGE (200050): hand out messages that stay invisible until acknowledged."""
    header = from_ext_fields(PopMessageRequestHeader, request.ext_fields)
    state.check_readable()
    _check_master(state)
    group = state.group_config(header.consumer_group)
    if not group.consume_enable:
        raise RequestError(
            ResponseCode.NO_PERMISSION, f"subscription group no permission, {header.consumer_group}"
        )
    if header.max_msg_nums <= 0 or header.invisible_time <= 0:
        raise RequestError(ResponseCode.SYSTEM_ERROR, "maxMsgNums and invisibleTime must be > 0")
    orderly = bool(header.order)
    _check_revivable(header.consumer_group, header.topic)
    codes = tag_codes(header.exp, header.exp_type)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(max(header.poll_time, 0) / 1000, _MAX_POLL_S)
    while True:
        candidates = _candidates(state, header, orderly)
        # later than any pop time these queues named (pop.py rule 3: no handle names two pops)
        now_ms = state.pop.pop_time(
            [(header.consumer_group, t, q) for t, q, _ in candidates], state.wall_ms()
        )
        gathered = _Popped()
        for topic, queue_id, retry in candidates:
            if len(gathered.records) >= min(header.max_msg_nums, _MAX_POP):
                break
            _pop_queue(state, header, topic, queue_id, retry, codes, now_ms, gathered)
        left = deadline - loop.time()
        if gathered.records or left <= 0 or not state.config.long_polling_enable:
            break
        waits = [(t, q) for t, q, _ in candidates]
        if orderly:  # a held queue frees on an ack or an expiry, not on growth: look again soon
            left = min(left, _ORDERLY_RECHECK_S)
        elif (retry_topic := pop_retry_topic(header.consumer_group, header.topic)) not in {
            t for t, _ in waits
        }:
            waits.append((retry_topic, 0))  # created by the first revive: wake on it too
        polling = state.pop.polling
        polling_key = (header.topic, header.consumer_group, header.queue_id)
        polling[polling_key] = polling.get(polling_key, 0) + 1
        try:
            grew = await _wait_any(state, waits, left)
        finally:
            if (left_waiting := polling[polling_key] - 1) > 0:
                polling[polling_key] = left_waiting
            else:
                del polling[polling_key]
        if not grew and not orderly:
            break
    response = PopMessageResponseHeader(
        pop_time=now_ms,
        invisible_time=max(header.invisible_time, _MIN_INVISIBLE_MS),
        revive_qid=POP_ORDER_REVIVE_QUEUE if orderly else REVIVE_QID,
        rest_num=gathered.rest,
        start_offset_info=format_start_offset_info(gathered.starts) or None,
        msg_offset_info=format_msg_offset_info(gathered.offsets) or None,
        order_count_info=format_order_count_info(gathered.orders) or None,
    )
    code = ResponseCode.SUCCESS if gathered.records else ResponseCode.PULL_NOT_FOUND
    return request.make_response(
        code, ext_fields=to_ext_fields(response), body=b"".join(gathered.records)
    )


def _check_revivable(group: str, topic: str) -> None:
    """Refuse a pop whose messages could not be revived (a retry or DLQ topic name too long)."""
    for name in (pop_retry_topic(group, topic), dlq_topic(group)):
        try:
            validate_topic(name)
        except InvalidNameError as exc:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"cannot pop {topic} for group {group}: messages not acked in time would go to "
                f"{name}, which is not a valid topic name ({exc}); use a shorter group or topic",
            ) from None


async def _wait_any(state: BrokerState, queues: list[tuple[str, int]], timeout: float) -> bool:
    """Wait until any of the queues grows, or `timeout` passes; whether one grew."""
    store = state.store
    waits = [
        asyncio.ensure_future(state.longpoll.wait(t, q, store.max_queue_offset(t, q), timeout))
        for t, q in queues
    ]
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        return any(task.result() for task in done)
    finally:
        for task in waits:
            task.cancel()
        for task in waits:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _handle(text: str) -> ReceiptHandle:
    try:
        return ReceiptHandle.parse(text)
    except ProtocolError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None


def _stale(handle: str) -> RequestError:
    return RequestError(
        ResponseCode.NO_MESSAGE,
        f"receipt handle [{handle}] is stale or unknown: the message was acknowledged, "
        "delivered again since, or never popped here",
    )


async def ack_message(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """ACK_MESSAGE (200051): a popped message is consumed."""
    header = from_ext_fields(AckMessageRequestHeader, request.ext_fields)
    _check_master(state)
    handle = _handle(header.extra_info)
    topic = _real_topic(header.consumer_group, header.topic, handle.retry)
    key = (header.consumer_group, topic, header.queue_id)
    event = state.pop.decide_ack(key, [(header.offset, handle.pop_time_ms)])
    if event is None:
        raise _stale(header.extra_info)
    _apply(state, event)
    await _replicated(state, "ack")
    return request.make_response(ResponseCode.SUCCESS)


async def batch_ack_message(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """BATCH_ACK_MESSAGE (200151): acks of several checkpoints; stale ones are skipped."""
    _check_master(state)
    try:
        body = _BATCH_ACK_BODY.decode(request.body or b"")
    except msgspec.DecodeError as exc:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"bad BatchAckMessageRequestBody: {exc}"
        ) from None
    decoded: list[tuple[BatchAck, list[int]]] = []
    total = 0
    for ack in body.acks:
        try:
            offsets = ack.offsets
        except ProtocolError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        total += len(offsets)
        if total > MAX_BATCH_ACK_BITS:  # one request must not hold the loop for long
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"a batch ack names over {MAX_BATCH_ACK_BITS} offsets"
            )
        decoded.append((ack, offsets))
    for ack, offsets in decoded:
        key = (ack.c, _real_topic(ack.c, ack.t, ack.r == "1"), ack.q)
        event = state.pop.decide_ack(key, [(o, ack.pt) for o in offsets])
        if event is not None:
            _apply(state, event)
    await _replicated(state, "batch ack")
    return request.make_response(ResponseCode.SUCCESS)


async def change_invisible_time(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """CHANGE_MESSAGE_INVISIBLETIME (200053): a new invisible time, and so a new handle."""
    header = from_ext_fields(ChangeInvisibleTimeRequestHeader, request.ext_fields)
    _check_master(state)
    handle = _handle(header.extra_info)
    topic = _real_topic(header.consumer_group, header.topic, handle.retry)
    key = (header.consumer_group, topic, header.queue_id)
    invisible = max(header.invisible_time, 0)
    event = state.pop.decide_change(
        key, header.offset, handle.pop_time_ms, state.wall_ms(), invisible
    )
    if event is None:
        raise _stale(header.extra_info)
    _apply(state, event)
    await _replicated(state, "change of invisible time")
    response = ChangeInvisibleTimeResponseHeader(
        pop_time=event.pop_time_ms, invisible_time=invisible, revive_qid=handle.revive_qid
    )
    return request.make_response(ResponseCode.SUCCESS, ext_fields=to_ext_fields(response))


async def notification(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """NOTIFICATION (200054): whether a pop would find messages, waiting up to `pollTime`."""
    header = from_ext_fields(NotificationRequestHeader, request.ext_fields)
    _check_master(state)
    pop_header = PopMessageRequestHeader(
        consumer_group=header.consumer_group,
        topic=header.topic,
        queue_id=header.queue_id,
        max_msg_nums=1,
        invisible_time=1,
        poll_time=0,
        born_time=header.born_time,
        init_mode=0,
        order=header.order,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(max(header.poll_time, 0) / 1000, _MAX_POLL_S)
    while True:
        candidates = _candidates(state, pop_header, bool(header.order))
        has = any(_has_message(state, header.consumer_group, t, q) for t, q, _ in candidates)
        left = deadline - loop.time()
        if has or left <= 0 or not await _wait_any(state, [(t, q) for t, q, _ in candidates], left):
            break
    response = NotificationResponseHeader(has_msg=has)
    return request.make_response(ResponseCode.SUCCESS, ext_fields=to_ext_fields(response))


def _check_consumable(state: BrokerState, group: str, topic: str, queue_id: int) -> int:
    """RocketMQ's checks of a peek or polling-info request; returns the topic's read queues."""
    state.check_readable()
    config = state.topics.get(topic)
    if config is None:
        raise RequestError(
            ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
        )
    if queue_id >= config.read_queue_nums:
        raise RequestError(
            ResponseCode.INVALID_PARAMETER,
            f"queueId[{queue_id}] is illegal, topic:[{topic}] "
            f"topicConfig.readQueueNums:[{config.read_queue_nums}]",
        )
    found = state.groups.get(group)
    if found is None:
        raise RequestError(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            f"subscription group [{group}] does not exist",
        )
    if not found.consume_enable:
        raise RequestError(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
    return config.read_queue_nums


async def peek_message(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """PEEK_MESSAGE (200052): up to `maxMsgNums` messages a pop would read next; none moves.

    RocketMQ `PeekMessageProcessor`: the group's POP retry topic and the topic's queues (one, or
    all for -1), each from the later of the group's committed offset and its pop position.
    """
    header = from_ext_fields(PeekMessageRequestHeader, request.ext_fields)
    group = header.consumer_group
    queues = _check_consumable(state, group, header.topic, header.queue_id)
    wanted = min(max(header.max_msg_nums, 0), _MAX_POP)
    retry = pop_retry_topic(group, header.topic)
    retry_config = state.topics.get(retry)
    sources = [(retry, q) for q in range(retry_config.read_queue_nums if retry_config else 0)]
    own = [header.queue_id] if header.queue_id >= 0 else range(queues)
    sources += [(header.topic, q) for q in own]
    store = state.store
    records: list[bytes] = []
    rest = 0
    for topic, queue_id in sources:
        committed = state.offsets.query(topic, group, queue_id)
        position = store.min_queue_offset(topic, queue_id) if committed is None else committed
        popped = state.pop.position((group, topic, queue_id))
        position = max(position, popped or 0, store.min_queue_offset(topic, queue_id))
        rest += max(store.max_queue_offset(topic, queue_id) - position, 0)
        if len(records) < wanted:
            got = store.get(topic, queue_id, position, wanted - len(records))
            records += got.records
    response = PopMessageResponseHeader(pop_time=0, invisible_time=0, revive_qid=0, rest_num=rest)
    code = ResponseCode.SUCCESS if records else ResponseCode.PULL_NOT_FOUND
    return request.make_response(code, ext_fields=to_ext_fields(response), body=b"".join(records))


async def polling_info(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """POLLING_INFO (200055): how many pops of the group wait for the queue's messages now.

    RocketMQ `PollingInfoProcessor`; the queue id is the one the pops asked for (-1: any).
    """
    header = from_ext_fields(PollingInfoRequestHeader, request.ext_fields)
    _check_consumable(state, header.consumer_group, header.topic, header.queue_id)
    count = state.pop.polling.get((header.topic, header.consumer_group, header.queue_id), 0)
    response = PollingInfoResponseHeader(polling_num=count)
    return request.make_response(ResponseCode.SUCCESS, ext_fields=to_ext_fields(response))


async def pop_rollback(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """POP_ROLLBACK (200056), RocketMQ 5.3's `exportPopRecord` (module doc).

    RocketMQ sends it to every broker of a cluster and answers SUCCESS where POP has no
    RocksDB store; a slave here holds only what its master's log gave it.
    """
    if state.is_master:
        await _replicated(state, "POP state")
    return request.make_response(ResponseCode.SUCCESS)


def _has_message(state: BrokerState, group: str, topic: str, queue_id: int) -> bool:
    key = (group, topic, queue_id)
    now_ms = state.wall_ms()
    if state.pop.redeliveries(key, now_ms) and state.pop.queues[key].orderly:
        return True
    position = state.pop.position(key)
    if position is None:
        position = state.offsets.query(topic, group, queue_id) or 0
    return position < state.store.max_queue_offset(topic, queue_id)


def reset_pop_offsets(state: BrokerState, group: str, topic: str, offsets: dict[int, int]) -> int:
    """An admin reset the group's offsets in `topic` (queue id -> offset): POP follows.

    Only queues the group popped here change (a queue never popped starts at the committed
    offset anyway). Returns how many in-flight messages were dropped.
    """
    dropped = 0
    for queue_id, queue_offset in sorted(offsets.items()):
        key = (group, topic, queue_id)
        if key in state.pop.queues:
            dropped += state.pop.in_flight_count(key)
            _apply(state, Reset(group, topic, queue_id, queue_offset))
    return dropped


def follow_commit(state: BrokerState, group: str, topic: str, queue_id: int, offset: int) -> bool:
    """An offset committed by UPDATE_CONSUMER_OFFSET: a popped queue resets to it (module doc).

    Nothing changes when the queue was never popped here or POP's committed offset is already
    `offset` (a pull consumer committing what POP did). Returns whether the queue was reset.
    """
    key = (group, topic, queue_id)
    if key not in state.pop.queues or state.pop.committed_offset(key) == offset:
        return False
    _apply(state, Reset(group, topic, queue_id, offset))
    return True


class PopReviver:
    """Revives unacknowledged messages whose invisible time ran out (module doc)."""

    def __init__(self, state: BrokerState) -> None:
        self._state = state
        self.revived = 0
        self.dead_lettered = 0

    async def run(self) -> None:
        """Revive due messages, forever (on a master)."""
        while True:
            if self._state.is_master:
                try:
                    await self.revive_due()
                except FerryError as exc:
                    log.error("POP revive failed, retrying: %s", exc)
            await asyncio.sleep(_REVIVE_TICK_S)

    async def revive_due(self) -> int:
        """One pass: revive (or dead-letter) up to 256 due messages; returns how many.

        A message whose copy cannot be stored now (a full disk, a fenced target) stays in flight
        and is tried again next pass; the others go on.
        """
        state = self._state
        now_ms = state.wall_ms()

        def limit_of(group: str) -> int:
            found = state.groups.get(group)
            return state.config.max_reconsume_times if found is None else found.retry_max_times

        # orderly messages within their limit are delivered again in place by the next pop:
        # left out before the cut, or a FIFO group's idle backlog would fill every pass's list
        due = list(
            itertools.islice(
                (
                    entry
                    for entry in state.pop.expired(now_ms)
                    if not (entry[3] and entry[2].attempt <= limit_of(entry[0][0]))
                ),
                _REVIVE_BATCH * 4,
            )
        )
        done = 0
        for key, queue_offset, inflight, orderly in due:
            if done >= _REVIVE_BATCH:
                break
            limit = limit_of(key[0])
            try:
                await self._revive(key, queue_offset, inflight, orderly, limit)
            except FerryError as exc:
                log.warning("POP: cannot revive %s offset %d yet: %s", key, queue_offset, exc)
                continue
            done += 1
        return done

    async def _revive(
        self, key: QueueKey, queue_offset: int, inflight: InFlight, orderly: bool, limit: int
    ) -> None:
        state = self._state
        group, topic, queue_id = key
        queue = state.pop.queues.get(key)
        if queue is None or queue.inflight.get(queue_offset) != inflight:
            return  # acked or changed while an earlier message of this pass was being copied
        reviving = (key, queue_offset)
        state.pop.reviving.add(reviving)
        try:
            await self._copy(key, queue_offset, inflight, orderly, limit)
        finally:
            state.pop.reviving.discard(reviving)
        # still in flight under the same pop (nothing can ack or change it while it is copied)
        if state.pop.decide_ack(key, [(queue_offset, inflight.pop_time_ms)]) is not None:
            _apply(state, Acked(group, topic, queue_id, [queue_offset]))

    async def _copy(
        self, key: QueueKey, queue_offset: int, inflight: InFlight, orderly: bool, limit: int
    ) -> None:
        """Store the message's copy in the POP retry topic, or in the DLQ past `limit`."""
        state = self._state
        group, topic, queue_id = key
        got = state.store.get(topic, queue_id, queue_offset, 1)
        if got.records and got.queue_offsets[0] == queue_offset:
            record = decode_record(got.records[0])
            reconsume = inflight.attempt if orderly else record.reconsume_times + 1
            properties = dict(record.properties)
            properties.pop(props.PROPERTY_CRC32, None)
            original = properties.setdefault(props.RETRY_TOPIC, topic)
            properties.setdefault(props.ORIGIN_MESSAGE_ID, properties.get(props.UNIQ_KEY, ""))
            dead = orderly or reconsume > limit
            target = dlq_topic(group) if dead else pop_retry_topic(group, original)
            topic_for_send(state, target, 1)
            await put_messages(
                state,
                target,
                0,
                [BatchItem(record.body, encode_properties(properties), record.flag)],
                born_host=record.born_host,
                born_timestamp_ms=record.born_timestamp_ms,
                sys_flag=record.sys_flag,
                reconsume_times=reconsume,
                wait_flush=False,
            )
            if dead:
                self.dead_lettered += 1
            else:
                self.revived += 1
        else:
            log.warning(
                "POP: %s queue %d offset %d expired in flight but is gone from the store",
                topic,
                queue_id,
                queue_offset,
            )
