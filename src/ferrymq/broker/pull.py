"""PULL_MESSAGE with long polling (RocketMQ `PullMessageProcessor`).

A pull reads up to `maxMsgNums` records of one queue from `queueOffset`, filtered by the tag
hash codes of the subscription, and answers with the stored bytes, concatenated, never
re-encoded. When nothing is there and the request allows suspending, the pull waits until the
queue grows or `suspendTimeoutMillis` passes, then reads again. The answer's code follows the
store's status as RocketMQ maps it; the header says where to continue (`nextBeginOffset`) and the
queue's bounds.

A suspending pull may also ask for a minimum size (`minMsgBytes`, a ferrymq extension of the
header that RocketMQ clients never send; seed 003's delayed fetch, Kafka's fetch.min.bytes): it
answers at once when that many bytes are there, when `maxMsgNums` or `maxMsgBytes` cut the read
short, or when the queue holds more than the read returned; otherwise it is held while the queue
grows, and answers with what there is when `suspendTimeoutMillis` runs out (maybe fewer bytes,
maybe none).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import Final

from ferrymq.broker.metadata import GroupConfig
from ferrymq.broker.queuemap import SEALED_FIELD, queue_map_of
from ferrymq.broker.state import BrokerState
from ferrymq.errors import RequestError
from ferrymq.rpc.connection import Connection
from ferrymq.store.store import GetResult, GetStatus
from ferrymq.wire.broker import PullMessageRequestHeader, PullMessageResponseHeader
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.records import java_string_hash, record_log_offset

MASTER_ID: Final = 0

__all__ = [
    "SYSFLAG_COMMIT_OFFSET",
    "SYSFLAG_SUBSCRIPTION",
    "SYSFLAG_SUSPEND",
    "pull_message",
    "tag_codes",
]

SYSFLAG_COMMIT_OFFSET: Final = 1
SYSFLAG_SUSPEND: Final = 2
SYSFLAG_SUBSCRIPTION: Final = 4

_MAX_SUSPEND_S: Final = 60.0
_MAX_PULL_BYTES: Final = 4 * 1024 * 1024


def tag_codes(expression: str | None, expression_type: str | None = "TAG") -> frozenset[int] | None:
    """Hash codes of a tag expression (`TagA || TagB`); None subscribes to every tag.

    Raises:
        RequestError: SUBSCRIPTION_PARSE_FAILED for SQL92 and other unsupported filters.
    """
    if expression_type not in (None, "", "TAG"):
        raise RequestError(
            ResponseCode.SUBSCRIPTION_PARSE_FAILED,
            f"the broker does not support filtering by {expression_type}; use TAG",
        )
    text = (expression or "").strip()
    if text in ("", "*"):
        return None
    tags = [tag.strip() for tag in text.split("||")]
    if not all(tags):
        raise RequestError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"bad tag expression {text!r}")
    return frozenset(java_string_hash(tag) for tag in tags)


def _status_code(status: GetStatus, queue_offset: int) -> int:
    if status is GetStatus.FOUND:
        return ResponseCode.SUCCESS
    if status in (GetStatus.MESSAGE_WAS_REMOVING, GetStatus.NO_MATCHED_MESSAGE):
        return ResponseCode.PULL_RETRY_IMMEDIATELY
    if status in (GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE):
        return ResponseCode.PULL_OFFSET_MOVED if queue_offset != 0 else ResponseCode.PULL_NOT_FOUND
    if status in (GetStatus.OFFSET_FOUND_NULL, GetStatus.OFFSET_OVERFLOW_ONE):
        return ResponseCode.PULL_NOT_FOUND
    return ResponseCode.PULL_OFFSET_MOVED  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL


async def pull_message(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """PULL_MESSAGE (11)."""
    started = time.perf_counter()
    header = from_ext_fields(PullMessageRequestHeader, request.ext_fields)
    state.check_readable()
    group = state.group_config(header.consumer_group)
    if not group.consume_enable:
        raise RequestError(
            ResponseCode.NO_PERMISSION, f"subscription group no permission, {header.consumer_group}"
        )
    topic = state.topics.get(header.topic)
    if topic is None:
        raise RequestError(
            ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist, apply first please!"
        )
    if not 0 <= header.queue_id < max(topic.read_queue_nums, topic.write_queue_nums):
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            f"queueId[{header.queue_id}] is illegal, topic:[{header.topic}] "
            f"topicConfig.readQueueNums:[{topic.read_queue_nums}] consumer:[{conn.peer}]",
        )
    if header.sys_flag & SYSFLAG_SUBSCRIPTION:
        codes = tag_codes(header.subscription, header.expression_type)
    else:
        codes = _registered_codes(state, header.consumer_group, header.topic)
    if header.sys_flag & SYSFLAG_COMMIT_OFFSET and header.commit_offset >= 0 and state.is_master:
        state.offsets.commit(
            header.topic, header.consumer_group, header.queue_id, header.commit_offset
        )
    result = _read(state, header, codes)
    state.stats.pull_latency.observe(time.perf_counter() - started)  # a long poll's hold excluded
    code = _status_code(result.status, header.queue_offset)
    queue_map = queue_map_of(topic)
    found = queue_map.owner(state.config.broker_name, header.queue_id) if queue_map else None
    moving = found is not None and found[1].is_open and found[0].moving is not None
    sealed = moving or (found is not None and not found[1].is_open)
    # no long poll while the queue moves (its end is not decided: a reader must hear soon), nor
    # for a reader that follows segments; others (the official clients) wait at a closed
    # segment's end as at any queue's, instead of pulling it again at once, for ever
    at_once = moving or (sealed and bool(header.ferry_follows_map))
    if header.sys_flag & SYSFLAG_SUSPEND and header.suspend_timeout_millis > 0 and not at_once:
        wait = (
            min(header.suspend_timeout_millis / 1000, _MAX_SUSPEND_S)
            if state.config.long_polling_enable
            else state.config.short_polling_time_mills / 1000
        )
        deadline = asyncio.get_running_loop().time() + wait
        if code == ResponseCode.PULL_NOT_FOUND and await state.longpoll.wait(
            header.topic, header.queue_id, header.queue_offset, wait
        ):
            result = _read(state, header, codes)
            code = _status_code(result.status, header.queue_offset)
        if code == ResponseCode.SUCCESS and header.min_msg_bytes:
            result = await _fill(state, header, codes, result, deadline)
    if not state.is_master and not state.config.slave_read_enable:
        # RocketMQ: a slave that may not be read sends the consumer back to the master
        response = PullMessageResponseHeader(
            suggest_which_broker_id=MASTER_ID,
            next_begin_offset=header.queue_offset,
            min_offset=result.min_queue_offset,
            max_offset=result.max_queue_offset,
        )
        return request.make_response(
            ResponseCode.PULL_RETRY_IMMEDIATELY,
            remark="this slave does not serve reads (slaveReadEnable=false): pull the master",
            ext_fields=to_ext_fields(response),
        )
    response = PullMessageResponseHeader(
        suggest_which_broker_id=_suggest(state, group, result),
        next_begin_offset=result.next_queue_offset,
        min_offset=result.min_queue_offset,
        max_offset=result.max_queue_offset,
    )
    fields = to_ext_fields(response)
    if sealed:
        # a moved queue's old physical queue (queuemap.py): ferrymq's clients read on in the
        # queue's next segment (or refresh the route to learn it)
        fields[SEALED_FIELD] = "true"
    state.stats.pulled(
        header.topic,
        header.consumer_group,
        len(result.records) if code == ResponseCode.SUCCESS else 0,
        result.total_bytes if code == ResponseCode.SUCCESS else 0,
    )
    return request.make_response(code, ext_fields=fields, body=b"".join(result.records))


def _suggest(state: BrokerState, group: GroupConfig, result: GetResult) -> int:
    """Which replica the consumer should pull next (RocketMQ `suggestWhichBrokerId`).

    With `slaveReadEnable`, a consumer reading more than `accessMessageInMemoryMaxRatio` of
    memory behind the log's end is sent to `whichBrokerWhenConsumeSlowly` (its bytes are no
    longer in the page cache, so a slave serves them at no cost to the master's writes).
    """
    if not state.config.slave_read_enable or not result.records:
        return MASTER_ID
    last_pulled = record_log_offset(result.records[-1])
    behind = state.store.max_log_offset - last_pulled
    if behind > _memory_bytes() * state.config.access_message_in_memory_max_ratio / 100:
        return group.which_broker_when_consume_slowly
    return group.broker_id


@functools.cache
def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


async def _fill(
    state: BrokerState,
    header: PullMessageRequestHeader,
    codes: frozenset[int] | None,
    result: GetResult,
    deadline: float,
) -> GetResult:
    """Hold a pull until `minMsgBytes` can be returned, or until `deadline` (loop time).

    A read that `maxMsgNums` or `maxMsgBytes` cut short, or that left entries of the queue
    unread, is answered at once: waiting could not make it bigger.
    """
    loop = asyncio.get_running_loop()
    limit = _max_bytes(header)
    wanted = min(header.min_msg_bytes or 0, limit)
    while (
        result.status is GetStatus.FOUND
        and result.total_bytes < wanted
        and len(result.records) < _max_count(header)
        and result.next_queue_offset >= result.max_queue_offset
    ):
        left = deadline - loop.time()
        if left <= 0 or not await state.longpoll.wait(
            header.topic, header.queue_id, result.next_queue_offset, left
        ):
            break
        result = _read(state, header, codes)
    return result


def _max_count(header: PullMessageRequestHeader) -> int:
    return max(1, min(header.max_msg_nums, 1024))


def _max_bytes(header: PullMessageRequestHeader) -> int:
    return min(header.max_msg_bytes or _MAX_PULL_BYTES, _MAX_PULL_BYTES)


def _read(
    state: BrokerState, header: PullMessageRequestHeader, codes: frozenset[int] | None
) -> GetResult:
    return state.store.get(
        header.topic,
        header.queue_id,
        header.queue_offset,
        _max_count(header),
        max_bytes=_max_bytes(header),
        tags_codes=codes,
    )


def _registered_codes(state: BrokerState, group: str, topic: str) -> frozenset[int] | None:
    consumers = state.clients.consumers.get(group)
    subscription = consumers.subscriptions.get(topic) if consumers else None
    if subscription is None:
        return None
    return tag_codes(subscription.sub_string, subscription.expression_type)
