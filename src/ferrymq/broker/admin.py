"""Administration requests (RocketMQ `AdminBrokerProcessor`).

Topics: UPDATE_AND_CREATE_TOPIC, DELETE_TOPIC_IN_BROKER, GET_ALL_TOPIC_CONFIG,
GET_TOPIC_STATS_INFO, and ferrymq's GET_FENCE. Groups: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
DELETE_SUBSCRIPTIONGROUP, GET_ALL_SUBSCRIPTIONGROUP_CONFIG, GET_CONSUME_STATS,
QUERY_TOPIC_CONSUME_BY_WHO. Clients: GET_CONSUMER_CONNECTION_LIST,
GET_PRODUCER_CONNECTION_LIST, GET_ALL_PRODUCER_INFO (RocketMQ's body shapes: what the Dashboard
and rocketmq-exporter read); VIEW_BROKER_STATS_DATA (statsAll's and the exporter's TPS);
GET_CONSUMER_RUNNING_INFO and CONSUME_MESSAGE_DIRECTLY (relayed to the client);
GET_SYSTEM_TOPIC_LIST_FROM_BROKER; GET_TOPIC_CONFIG and
GET_SUBSCRIPTIONGROUP_CONFIG (one topic's or group's config: 5.x mqadmin and the Dashboard);
INVOKE_BROKER_TO_RESET_OFFSET (online offset reset: commits the new
offsets and pushes them to the group's running clients; POP follows). Broker:
GET_BROKER_RUNTIME_INFO, GET_BROKER_CONFIG, UPDATE_BROKER_CONFIG (hot keys only; see
`HOT_KEYS`), DELETE_EXPIRED_COMMITLOG.

Topic attributes use RocketMQ 5's syntax (`+key=value` sets, `-key` deletes; stored without the
sign, as `AttributeUtil.alterCurrentAttributes` does). A topic created with
`+ferry.fenced=true` is fenced (`fence.py`): it has exactly one read and one write queue, and no
later update may unfence it or change its queues (a safety setting never fails open); an
existing unfenced topic cannot become fenced (its records carry no fence). Deleting it stays an
admin action.

Controller mode (issue 20 section 3): once the broker registered with a controller, topic
creates and deletes of topics that are not broker-local go to the controller as changes of this
broker's group (`topicsync.TopicSync`), which decides for the whole cluster; the broker answers
once its own table holds the outcome.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Final

import msgspec

from ferrymq.broker import retention, runtime
from ferrymq.broker.consumer import push_to_group
from ferrymq.broker.fence import FENCED_ATTRIBUTE
from ferrymq.broker.metadata import GroupConfig, GroupFile
from ferrymq.broker.popservice import reset_pop_offsets
from ferrymq.broker.state import BrokerState
from ferrymq.config import (
    ConfigError,
    build_config,
    config_keys,
    parse_properties,
    properties_text,
)
from ferrymq.errors import FerryError, InvalidNameError, RequestError
from ferrymq.metrics.stats import StatsTable
from ferrymq.model import validate_group, validate_topic
from ferrymq.rpc.connection import Connection
from ferrymq.wire.bodies import (
    BrokerStatsData,
    BrokerStatsItem,
    ClientConnection,
    ConsumerConnection,
    ConsumeStats,
    ConsumeStatsEntry,
    FenceHolder,
    GroupList,
    KVTable,
    ProducerConnection,
    ProducerInfo,
    ProducerTableInfo,
    TopicConfig,
    TopicOffsetEntry,
    TopicStatsTable,
    decode_body,
    encode_body,
    encode_consume_stats,
    encode_reset_offsets,
    encode_topic_stats,
)
from ferrymq.wire.broker import (
    ConsumeMessageDirectlyResultRequestHeader,
    CreateTopicRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumeStatsRequestHeader,
    GetFenceRequestHeader,
    GetProducerConnectionListRequestHeader,
    GetSubscriptionGroupConfigRequestHeader,
    GetTopicConfigRequestHeader,
    GetTopicStatsInfoRequestHeader,
    QueryTopicConsumeByWhoRequestHeader,
    ResetOffsetRequestHeader,
    ViewBrokerStatsDataRequestHeader,
    parse_attribute_changes,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.fastjson import encode_sorted
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.msgid import decode_offset_msg_id
from ferrymq.wire.records import store_timestamp_of
from ferrymq.wire.topics import alter_attributes, check_fenced, is_broker_local_topic

__all__ = [
    "HOT_KEYS",
    "consume_message_directly",
    "create_topic",
    "delete_expired_commit_log",
    "delete_group",
    "delete_topic",
    "get_all_groups",
    "get_all_producer_info",
    "get_all_topics",
    "get_broker_config",
    "get_consume_stats",
    "get_consumer_connections",
    "get_consumer_running_info",
    "get_fence",
    "get_producer_connections",
    "get_runtime_info",
    "get_subscription_group_config",
    "get_system_topics",
    "get_topic_config",
    "get_topic_stats",
    "query_topic_consume_by_who",
    "reset_offset",
    "system_topic_list",
    "update_broker_config",
    "update_group",
    "view_broker_stats",
]

log = logging.getLogger(__name__)

HOT_KEYS: Final = frozenset(
    {
        "brokerPermission",
        "autoCreateTopicEnable",
        "autoCreateSubscriptionGroup",
        "defaultTopicQueueNums",
        "longPollingEnable",
        "shortPollingTimeMills",
        "maxMessageSize",
        "syncFlushTimeout",
        "fileReservedTime",
        "diskMaxUsedSpaceRatio",
        "deleteWhen",
        "transactionTimeOut",
        "transactionCheckMax",
        "transactionCheckInterval",
        "maxReconsumeTimes",
    }
)
"""Keys UPDATE_BROKER_CONFIG may change on a running broker; others need a restart."""


def _ok(request: RemotingCommand, body: bytes = b"") -> RemotingCommand:
    return request.make_response(ResponseCode.SUCCESS, body=body)


async def _ok_once_committed(state: BrokerState, request: RemotingCommand) -> RemotingCommand:
    """SUCCESS once a metadata change is on every in-sync replica (a failover keeps it)."""
    if state.metadata_committed is not None and not await state.metadata_committed():
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            "the change was made but not replicated in time; a failover may undo it: retry",
        )
    return _ok(request)


async def create_topic(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """UPDATE_AND_CREATE_TOPIC (17): create a topic or change its queues and permissions."""
    header = from_ext_fields(CreateTopicRequestHeader, request.ext_fields)
    try:
        validate_topic(header.topic)
    except InvalidNameError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
    if not (0 < header.read_queue_nums <= 1024 and 0 < header.write_queue_nums <= 1024):
        raise RequestError(ResponseCode.SYSTEM_ERROR, "queue numbers must be in 1..1024")
    if state.topic_authority is not None and not is_broker_local_topic(header.topic):
        await state.topic_authority.put_on_group(header)
        return await _ok_once_committed(state, request)
    current = state.topics.get(header.topic)
    try:
        attributes = _altered_attributes(current, parse_attribute_changes(header.attributes))
        _check_fenced(current, attributes, header.read_queue_nums, header.write_queue_nums)
    except ValueError as exc:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"topic {header.topic}: {exc}") from None
    config = TopicConfig(
        topic_name=header.topic,
        read_queue_nums=header.read_queue_nums,
        write_queue_nums=header.write_queue_nums,
        perm=header.perm,
        topic_filter_type=header.topic_filter_type,
        topic_sys_flag=header.topic_sys_flag or 0,
        order=header.order,
        attributes=attributes,
    )
    if state.topics.put(config):
        log.info(
            "topic %s set: %d read / %d write queues, perm %d",
            header.topic,
            header.read_queue_nums,
            header.write_queue_nums,
            header.perm,
        )
        state.on_topics_changed()
    return await _ok_once_committed(state, request)


def _altered_attributes(current: TopicConfig | None, changes: dict[str, str]) -> dict[str, str]:
    """The attributes after RocketMQ 5's changes (`wire.topics.alter_attributes`).

    Raises:
        ValueError: a deletion on create, or of an attribute the topic does not have.
    """
    return alter_attributes(current.attributes if current is not None else None, changes)


def _check_fenced(
    current: TopicConfig | None, attributes: dict[str, str], read_queues: int, write_queues: int
) -> None:
    """Refuse what would make a fenced topic unsafe (`wire.topics.check_fenced`).

    Raises:
        ValueError: naming what is refused.
    """
    check_fenced(
        current.attributes if current is not None else None, attributes, read_queues, write_queues
    )


async def delete_topic(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """DELETE_TOPIC_IN_BROKER (215): drop the topic's config, queues and offsets."""
    header = from_ext_fields(DeleteTopicRequestHeader, request.ext_fields)
    if state.topic_authority is not None and not is_broker_local_topic(header.topic):
        await state.topic_authority.remove_from_group(header.topic)
        return await _ok_once_committed(state, request)
    if state.topics.delete(header.topic):
        state.fences.forget(header.topic)
        state.store.delete_topic(header.topic)
        state.offsets.delete_topic(header.topic)
        log.info("topic %s deleted", header.topic)
        state.on_topics_changed()
    return await _ok_once_committed(state, request)


