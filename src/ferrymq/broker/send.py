"""SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and CONSUMER_SEND_MSG_BACK.

Behaviour (RocketMQ `SendMessageProcessor`, `AbstractSendMessageProcessor.msgCheck`,
`CommitLog.asyncPutMessage`):
- the broker must be writable; system topics are refused; the topic must exist, or be a retry
  topic, or be auto-created from TBW102 when `autoCreateTopicEnable`;
- a queue id beyond the topic's queues is refused; a negative one picks a queue;
- a message with a DELAY level goes to SCHEDULE_TOPIC_XXXX (queue = level - 1) and comes back
  on time (`schedule.py`); one with a delivery time in the future (RocketMQ 5's TIMER_DELIVER_MS,
  TIMER_DELAY_SEC or TIMER_DELAY_MS, relative ones from the broker's clock) goes to the timer
  topic until then (`timer.py`), and one that asks for more than `timerMaxDelaySec` or carries a
  value that is not a whole number is refused with MESSAGE_ILLEGAL; a PREPARED transaction
  message goes to the half topic (`transactions`);
- a retried message that used up its reconsume times goes to the group's DLQ;
- with SYNC_FLUSH the answer waits for the fsync; a timeout answers FLUSH_DISK_TIMEOUT (the
  message is stored, its durability unknown).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import random
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from ferrymq import testbugs
from ferrymq.broker.fence import (
    FENCED_ATTRIBUTE,
    InvalidFenceRecordError,
    decide,
    is_fenced,
    parse_record,
)
from ferrymq.broker.metadata import (
    DEFAULT_TOPIC,
    DLQ_GROUP_PREFIX,
    METADATA_TOPIC,
    RETRY_GROUP_PREFIX,
    SCHEDULE_TOPIC,
    SINK_TOPIC,
    TIMER_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    dlq_topic,
    retry_topic,
)
from ferrymq.broker.metrics import LATENCY_SAMPLE_EVERY
from ferrymq.broker.queuemap import check_send, open_queue_for
from ferrymq.broker.state import BrokerState
from ferrymq.broker.topicsync import auto_create_topic
from ferrymq.errors import (
    CorruptRecordError,
    HeaderFieldError,
    InvalidNameError,
    MessageTooLargeError,
    ProtocolError,
    RequestError,
)
from ferrymq.model import validate_topic
from ferrymq.replication.master import ReplicationMaster
from ferrymq.rpc.connection import Connection, EncodedFrame, LaterResponse
from ferrymq.rpc.deadline import wait_future
from ferrymq.store.config import FlushDiskType
from ferrymq.store.store import PutResult
from ferrymq.wire import properties as props
from ferrymq.wire.bodies import FencedRemark, Perm, TopicConfig, encode_body
from ferrymq.wire.broker import (
    ConsumerSendMsgBackRequestHeader,
    SendMessageRequestHeader,
    SendMessageRequestHeaderV2,
    encode_send_ok,
)
from ferrymq.wire.codes import RequestCode, ResponseCode, SerializeType
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields
from ferrymq.wire.msgid import offset_msg_id
from ferrymq.wire.properties import decode_properties, encode_properties, is_property_text
from ferrymq.wire.records import (
    SYSFLAG_TRANSACTION_NOT_TYPE,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    BatchItem,
    decode_batch,
    decode_record,
    transaction_type,
)

__all__ = [
    "CommitWait",
    "append_messages",
    "check_unfenced",
    "consumer_send_back",
    "fenced_refusal",
    "put_messages",
    "send_message",
    "topic_for_send",
]

log = logging.getLogger(__name__)

_PERM_WRITE = int(Perm.WRITE)
"""As a plain int: `IntFlag` arithmetic costs microseconds per send."""
_SYSTEM_TOPICS = frozenset(
    {
        METADATA_TOPIC,  # a forged record would be applied by every slave
        SCHEDULE_TOPIC,
        SINK_TOPIC,
        TIMER_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
    }
)
"""Topics only the broker itself writes: a client's send to them is refused."""
_TIMER_MARK = b"TIMER_DEL"
"""Every timer property (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS) starts so."""


