"""Client and consumer-group requests.

RocketMQ's `ClientManageProcessor`, `ConsumerManageProcessor` and the locks of
`AdminBrokerProcessor`.

HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, QUERY_CONSUMER_OFFSET,
UPDATE_CONSUMER_OFFSET, LOCK_BATCH_MQ, UNLOCK_BATCH_MQ, and ferrymq's GET_GROUP_MEMBERS. When a
group's membership changes the broker pushes NOTIFY_CONSUMER_IDS_CHANGED to its clients so they
rebalance at once.

A heartbeat's consumer data may carry two ferrymq fields (Java ignores unknown JSON fields):
`memberData`, opaque text the group's members read back with GET_GROUP_MEMBERS (Connect workers
publish what they run), and `sessionTimeoutMs`, after which a silent member leaves instead of
`channelExpiredTimeout` (seconds, not minutes; a closed connection leaves at once).
"""

from __future__ import annotations

import asyncio
import logging

from ferrymq.broker.metadata import retry_topic
from ferrymq.broker.popservice import follow_commit
from ferrymq.broker.queuemap import committed_floor
from ferrymq.broker.send import topic_for_send
from ferrymq.broker.state import BrokerState
from ferrymq.errors import FerryError, RequestError
from ferrymq.model import MessageQueue
from ferrymq.rpc.connection import Connection
from ferrymq.wire.bodies import (
    MAX_MEMBER_DATA_BYTES,
    MAX_SESSION_TIMEOUT_MS,
    MIN_SESSION_TIMEOUT_MS,
    ConsumerIdList,
    GroupMember,
    GroupMembers,
    HeartbeatData,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueueBody,
    decode_body,
    encode_body,
)
from ferrymq.wire.broker import (
    GetConsumerListByGroupRequestHeader,
    GetGroupMembersRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields

__all__ = [
    "expire_clients",
    "get_consumer_list",
    "get_group_members",
    "heartbeat",
    "lock_batch",
    "notify_group_changed",
    "push_to_group",
    "query_consumer_offset",
    "unlock_batch",
    "unregister_client",
    "update_consumer_offset",
]

log = logging.getLogger(__name__)


def notify_group_changed(state: BrokerState, group: str) -> None:
    """Tell every client of `group` that its membership changed (oneway, best effort)."""
    config = state.groups.get(group)
    if config is not None and not config.notify_consumer_ids_changed_enable:
        return
    consumers = state.clients.consumers.get(group)
    if consumers is None:
        return
    header = to_ext_fields(NotifyConsumerIdsChangedRequestHeader(consumer_group=group))
    for conn in consumers.connections:
        request = RemotingCommand(
            code=RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, ext_fields=dict(header)
        )
        task = asyncio.get_running_loop().create_task(_notify(conn, request))
        task.add_done_callback(lambda t: t.exception())


def push_to_group(
    state: BrokerState, group: str, code: int, ext_fields: dict[str, str], body: bytes
) -> int:
    """Send one request to every client of `group` (oneway, best effort); how many were sent."""
    consumers = state.clients.consumers.get(group)
    if consumers is None:
        return 0
    for conn in consumers.connections:
        request = RemotingCommand(code=code, ext_fields=dict(ext_fields), body=body)
        task = asyncio.get_running_loop().create_task(_notify(conn, request))
        task.add_done_callback(lambda t: t.exception())
    return len(consumers.connections)


async def _notify(conn: Connection, request: RemotingCommand) -> None:
    try:
        await conn.oneway(request)
    except FerryError as exc:
        log.debug("could not notify %s: %s", conn.peer, exc)


def expire_clients(state: BrokerState) -> None:
    """Drop clients silent past their deadline and tell their groups."""
    for group in state.clients.expire(state.clock()):
        log.info("a client of group %s expired", group)
        notify_group_changed(state, group)


def _check_member_fields(data: HeartbeatData) -> None:
    """Refuse bad ferrymq member fields before anything is registered.

    Raises:
        RequestError: INVALID_PARAMETER naming the group and the field.
    """
    for consumer in data.consumer_data_set:
        timeout_ms = consumer.session_timeout_ms
        if timeout_ms is not None and not (
            MIN_SESSION_TIMEOUT_MS <= timeout_ms <= MAX_SESSION_TIMEOUT_MS
        ):
            raise RequestError(
                ResponseCode.INVALID_PARAMETER,
                f"group {consumer.group_name}: sessionTimeoutMs {timeout_ms} is outside "
                f"{MIN_SESSION_TIMEOUT_MS}..{MAX_SESSION_TIMEOUT_MS}",
            )
        member_data = consumer.member_data
        if member_data is not None and len(member_data.encode()) > MAX_MEMBER_DATA_BYTES:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER,
                f"group {consumer.group_name}: memberData is {len(member_data.encode())} bytes, "
                f"over the limit of {MAX_MEMBER_DATA_BYTES}",
            )