async def get_all_topics(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_ALL_TOPIC_CONFIG (21)."""
    return _ok(request, encode_body(state.topics.wrapper()))


async def get_topic_stats(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_TOPIC_STATS_INFO (202): every queue's bounds and last store time.

    `topicPutTps` is RocketMQ 5's: the topic's messages put per second over the last minute on
    this broker (`tpsTopicPutNums`).
    """
    header = from_ext_fields(GetTopicStatsInfoRequestHeader, request.ext_fields)
    config = state.topics.get(header.topic)
    if config is None:
        raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist")
    entries = []
    for queue_id in range(config.write_queue_nums):
        high = state.store.max_queue_offset(header.topic, queue_id)
        last = 0
        if high > 0:
            result = state.store.get(header.topic, queue_id, high - 1, 1)
            if result.records:
                last = store_timestamp_of(result.records[0])
        entries.append(
            TopicOffsetEntry(
                topic=header.topic,
                broker_name=state.config.broker_name,
                queue_id=queue_id,
                min_offset=state.store.min_queue_offset(header.topic, queue_id),
                max_offset=high,
                last_update_timestamp=last,
            )
        )
    put = state.stats.put.rate(header.topic, state.clock(), 60.0)
    table = TopicStatsTable(entries, topic_put_tps=round(put.count_per_s, 2))
    return _ok(request, encode_topic_stats(table))


async def get_fence(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_FENCE (ferrymq's own): a fenced topic's holder and where its live tail starts.

    A master answers with its own view (its uncommitted appends included: what its next decision
    uses), a slave with what its committed records hold.
    """
    header = from_ext_fields(GetFenceRequestHeader, request.ext_fields)
    config = state.topics.get(header.topic)
    if config is None:
        raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{header.topic}] not exist")
    if config.attributes.get(FENCED_ATTRIBUTE) != "true":
        raise RequestError(
            ResponseCode.INVALID_PARAMETER, f"topic {header.topic} is not a fenced topic"
        )
    fence_log = state.fences.current(header.topic)
    fence = fence_log.fence
    holder = FenceHolder(
        epoch=fence.epoch,
        writer=fence.writer,
        url=fence.url,
        live_start_offset=fence_log.live_start_queue_offset,
    )
    return _ok(request, encode_body(holder))


def _stored_at(state: BrokerState, topic: str, queue_id: int, queue_offset: int) -> int:
    """When the message at `queue_offset` was stored; 0 when there is none.

    RocketMQ's `lastTimestamp` of a group in a queue: its last consumed message's store time
    (0: nothing consumed yet, or that message was deleted since).
    """
    store = state.store
    if (
        not store.min_queue_offset(topic, queue_id)
        <= queue_offset
        < store.max_queue_offset(topic, queue_id)
    ):
        return 0
    result = store.get(topic, queue_id, queue_offset, 1)
    return store_timestamp_of(result.records[0]) if result.records else 0


async def get_consume_stats(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_CONSUME_STATS (208): a group's committed offsets against the queues' ends."""
    header = from_ext_fields(GetConsumeStatsRequestHeader, request.ext_fields)
    committed = state.offsets.of_group(header.consumer_group)
    topics = [header.topic] if header.topic else sorted(committed)
    entries: list[ConsumeStatsEntry] = []
    for topic in topics:
        config = state.topics.get(topic)
        if config is None:
            continue
        for queue_id in range(config.write_queue_nums):
            consumer_offset = committed.get(topic, {}).get(queue_id, 0)
            entries.append(
                ConsumeStatsEntry(
                    topic=topic,
                    broker_name=state.config.broker_name,
                    queue_id=queue_id,
                    broker_offset=state.store.max_queue_offset(topic, queue_id),
                    consumer_offset=consumer_offset,
                    last_timestamp=_stored_at(state, topic, queue_id, consumer_offset - 1),
                    # ferrymq keeps no pull offset: the committed one (nothing counted in flight)
                    pull_offset=consumer_offset,
                )
            )
    tps = state.stats.consume_tps(header.topic or None, header.consumer_group, state.clock())
    return _ok(request, encode_consume_stats(ConsumeStats(entries, consume_tps=round(tps, 2))))


async def update_group(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): body is a `SubscriptionGroupConfig`."""
    config = decode_body(request.body, GroupConfig)
    try:
        validate_group(config.group_name)
    except InvalidNameError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
    state.groups.put(config)
    return await _ok_once_committed(state, request)


async def delete_group(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """DELETE_SUBSCRIPTIONGROUP (207).

    The group's POP state and its stats (metric series) go with it (`metalog`, on every
    replica); with `cleanOffset` its offsets too, as replicated deletes (RocketMQ's
    `AdminBrokerProcessor.deleteSubscriptionGroup`).
    """
    header = from_ext_fields(DeleteSubscriptionGroupRequestHeader, request.ext_fields)
    state.groups.delete(header.group_name)
    if header.clean_offset:
        state.offsets.delete_group(header.group_name)
    return await _ok_once_committed(state, request)


async def get_all_groups(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201)."""
    return _ok(request, encode_body(GroupFile(dict(state.groups.configs))))


async def get_runtime_info(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_BROKER_RUNTIME_INFO (28): a few figures operators look at, as strings."""
    store = state.store
    table = {
        "brokerVersionDesc": "ferrymq",
        "msgPutTotalTodayNow": str(sum(q.max_queue_offset for q in store.queues)),
        "commitLogMinOffset": str(store.min_log_offset),
        "commitLogMaxOffset": str(store.max_log_offset),
        "flushedLogOffset": str(store.flushed_log_offset),
        "topicCount": str(len(state.topics.configs)),
        "consumerGroupCount": str(len(state.clients.consumers)),
        "brokerRole": state.role.value,
        "confirmOffset": str(store.confirm_offset),
    }
    replication = state.replication
    if replication is not None:
        table["syncStateSet"] = ",".join(str(m) for m in sorted(replication.state.members))
        table["masterEpoch"] = str(replication.epochs.history.last_epoch)
        for broker_id in sorted(replication.state.members - {replication.state.master_id}):
            ack = replication.state.ack_of(broker_id)
            table[f"slaveAckOffset.{broker_id}"] = "" if ack is None else str(ack)
    table.update(state.stats.runtime_keys(state.clock()))  # putTps, getTransferedTps, ...
    table["getTransferredTps"] = table["getTransferedTps"]  # RocketMQ 5's spelling
    table.update(runtime.runtime_keys(state))  # every other key rocketmq-exporter reads
    return _ok(request, encode_body(KVTable(table)))


async def delete_expired_commit_log(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """DELETE_EXPIRED_COMMITLOG (329): delete expired segments now, whatever `deleteWhen` says.

    RocketMQ `executeDeleteFilesManually`; fenced topics' live tails are copied forward first
    and never deleted (`retention.py`). The answer's `deleted` field counts the segments.
    """
    deleted = await retention.delete_expired(state)
    log.info("deleted %d expired commit-log segment(s) on request from %s", deleted, conn.peer)
    return request.make_response(ResponseCode.SUCCESS, ext_fields={"deleted": str(deleted)})


async def get_broker_config(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_BROKER_CONFIG (26): every key as `key=value` lines, secrets as `******`."""
    return _ok(request, properties_text(state.config).encode())


async def update_broker_config(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """UPDATE_BROKER_CONFIG (25): `key=value` lines; only `HOT_KEYS` change a running broker."""
    try:
        values = parse_properties(request.body.decode(), "UPDATE_BROKER_CONFIG")
    except UnicodeDecodeError:
        raise RequestError(ResponseCode.SYSTEM_ERROR, "the body is not UTF-8") from None
    except ConfigError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
    cold = sorted(set(values) - HOT_KEYS)
    if cold:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            f"{', '.join(cold)}: not changeable at runtime (restart the broker)",
        )
    try:
        changed, _ = build_config(type(state.config), values)
    except ConfigError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
    fields = config_keys(type(state.config))
    updates = {fields[key].name: getattr(changed, fields[key].name) for key in values}
    state.config = dataclasses.replace(state.config, **updates)
    if "brokerPermission" in values:
        state.perm = state.config.broker_permission
        state.on_topics_changed()
    log.info("broker config updated: %s", ", ".join(f"{k}={v}" for k, v in values.items()))
    return _ok(request)


async def get_consumer_connections(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_CONSUMER_CONNECTION_LIST (203): a group's online clients, subscriptions and modes.

    RocketMQ `getConsumerConnectionList`: a group with no online client is CONSUMER_NOT_ONLINE.
    """
    header = from_ext_fields(GetConsumerConnectionListRequestHeader, request.ext_fields)
    group = state.clients.consumers.get(header.consumer_group)
    if group is None or not group.channels:
        raise RequestError(
            ResponseCode.CONSUMER_NOT_ONLINE,
            f"the consumer group[{header.consumer_group}] not online",
        )
    body = ConsumerConnection(
        connection_set=[
            ClientConnection(
                client_addr=channel.conn.peer,
                client_id=client_id,
                language=channel.language,
                version=channel.version,
            )
            for client_id, channel in sorted(group.channels.items())
        ],
        consume_from_where=group.consume_from_where,
        consume_type=group.consume_type,
        message_model=group.message_model,
        subscription_table=dict(sorted(group.subscriptions.items())),
    )
    return _ok(request, encode_sorted(body))


async def get_producer_connections(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_PRODUCER_CONNECTION_LIST (204): a producer group's clients.

    RocketMQ `getProducerConnectionList`: a group with no client is SYSTEM_ERROR "not exist".
    """
    header = from_ext_fields(GetProducerConnectionListRequestHeader, request.ext_fields)
    channels = state.clients.producers.get(header.producer_group, {})
    if not channels:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"the producer group[{header.producer_group}] not exist"
        )
    body = ProducerConnection(
        [
            ClientConnection(
                client_addr=channel.conn.peer,
                client_id=client_id,
                language=channel.language,
                version=channel.version,
            )
            for client_id, channel in sorted(channels.items())
        ]
    )
    return _ok(request, encode_sorted(body))


async def get_all_producer_info(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_ALL_PRODUCER_INFO (328): every producer group and its clients (`ProducerTableInfo`)."""
    now, wall_ms = state.clock(), state.wall_ms()
    data = {
        group: [
            ProducerInfo(
                client_id=client_id,
                language=channel.language,
                # the table keeps monotonic seconds: its wall time is now less the silence
                last_update_timestamp=wall_ms - round((now - channel.last_update) * 1000),
                remote_i_p=channel.conn.peer,
                version=channel.version,
            )
            for client_id, channel in sorted(channels.items())
        ]
        for group, channels in sorted(state.clients.producers.items())
        if channels
    }
    return _ok(request, encode_sorted(ProducerTableInfo(data)))


async def query_topic_consume_by_who(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """QUERY_TOPIC_CONSUME_BY_WHO (300): groups subscribed to the topic or holding its offsets."""
    header = from_ext_fields(QueryTopicConsumeByWhoRequestHeader, request.ext_fields)
    online = {
        name
        for name, group in state.clients.consumers.items()
        if header.topic in group.subscriptions
    }
    groups = sorted(online | set(state.offsets.groups_of(header.topic)))
    return _ok(request, encode_sorted(GroupList(groups)))


async def reset_offset(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """INVOKE_BROKER_TO_RESET_OFFSET (222): move a group's offsets in a topic while it runs.

    RocketMQ `Broker2Client.resetOffset`: each of this broker's queues of the topic goes to the
    first offset stored at `timestamp` (-1: the queue's end); without `isForce` a queue only
    moves back. The group's running clients get the offsets (RESET_CONSUMER_CLIENT_OFFSET,
    oneway) and start there; the broker commits them too, so they hold whatever the clients
    do. A group with no client online is CONSUMER_NOT_ONLINE and nothing moves (the admin tool
    then resets offline), unless it popped the topic here (POP clients send no heartbeat): its
    pop positions move and what it has in flight is dropped (RocketMQ 5's server-side reset,
    `popservice.reset_pop_offsets`). Answers the `ResetOffsetBody`.
    """
    header = from_ext_fields(ResetOffsetRequestHeader, request.ext_fields)
    config = state.topics.get(header.topic)
    if config is None:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            f"[reset-offset] reset offset failed, no topic in this broker. topic={header.topic}",
        )
    group = state.clients.consumers.get(header.group)
    popping = state.pop.has_topic(header.group, header.topic)  # POP clients send no heartbeat
    if (group is None or not group.channels) and not popping:
        raise RequestError(
            ResponseCode.CONSUMER_NOT_ONLINE,
            f"Consumer not online, so can not reset offset, Group: {header.group} "
            f"Topic: {header.topic} Timestamp: {header.timestamp}",
        )
    store = state.store
    committed = state.offsets.of_group(header.group).get(header.topic, {})
    offsets: dict[tuple[str, str, int], int] = {}
    for queue_id in range(config.write_queue_nums):
        if header.timestamp == -1:
            target = store.max_queue_offset(header.topic, queue_id)
        else:
            target = max(0, store.search_queue_offset(header.topic, queue_id, header.timestamp))
        current = committed.get(queue_id)
        if not header.is_force and current is not None and current < target:
            target = current
        offsets[header.topic, state.config.broker_name, queue_id] = target
        state.offsets.commit(header.topic, header.group, queue_id, target)
    if popping:
        reset_pop_offsets(
            state, header.group, header.topic, {q: o for (_, _, q), o in offsets.items()}
        )
    if state.metadata_committed is not None and not await state.metadata_committed():
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, "the reset offsets were not replicated in time; reset again"
        )
    body = encode_reset_offsets(offsets)
    push_to_group(
        state,
        header.group,
        RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
        to_ext_fields(header),
        body,
    )
    log.info(
        "offsets of %s in %s reset to %s for %d client(s), asked by %s",
        header.group,
        header.topic,
        {queue_id: offset for (_, _, queue_id), offset in sorted(offsets.items())},
        0 if group is None else len(group.channels),
        conn.peer,
    )
    return _ok(request, body)


_STATS_NAMES: Final = {
    "TOPIC_PUT_NUMS": ("put", 0),
    "TOPIC_PUT_SIZE": ("put", 1),
    "GROUP_GET_NUMS": ("get", 0),
    "GROUP_GET_SIZE": ("get", 1),
}
"""RocketMQ `BrokerStatsManager` stats this broker keeps: which table, messages (0) or bytes (1).
TOPIC_* are keyed by topic, GROUP_* by `topic@group`."""
_PERIODS_S: Final = (86400.0, 3600.0, 60.0)


def _stats_item(
    table: StatsTable[Any], key: Any, index: int, now: float, uptime: float, period_s: float
) -> BrokerStatsItem:
    """The stat over the last `period_s`.

    Exact while the broker is younger than the period (everything since it started) or the
    period fits the table's window; beyond the window (an hour or a day), the window's rate
    times the period. `avgpt` is not kept (0).
    """
    if uptime <= period_s:
        total = table.total(key)[index]
        return BrokerStatsItem(sum=total, tps=round(total / max(uptime, 1.0), 2))
    rate = table.rate(key, now, min(period_s, table.window_s))
    per_s = rate.count_per_s if index == 0 else rate.bytes_per_s
    return BrokerStatsItem(sum=round(per_s * period_s), tps=round(per_s, 2))


async def view_broker_stats(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """VIEW_BROKER_STATS_DATA (315): a stat's sum and TPS over the last minute, hour and day.

    RocketMQ `viewBrokerStatsData`, from `BrokerStats` (`broker/metrics.py`); a stat this broker
    does not keep, or a key it never counted, is SYSTEM_ERROR "The stats <name> <key> not exist".
    """
    header = from_ext_fields(ViewBrokerStatsDataRequestHeader, request.ext_fields)
    stats = state.stats
    found = _STATS_NAMES.get(header.stats_name)
    table: StatsTable[Any] | None = None
    key: Any = header.stats_key
    index = 0
    if found is not None:
        which, index = found
        if which == "put":
            table = stats.put
        else:
            topic, _, group = header.stats_key.partition("@")
            table, key = stats.get, (topic, group)
    if found is None or table is None or key not in {k for k, _, _ in table.items()}:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            f"The stats <{header.stats_name}> <{header.stats_key}> not exist",
        )
    now = state.clock()
    uptime = now - stats.started
    day, hour, minute = (
        _stats_item(table, key, index, now, uptime, period) for period in _PERIODS_S
    )
    body = BrokerStatsData(stats_day=day, stats_hour=hour, stats_minute=minute)
    return _ok(request, encode_sorted(body))


RUNNING_INFO_TIMEOUT_S: Final = 5.0
"""How long a client gets to answer a relayed GET_CONSUMER_RUNNING_INFO."""


async def _call_client(
    state: BrokerState, request: RemotingCommand, group_name: str, client_id: str | None
) -> RemotingCommand:
    """Relay `request` to one online client of a group; its answer comes back as it is.

    RocketMQ `Broker2Client.callClient`: a client not online is SYSTEM_ERROR "The Consumer
    <group> <client id> not online"; one that does not answer in `RUNNING_INFO_TIMEOUT_S`
    is SYSTEM_ERROR naming it.
    """
    group = state.clients.consumers.get(group_name)
    channel = group.channels.get(client_id) if group is not None and client_id else None
    if channel is None or channel.conn.is_closed:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"The Consumer <{group_name}> <{client_id}> not online"
        )
    try:
        answer = await channel.conn.call(request, RUNNING_INFO_TIMEOUT_S)
    except FerryError as exc:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            f"The Consumer <{group_name}> <{client_id}> did not answer: {exc}",
        ) from None
    return answer


async def get_consumer_running_info(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_CONSUMER_RUNNING_INFO (307): ask one client of a group for its running state.

    The request goes on to the client's connection (`_call_client`) and its answer (a
    `ConsumerRunningInfo`) comes back as it is.
    """
    header = from_ext_fields(GetConsumerRunningInfoRequestHeader, request.ext_fields)
    relayed = RemotingCommand(
        code=RequestCode.GET_CONSUMER_RUNNING_INFO, ext_fields=to_ext_fields(header)
    )
    answer = await _call_client(state, relayed, header.consumer_group, header.client_id)
    return request.make_response(answer.code, remark=answer.remark, body=answer.body)


async def consume_message_directly(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """CONSUME_MESSAGE_DIRECTLY (309): have one client of a group consume one stored message.

    RocketMQ `AdminBrokerProcessor.consumeMessageDirectly` (the Dashboard's resend, mqadmin
    `queryMsgById -g G -d CLIENT`): the message at the offset message id's log offset goes to
    the client with the request (`brokerName` set to this broker), and the client's
    `ConsumeMessageDirectlyResult` comes back as it is. Nothing is committed.
    """
    header = from_ext_fields(ConsumeMessageDirectlyResultRequestHeader, request.ext_fields)
    try:
        _, log_offset = decode_offset_msg_id(header.msg_id or "")
        body = state.store.read_record(log_offset)
    except (ValueError, FerryError) as exc:
        raise RequestError(
            ResponseCode.SYSTEM_ERROR, f"no message with id {header.msg_id}: {exc}"
        ) from None
    relayed = RemotingCommand(
        code=RequestCode.CONSUME_MESSAGE_DIRECTLY,
        ext_fields=to_ext_fields(
            msgspec.structs.replace(header, broker_name=state.config.broker_name)
        ),
        body=body,
    )
    answer = await _call_client(state, relayed, header.consumer_group, header.client_id)
    return request.make_response(answer.code, remark=answer.remark, body=answer.body)


ROCKETMQ_SYSTEM_TOPICS: Final = (
    "BenchmarkTest",
    "OFFSET_MOVED_EVENT",
    "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "SCHEDULE_TOPIC_XXXX",
    "SELF_TEST_TOPIC",
    "TBW102",
    "TRANS_CHECK_MAX_TIME_TOPIC",
)
"""RocketMQ `TopicValidator`'s fixed system topics (its `SYSTEM_TOPIC_SET`)."""


async def get_system_topics(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305): the system topics, as a `TopicList`.

    RocketMQ answers `TopicValidator.getSystemTopicSet()`: the fixed set, the broker's cluster
    and broker name (its `TopicConfigManager` adds them) and the `rmq_sys_` topics it made.
    Here likewise: the fixed set, both names and this broker's `rmq_sys_`/`RMQ_SYS_` topics
    (ferrymq's own system topics among them), sorted (RocketMQ's is a hash set). The body is a
    `TopicList` with no `brokerAddr` (FastJSON leaves the null out).
    """
    config = state.config
    names = {*ROCKETMQ_SYSTEM_TOPICS, config.broker_cluster_name, config.broker_name}
    names.update(t for t in state.topics.configs if t.startswith(("rmq_sys_", "RMQ_SYS_")))
    return _ok(request, system_topic_list(names))


def system_topic_list(names: set[str]) -> bytes:
    """The 305 answer: a `TopicList` of `names` sorted, no `brokerAddr` (FastJSON omits null)."""
    return encode_sorted({"topicList": sorted(names)})


async def get_topic_config(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_TOPIC_CONFIG (351): one topic's config (`TopicConfigAndQueueMapping`, no mapping)."""
    header = from_ext_fields(GetTopicConfigRequestHeader, request.ext_fields)
    config = state.topics.get(header.topic)
    if config is None:
        raise RequestError(
            ResponseCode.TOPIC_NOT_EXIST, f"No topic in this broker. topic: {header.topic}"
        )
    return _ok(request, encode_sorted(config))


async def get_subscription_group_config(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    """GET_SUBSCRIPTIONGROUP_CONFIG (352): one subscription group's config."""
    header = from_ext_fields(GetSubscriptionGroupConfigRequestHeader, request.ext_fields)
    config = state.groups.get(header.group)
    if config is None:
        raise RequestError(
            ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            f"No group in this broker. group: {header.group}",
        )
    return _ok(request, encode_sorted(config))