def topic_for_send(
    state: BrokerState, topic: str, default_queue_nums: int, *, retry_queue_nums: int = 1
) -> TopicConfig:
    """The config of a topic about to receive messages, created when the rules allow.

    Raises:
        RequestError: TOPIC_NOT_EXIST when it does not exist and may not be created.
        InvalidNameError: it does not exist and its name breaks the naming rules.
    """
    config = state.topics.get(topic)
    if config is not None:
        return config
    validate_topic(topic)
    if topic.startswith((RETRY_GROUP_PREFIX, DLQ_GROUP_PREFIX)):
        queues = retry_queue_nums if topic.startswith(RETRY_GROUP_PREFIX) else 1
        config = TopicConfig(topic_name=topic, read_queue_nums=queues, write_queue_nums=queues)
    else:
        template = state.topics.get(DEFAULT_TOPIC)
        if (
            not state.config.auto_create_topic_enable
            or template is None
            or not (template.perm & Perm.INHERIT)
        ):
            raise RequestError(
                ResponseCode.TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please!",
            )
        queues = max(1, min(default_queue_nums, template.write_queue_nums))
        config = TopicConfig(
            topic_name=topic,
            read_queue_nums=queues,
            write_queue_nums=queues,
            perm=template.perm & ~Perm.INHERIT,
        )
    state.topics.put(config)
    state.on_topics_changed()
    return config


def fenced_refusal(state: BrokerState, topic: str, reason: str) -> RequestError:
    """FENCED, with the topic's holder as this broker knows it (its remark is JSON)."""
    fence = state.fences.current(topic).fence
    remark = FencedRemark(
        topic=topic, epoch=fence.epoch, writer=fence.writer, url=fence.url, reason=reason
    )
    return RequestError(ResponseCode.FENCED, encode_body(remark).decode())


def check_unfenced(state: BrokerState, topic: str) -> None:
    """Refuse, before anything is stored, a write the fence does not check (issue 18).

    Raises:
        RequestError: FENCED when `topic` is fenced.
    """
    config = state.topics.get(topic)
    if config is not None and config.attributes and is_fenced(config):
        raise fenced_refusal(
            state, topic, "only single fenced sends (SEND_MESSAGE with fence properties) write it"
        )


async def put_messages(
    state: BrokerState,
    topic: str,
    queue_id: int,
    items: list[BatchItem],
    *,
    born_host: bytes,
    born_timestamp_ms: int,
    sys_flag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    wait_flush: bool = True,
    sealed_ok: bool = False,
) -> tuple[PutResult, ResponseCode]:
    """Store messages, index them this loop turn, wait as the flush and replication modes say.

    Returns the result and the response code the send gets: SUCCESS, FLUSH_DISK_TIMEOUT, or
    FLUSH_SLAVE_TIMEOUT when a SYNC_MASTER's SyncStateSet did not all get it in `slaveTimeout`
    (the message is stored but not committed: consumers will not see it until it is).

    A queue sealed by a move since the message was taken in: another open queue of the topic
    on the group (`queuemap.open_queue_for`), unless `sealed_ok` (a sink batch's rows, which
    the seal waits for).

    Raises:
        RequestError: SYSTEM_ERROR "in-sync replicas not enough" before anything is stored when
            the SyncStateSet is below `minInSyncReplicas`; FENCED for a fenced topic (only
            `send_message` writes those, after the fence's check).
    """
    check_unfenced(state, topic)
    if not sealed_ok:  # sealed since taken in (queuemap.py)
        queue_id = open_queue_for(state, topic, queue_id)
    result, waiting = append_messages(
        state,
        topic,
        queue_id,
        items,
        born_host=born_host,
        born_timestamp_ms=born_timestamp_ms,
        sys_flag=sys_flag,
        reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset,
        wait_flush=wait_flush,
    )
    if waiting is None:
        return result, ResponseCode.SUCCESS
    if isinstance(waiting, CommitWait):
        return result, _commit_code(await waiting.master.wait_committed(waiting.end_log_offset))
    return result, await waiting