def _check_master_for_members(state: BrokerState, what: str) -> None:
    """Group membership with member data lives on the group's master only.

    A broker that stopped being master still holds the members it had; answering from there
    would split a group across two tables after a failover (seen by `ferry chaos`: Connect
    workers heartbeating the old master and the new one each took the others for gone).

    Raises:
        RequestError: NO_PERMISSION, which makes the client ask for a fresh route.
    """
    if not state.is_master:
        raise RequestError(
            ResponseCode.NO_PERMISSION,
            f"the broker[{state.address}] is not its group's master: {what} go to the master",
        )


async def heartbeat(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """HEART_BEAT (34): register the client's producer and consumer groups."""
    data = decode_body(request.body, HeartbeatData)
    _check_member_fields(data)
    if any(
        c.member_data is not None or c.session_timeout_ms is not None
        for c in data.consumer_data_set
    ):
        _check_master_for_members(state, "heartbeats with member data")
    now = state.clock()
    language, version = request.language.name, request.version
    for producer in data.producer_data_set:
        state.clients.register_producer(
            data.client_id, conn, producer.group_name, now, language=language, version=version
        )
    for consumer in data.consumer_data_set:
        group_config = state.group_config(consumer.group_name)
        # RocketMQ creates the retry topic here, so a consumer's route lookup for it succeeds
        # before its first failed message and the retry arrives without a route refresh.
        topic_for_send(
            state,
            retry_topic(consumer.group_name),
            1,
            retry_queue_nums=group_config.retry_queue_nums,
        )
        if state.clients.register_consumer(
            data.client_id, conn, consumer, now, language=language, version=version
        ):
            log.info("consumer %s joined group %s", data.client_id, consumer.group_name)
            notify_group_changed(state, consumer.group_name)
        if consumer.session_timeout_ms is not None:
            state.wake_clients()  # its deadline may come before the expiry loop's next scan
    return request.make_response(ResponseCode.SUCCESS)


async def get_group_members(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_GROUP_MEMBERS (ferrymq's own): a consumer group's live members with their data.

    Members past their deadline are dropped first. `masterSinceMs` says how long this broker has
    served in its role: a master elected a moment ago has heard no heartbeat yet.
    """
    header = from_ext_fields(GetGroupMembersRequestHeader, request.ext_fields)
    _check_master_for_members(state, "member lists")
    expire_clients(state)
    now = state.clock()
    group = state.clients.consumers.get(header.consumer_group)
    members = [
        GroupMember(
            client_id=client_id,
            member_data=member_data,
            last_heartbeat_ago_ms=max(0, round(ago * 1000)),
        )
        for client_id, member_data, ago in (group.members(now) if group is not None else [])
    ]
    body = GroupMembers(
        members=members, master_since_ms=max(0, round((now - state.serving_since) * 1000))
    )
    return request.make_response(ResponseCode.SUCCESS, body=encode_body(body))


async def unregister_client(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """UNREGISTER_CLIENT (35): a client leaves its groups."""
    header = from_ext_fields(UnregisterClientRequestHeader, request.ext_fields)
    for group in state.clients.unregister(
        header.client_i_d, header.producer_group, header.consumer_group
    ):
        log.info("consumer %s left group %s", header.client_i_d, group)
        notify_group_changed(state, group)
    return request.make_response(ResponseCode.SUCCESS)


async def get_consumer_list(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_CONSUMER_LIST_BY_GROUP (38)."""
    header = from_ext_fields(GetConsumerListByGroupRequestHeader, request.ext_fields)
    ids = state.clients.consumer_ids(header.consumer_group)
    if not ids:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {header.consumer_group}"
        )
    return request.make_response(ResponseCode.SUCCESS, body=encode_body(ConsumerIdList(ids)))


async def query_consumer_offset(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """QUERY_CONSUMER_OFFSET (14).

    A group with no committed offset gets 0 when the queue still holds its first message and
    `setZeroIfNotFound` is not false (RocketMQ's rule, which lets a new group read what was sent
    before it started); otherwise QUERY_NOT_FOUND and the client picks by consumeFromWhere.
    A moved queue's new physical queue answers its segment's start (`queuemap.py`).
    """
    header = from_ext_fields(QueryConsumerOffsetRequestHeader, request.ext_fields)
    offset = state.offsets.query(header.topic, header.consumer_group, header.queue_id)
    floor = committed_floor(state, header.topic, header.queue_id)
    if offset is None and floor is not None and header.set_zero_if_not_found is not False:
        offset = floor  # a moved queue's new physical queue: read from its start (queuemap.py)
    if offset is None:
        if (
            header.set_zero_if_not_found is False
            or state.store.min_queue_offset(header.topic, header.queue_id) > 0
        ):
            raise RequestError(
                ResponseCode.QUERY_NOT_FOUND,
                "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
            )
        offset = 0
    return request.make_response(
        ResponseCode.SUCCESS,
        ext_fields=to_ext_fields(QueryConsumerOffsetResponseHeader(offset=offset)),
    )


async def update_consumer_offset(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """UPDATE_CONSUMER_OFFSET (15): commit a group's position in a queue.

    A queue the group popped here resets its POP state to the offset when it differs from
    POP's own (`popservice.follow_commit`): how an offline admin reset reaches POP.
    """
    header = from_ext_fields(UpdateConsumerOffsetRequestHeader, request.ext_fields)
    if header.commit_offset < 0:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"bad commitOffset {header.commit_offset}")
    if not state.is_master:
        # a slave's copy is overwritten by the master's replicated offsets: acknowledging it
        # would let a client with a stale route commit a position the master never hears of
        # (commit-regression found by `ferry chaos` on the controller topology)
        raise RequestError(
            ResponseCode.NO_PERMISSION,
            f"the broker[{state.address}] is a slave: offsets are committed on the master",
        )
    state.group_config(header.consumer_group)
    # a queue the group pops moves with it, backwards too (an offline admin reset)
    follow_commit(state, header.consumer_group, header.topic, header.queue_id, header.commit_offset)
    state.offsets.commit(header.topic, header.consumer_group, header.queue_id, header.commit_offset)
    # acknowledged once replicated, as a send is: a failover (or a master's power failure with
    # SYNC_FLUSH) must not take a committed position back (found by `ferry chaos`)
    if state.metadata_committed is not None and not await state.metadata_committed():
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            "the offset commit was not replicated in time; commit again",
        )
    return request.make_response(ResponseCode.SUCCESS)


def _queues(body: LockBatchRequestBody) -> list[MessageQueue]:
    return [MessageQueue(q.topic, q.broker_name, q.queue_id) for q in body.mq_set]


async def lock_batch(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """LOCK_BATCH_MQ (41): an orderly consumer locks its queues (or renews its locks)."""
    body = decode_body(request.body, LockBatchRequestBody)
    locked = state.locks.lock(body.consumer_group, body.client_id, _queues(body), state.clock())
    answer = LockBatchResponseBody(
        [
            MessageQueueBody(topic=q.topic, broker_name=q.broker_name, queue_id=q.queue_id)
            for q in locked
        ]
    )
    return request.make_response(ResponseCode.SUCCESS, body=encode_body(answer))


async def unlock_batch(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """UNLOCK_BATCH_MQ (42)."""
    body = decode_body(request.body, LockBatchRequestBody)
    state.locks.unlock(body.consumer_group, body.client_id, _queues(body))
    return request.make_response(ResponseCode.SUCCESS)