def append_messages(
    state: BrokerState,
    topic: str,
    queue_id: int,
    items: list[BatchItem],
    *,
    born_host: bytes,
    born_timestamp_ms: int,
    sys_flag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    wait_flush: bool = True,
) -> tuple[PutResult, CommitWait | Coroutine[Any, Any, ResponseCode] | None]:
    """`put_messages` up to its wait: the result and what the answer waits for.

    None: nothing (SUCCESS now); a `CommitWait`: the SyncStateSet; a coroutine: the flush,
    then the SyncStateSet (its response code).

    Raises:
        RequestError: as `put_messages`.
    """
    replication = state.replication
    if replication is not None and not replication.writable:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            f"in-sync replicas not enough: SyncStateSet {sorted(replication.state.members)}, "
            f"minInSyncReplicas {state.config.min_in_sync_replicas}",
        )
    try:
        result = state.store.put(
            topic,
            queue_id,
            items,
            born_host=born_host,
            born_timestamp_ms=born_timestamp_ms,
            sys_flag=sys_flag,
            reconsume_times=reconsume_times,
            prepared_transaction_offset=prepared_transaction_offset,
        )
    except MessageTooLargeError as exc:
        raise RequestError(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
    except InvalidNameError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
    except OSError as exc:  # a full or failing disk: nothing was stored (RocketMQ: code 14)
        log.warning("cannot store a message in %s: %s", topic, exc.strerror or exc)
        raise RequestError(
            ResponseCode.SERVICE_NOT_AVAILABLE,
            f"the broker cannot store messages now: {exc.strerror or exc}",
        ) from None
    if replication is not None:
        replication.appended()
    if replication is None or not replication.config.sync:
        state.schedule_dispatch()
    # else: indexed once committed (`on_confirm`); until then a dispatch would only hold them,
    # and a master that pushed to its slaves should leave them the CPU, not index
    if testbugs.ACK_BEFORE_REPLICATION or not wait_flush:
        return result, None
    if state.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
        return result, _flush_then_commit(state, result.end_log_offset)
    if (
        replication is not None
        and replication.config.sync
        and not replication.committed(result.end_log_offset)
    ):
        return result, CommitWait(replication, result.end_log_offset)
    return result, None


@dataclass(frozen=True, slots=True)
class CommitWait:
    """A send that waits for every SyncStateSet member to have what it stored."""

    master: ReplicationMaster
    end_log_offset: int


def _commit_code(committed: bool) -> ResponseCode:
    return ResponseCode.SUCCESS if committed else ResponseCode.FLUSH_SLAVE_TIMEOUT


async def _flush_then_commit(state: BrokerState, end_log_offset: int) -> ResponseCode:
    """SYNC_FLUSH: wait for the fsync, then (a SYNC_MASTER) for the SyncStateSet."""
    flushed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    _bridge(state.store.wait_flushed(end_log_offset), flushed)
    try:
        await wait_future(flushed, state.config.sync_flush_timeout / 1000)
    except TimeoutError:
        return ResponseCode.FLUSH_DISK_TIMEOUT
    replication = state.replication
    if replication is None:
        return ResponseCode.SUCCESS
    replication.appended()  # the master's own fsynced end moved (`own_end`)
    if replication.config.sync:
        return _commit_code(await replication.wait_committed(end_log_offset))
    return ResponseCode.SUCCESS


def _bridge(source: concurrent.futures.Future[int], target: asyncio.Future[int]) -> None:
    """Resolve `target` from the flusher thread's `source`, unless it timed out first.

    Not `asyncio.wrap_future`: its timeout would cancel `source` under the flusher.
    """
    loop = target.get_loop()

    def copy(done: concurrent.futures.Future[int]) -> None:
        if target.done():
            return
        error = done.exception()
        if error is None:
            target.set_result(done.result())
        else:
            target.set_exception(error)

    def hand_over(done: concurrent.futures.Future[int]) -> None:  # on the flusher thread
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(copy, done)

    source.add_done_callback(hand_over)


def _send_header(request: RemotingCommand) -> SendMessageRequestHeader:
    if request.code == RequestCode.SEND_MESSAGE_V2:
        return from_ext_fields(SendMessageRequestHeaderV2, request.ext_fields).to_v1()
    return from_ext_fields(SendMessageRequestHeader, request.ext_fields)


async def send_message(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand | EncodedFrame | LaterResponse:
    """SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320)."""
    header = _send_header(request)
    state.check_writable()
    topic = header.topic
    if state.topics.get(topic) is None:  # a known topic was validated when it was created
        try:
            validate_topic(topic)
        except InvalidNameError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
    if topic in _SYSTEM_TOPICS:
        raise RequestError(
            ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden."
        )
    batch = request.code == RequestCode.SEND_BATCH_MESSAGE or bool(header.batch)
    if batch:
        try:
            items = decode_batch(request.body)
        except ProtocolError as exc:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
        if not items:
            raise RequestError(ResponseCode.MESSAGE_ILLEGAL, "the batch holds no message")
    else:
        properties = (header.properties or "").encode()
        items = [BatchItem(request.body, properties, header.flag)]
    if len(request.body) > state.config.max_message_size and not batch:
        raise RequestError(
            ResponseCode.MESSAGE_ILLEGAL,
            f"the message body size {len(request.body)} is over the limit "
            f"{state.config.max_message_size}",
        )
    if state.topic_authority is not None and state.topics.get(topic) is None:
        await auto_create_topic(state, topic, header.default_topic_queue_nums)  # controller mode
    config = topic_for_send(state, topic, header.default_topic_queue_nums)
    if not config.perm & _PERM_WRITE:
        raise RequestError(
            ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden"
        )
    queue_id = header.queue_id
    if queue_id < 0:
        queue_id = random.randrange(config.write_queue_nums)
    if queue_id >= max(config.write_queue_nums, config.read_queue_nums):
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            f"request queueId[{queue_id}] is illegal, {config.topic_name} has "
            f"{config.write_queue_nums} write queues. Producer: {conn.peer}",
        )
    if config.attributes:
        check_send(config, state.config.broker_name, queue_id)  # a moved queue (queuemap.py)
    if config.attributes and config.attributes.get(FENCED_ATTRIBUTE) == "true":
        return await _send_fenced(state, conn, request, header, items, batch, queue_id)
    reconsume_times = header.reconsume_times or 0
    sys_flag = header.sys_flag
    stored_topic, stored_queue = topic, queue_id
    if not batch:
        stored_topic, stored_queue, items = _reroute(
            state, header, items[0], topic, queue_id, reconsume_times
        )
    if stored_topic == TRANS_HALF_TOPIC:
        sys_flag &= ~SYSFLAG_TRANSACTION_ROLLBACK  # half messages are plain messages of their topic
    result, waiting = append_messages(
        state,
        stored_topic,
        stored_queue,
        items,
        born_host=state.born_host(conn),
        born_timestamp_ms=header.born_timestamp,
        sys_flag=sys_flag,
        reconsume_times=reconsume_times,
        wait_flush=_wants_wait(items[0]),
    )
    if waiting is None:
        return _send_response(state, request, header, items, queue_id, result, ResponseCode.SUCCESS)
    if isinstance(waiting, CommitWait):
        # a SYNC_MASTER's send: answered from the commit's callback, with no task kept waiting
        answer = _CommitAnswer(state, request, header, items, queue_id, result, conn)
        waiting.master.on_committed(waiting.end_log_offset, answer)
        return answer.later
    code = await waiting
    return _send_response(state, request, header, items, queue_id, result, code)


async def _send_fenced(
    state: BrokerState,
    conn: Connection,
    request: RemotingCommand,
    header: SendMessageRequestHeader,
    items: list[BatchItem],
    batch: bool,
    queue_id: int,
) -> RemotingCommand | EncodedFrame | LaterResponse:
    """A send to a fenced topic: one plain record whose fence properties the fence accepts.

    The decision and the append happen with no await in between (`fence.py` rules 1-4); the
    master's view then includes the record, committed or not yet.
    """
    topic = header.topic
    fences = state.fences
    if not fences.is_master:  # a broker taking writes always is; never decide on a stale view
        raise RequestError(ResponseCode.SYSTEM_BUSY, f"the fence of {topic} is not ready yet")
    if batch:
        raise fenced_refusal(state, topic, "a fenced topic takes one record per send, not a batch")
    if transaction_type(header.sys_flag) != SYSFLAG_TRANSACTION_NOT_TYPE:
        raise fenced_refusal(state, topic, "a fenced topic takes no transactional message")
    item = items[0]
    raw = item.properties
    if b"DELAY\x01" in raw or _TIMER_MARK in raw:
        raise fenced_refusal(state, topic, "a fenced topic takes no delayed or timer message")
    try:
        record = parse_record(decode_properties(raw), copy_allowed=False)
    except (InvalidFenceRecordError, ProtocolError) as exc:
        raise fenced_refusal(state, topic, str(exc)) from None
    reason = decide(fences.current(topic).fence, record)
    if reason is not None:
        raise fenced_refusal(state, topic, reason)
    result, waiting = append_messages(
        state,
        topic,
        queue_id,
        items,
        born_host=state.born_host(conn),
        born_timestamp_ms=header.born_timestamp,
        sys_flag=header.sys_flag,
        reconsume_times=header.reconsume_times or 0,
        wait_flush=_wants_wait(item),
    )
    fences.appended(topic, result.first_queue_offset, record)
    if waiting is None:
        return _send_response(state, request, header, items, queue_id, result, ResponseCode.SUCCESS)
    if isinstance(waiting, CommitWait):
        answer = _CommitAnswer(state, request, header, items, queue_id, result, conn)
        waiting.master.on_committed(waiting.end_log_offset, answer)
        return answer.later
    code = await waiting
    return _send_response(state, request, header, items, queue_id, result, code)


class _CommitAnswer:
    """A SYNC_MASTER send's answer, called once with whether the SyncStateSet committed it."""

    __slots__ = ("header", "items", "later", "queue_id", "request", "result", "started", "state")

    def __init__(
        self,
        state: BrokerState,
        request: RemotingCommand,
        header: SendMessageRequestHeader,
        items: list[BatchItem],
        queue_id: int,
        result: PutResult,
        conn: Connection,
    ) -> None:
        self.state = state
        self.request = request
        self.header = header
        self.items = items
        self.queue_id = queue_id
        self.result = result
        self.later = conn.answer_later(request)
        # timed when `Broker._bind_timed` picked this send (it counted it just before)
        sampled = not state.stats.send_seq % LATENCY_SAMPLE_EVERY
        self.started = time.perf_counter() if sampled else None

    def __call__(self, committed: bool) -> None:
        if self.started is not None:
            self.state.stats.send_latency.observe(time.perf_counter() - self.started)
        self.later.send_built(self._build_success if committed else self._build_timeout)

    def _build_success(self) -> RemotingCommand | EncodedFrame:
        return self._build(ResponseCode.SUCCESS)

    def _build_timeout(self) -> RemotingCommand | EncodedFrame:
        return self._build(ResponseCode.FLUSH_SLAVE_TIMEOUT)

    def _build(self, code: ResponseCode) -> RemotingCommand | EncodedFrame:
        return _send_response(
            self.state, self.request, self.header, self.items, self.queue_id, self.result, code
        )


def _send_response(
    state: BrokerState,
    request: RemotingCommand,
    header: SendMessageRequestHeader,
    items: list[BatchItem],
    queue_id: int,
    result: PutResult,
    code: ResponseCode,
) -> RemotingCommand | EncodedFrame:
    store_host = state.store.config.store_host
    log_offsets = result.log_offsets
    if code == ResponseCode.SUCCESS:  # an acknowledged send (metrics.py)
        state.stats.put.add(
            header.topic,
            len(items),
            len(items[0].body) if len(items) == 1 else sum(len(i.body) for i in items),
        )
    if (
        code == ResponseCode.SUCCESS
        and len(log_offsets) == 1
        and request.serialize_type is SerializeType.JSON
        and transaction_type(header.sys_flag) != SYSFLAG_TRANSACTION_PREPARED
    ):  # nearly every send: its frame written directly (wire.broker.encode_send_ok)
        return EncodedFrame(
            encode_send_ok(
                request.opaque,
                offset_msg_id(store_host, log_offsets[0]),
                queue_id,
                result.first_queue_offset,
            )
        )
    # SendMessageResponseHeader's fields, built directly: this runs once per send
    response = {
        "msgId": offset_msg_id(store_host, log_offsets[0])
        if len(log_offsets) == 1
        else ",".join(offset_msg_id(store_host, o) for o in log_offsets),
        "queueId": str(queue_id),
        "queueOffset": str(result.first_queue_offset),
    }
    if transaction_type(header.sys_flag) == SYSFLAG_TRANSACTION_PREPARED:
        transaction_id = items[0].property_map.get(props.UNIQ_KEY)
        if transaction_id is not None:
            response["transactionId"] = transaction_id
    remark = _NOT_COMMITTED if code == ResponseCode.FLUSH_SLAVE_TIMEOUT else None
    return request.make_response(code, remark=remark, ext_fields=response)


_NOT_COMMITTED = (
    "not committed: the SyncStateSet did not all store it within slaveTimeout; the master holds "
    "it and consumers will see it only once it is committed, so a retry may duplicate it"
)


def _wants_wait(item: BatchItem) -> bool:
    return b"WAIT\x01false" not in item.properties


def _reroute(
    state: BrokerState,
    header: SendMessageRequestHeader,
    item: BatchItem,
    topic: str,
    queue_id: int,
    reconsume_times: int,
) -> tuple[str, int, list[BatchItem]]:
    """Where one message is stored: its topic, a DLQ, the schedule topic or the half topic."""
    raw = item.properties
    delayed = b"DELAY\x01" in raw
    timed = _TIMER_MARK in raw and state.config.timer_wheel_enable
    prepared = transaction_type(header.sys_flag) == SYSFLAG_TRANSACTION_PREPARED
    if topic.startswith(RETRY_GROUP_PREFIX):
        group = topic[len(RETRY_GROUP_PREFIX) :]
        limit = header.max_reconsume_times
        if limit is None:
            limit = state.group_config(group).retry_max_times
        if reconsume_times > limit:
            dlq = dlq_topic(group)
            topic_for_send(state, dlq, 1)
            return dlq, 0, [item]
    if not (delayed or prepared or timed):
        return topic, queue_id, [item]
    properties = decode_properties(raw)
    if timed and not prepared and props.DELAY_TIME_LEVEL not in properties:
        deliver_ms = _deliver_ms(state, properties)
        if deliver_ms is None:
            return topic, queue_id, [item]
        properties[props.TIMER_OUT_MS] = str(deliver_ms)
        properties[props.REAL_TOPIC] = topic
        properties[props.REAL_QUEUE_ID] = str(queue_id)
        return TIMER_TOPIC, 0, [BatchItem(item.body, encode_properties(properties), item.flag)]
    if prepared:
        properties[props.REAL_TOPIC] = topic
        properties[props.REAL_QUEUE_ID] = str(queue_id)
        properties.setdefault(props.PRODUCER_GROUP, header.producer_group)
        return TRANS_HALF_TOPIC, 0, [BatchItem(item.body, encode_properties(properties), item.flag)]
    level = _delay_level(properties.get(props.DELAY_TIME_LEVEL), len(state.config.delay_levels_ms))
    if level <= 0:
        return topic, queue_id, [item]
    properties[props.REAL_TOPIC] = topic
    properties[props.REAL_QUEUE_ID] = str(queue_id)
    properties[props.DELAY_TIME_LEVEL] = str(level)
    return (
        SCHEDULE_TOPIC,
        level - 1,
        [BatchItem(item.body, encode_properties(properties), item.flag)],
    )


def _deliver_ms(state: BrokerState, properties: dict[str, str]) -> int | None:
    """When a timer message is due (epoch ms), or None when it is due now.

    Raises:
        RequestError: MESSAGE_ILLEGAL for a value that is not a whole number, or a delivery time
            further than `timerMaxDelaySec` from now.
    """
    now_ms = state.wall_ms()
    for name, scale_ms, relative in (
        (props.TIMER_DELAY_SEC, 1000, True),
        (props.TIMER_DELAY_MS, 1, True),
        (props.TIMER_DELIVER_MS, 1, False),
    ):
        text = properties.get(name)
        if text is None:
            continue
        try:
            value = int(text)
        except ValueError:
            raise RequestError(
                ResponseCode.MESSAGE_ILLEGAL,
                f"timer message illegal: {name}={text!r} is not a whole number",
            ) from None
        deliver_ms = now_ms + value * scale_ms if relative else value
        break
    else:
        return None
    limit_ms = state.config.timer_max_delay_sec * 1000
    if deliver_ms - now_ms > limit_ms:
        raise RequestError(
            ResponseCode.MESSAGE_ILLEGAL,
            f"timer message illegal: the delay time should not be bigger than the max delay "
            f"{limit_ms}ms",
        )
    return deliver_ms if deliver_ms > now_ms else None


def _delay_level(text: str | None, levels: int) -> int:
    try:
        level = int(text or "0")
    except ValueError:
        return 0
    return min(level, levels)


async def consumer_send_back(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """CONSUMER_SEND_MSG_BACK (36): a consumer failed a message; retry it later or dead-letter it.

    The stored message at `offset` is copied to `%RETRY%<group>` with reconsume times + 1 and a
    delay level of 3 + reconsume times (10 s, 30 s, 1 m, ...), or to `%DLQ%<group>` once it has
    been retried `maxReconsumeTimes` times (or the consumer asks with a negative delay level).
    """
    header = from_ext_fields(ConsumerSendMsgBackRequestHeader, request.ext_fields)
    if header.origin_msg_id and not is_property_text(header.origin_msg_id):
        raise HeaderFieldError(
            "ConsumerSendMsgBackRequestHeader", "originMsgId", "holds a property separator"
        )
    state.check_writable()
    group_config = state.group_config(header.group)
    try:
        record = decode_record(state.store.read_record(header.offset))
    except CorruptRecordError as exc:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {exc}"
        ) from None
    properties = dict(record.properties)
    properties.pop(props.PROPERTY_CRC32, None)
    properties.setdefault(props.RETRY_TOPIC, record.topic)
    properties.setdefault(props.ORIGIN_MESSAGE_ID, header.origin_msg_id or "")
    reconsume_times = record.reconsume_times + 1
    limit = header.max_reconsume_times
    if limit is None:
        limit = group_config.retry_max_times
    delay_level = header.delay_level
    if reconsume_times > limit or delay_level < 0:
        topic, queue_id = dlq_topic(header.group), 0
        topic_for_send(state, topic, 1)
        properties.pop(props.DELAY_TIME_LEVEL, None)
    else:
        topic = retry_topic(header.group)
        config = topic_for_send(state, topic, 1, retry_queue_nums=group_config.retry_queue_nums)
        check_unfenced(state, topic)  # its delivery after the delay would be refused
        queue_id = random.randrange(config.write_queue_nums)
        if delay_level == 0:
            delay_level = 3 + reconsume_times - 1
        level = min(delay_level, len(state.config.delay_levels_ms))
        properties[props.REAL_TOPIC] = topic
        properties[props.REAL_QUEUE_ID] = str(queue_id)
        properties[props.DELAY_TIME_LEVEL] = str(level)
        topic, queue_id = SCHEDULE_TOPIC, level - 1
    _, code = await put_messages(
        state,
        topic,
        queue_id,
        [BatchItem(record.body, encode_properties(properties), record.flag)],
        born_host=record.born_host,
        born_timestamp_ms=record.born_timestamp_ms,
        sys_flag=record.sys_flag,
        reconsume_times=reconsume_times,
    )
    if code == ResponseCode.SUCCESS:  # RocketMQ incSendBackNums, by the original topic
        state.stats.sendbacks.add((properties[props.RETRY_TOPIC], header.group), 1, 0)
    remark = _NOT_COMMITTED if code == ResponseCode.FLUSH_SLAVE_TIMEOUT else None
    return request.make_response(code, remark=remark)
