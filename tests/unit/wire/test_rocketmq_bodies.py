"""Every served code's JSON body against RocketMQ's: recorded where found, else derived.

One row per (code, request or answer) whose body is JSON. ferrymq's encoder, given the values
RocketMQ's body holds, writes that body: byte for byte where `exact`, else the same after the
row's named differences (each a field Java fills with its default, or a number map key ferrymq
quotes, or a null ferrymq writes where FastJSON leaves it out). ferrymq's decoder reads
RocketMQ's body back to the same values. docs/operations.md lists which rows are recorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from ferrymq.broker import admin, auth_admin
from ferrymq.broker.broker import _HANDLERS as BROKER_HANDLERS
from ferrymq.broker.metadata import GroupConfig, GroupFile
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.security import acl2
from ferrymq.security.acl2admin import decide_admin
from ferrymq.wire import fastjson
from ferrymq.wire.bodies import (
    BrokerData,
    BrokerStatsData,
    BrokerStatsItem,
    ClientConnection,
    ClusterInfo,
    ConsumeMessageDirectlyResult,
    ConsumerConnection,
    ConsumerData,
    ConsumerIdList,
    ConsumeStats,
    ConsumeStatsEntry,
    DataVersion,
    GroupList,
    HeartbeatData,
    KVTable,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueueBody,
    ProducerConnection,
    ProducerData,
    ProducerInfo,
    ProducerTableInfo,
    QueueData,
    RegisterBrokerBody,
    SubscriptionData,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicOffsetEntry,
    TopicRouteData,
    TopicStatsTable,
    decode_body,
    decode_consume_stats,
    decode_register_body,
    decode_reset_offsets,
    decode_topic_stats,
    encode_body,
    encode_consume_stats,
    encode_directly_result,
    encode_register_body,
    encode_reset_offsets,
    encode_topic_stats,
)
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.controller import (
    BrokerMemberGroup,
    BrokerReplicasInfo,
    ElectMasterResponseBody,
    EpochEntry,
    EpochEntryCache,
    ReplicaIdentity,
    ReplicasInfo,
    SyncStateSet,
    decode_broker_names,
)
from ferrymq.wire.pop import BatchAck, BatchAckMessageRequestBody

from . import rocketmq_derived as derived
from . import rocketmq_recorded as recorded

R = RequestCode


@dataclass(frozen=True)
class Row:
    """One code's body: RocketMQ's, the values it holds, and how ferrymq writes and reads it."""

    codes: tuple[int, ...]
    part: str
    rocketmq: bytes
    value: object
    encode: Callable[[Any], bytes] | None
    decode: Callable[[bytes], object]
    exact: bool = True
    rocketmq_only: tuple[str, ...] = ()
    """Fields RocketMQ writes and ferrymq does not (Java reads its default), as dotted paths."""
    ferry_only: tuple[str, ...] = ()
    """Fields ferrymq writes that this RocketMQ body lacks (Java ignores them)."""
    unordered: tuple[str, ...] = ()
    """Maps whose entries are in a Java HashMap's order, compared as sets."""


def _struct(body_type: type[Any]) -> Callable[[bytes], object]:
    return lambda data: decode_body(data, body_type)


VERSION = DataVersion(state_version=0, timestamp=1700000000000, counter=3)
TOPIC = TopicConfig(topic_name="T", read_queue_nums=8, write_queue_nums=8)
WRAPPER = TopicConfigSerializeWrapper({"T": TOPIC}, VERSION)
MQ = MessageQueueBody(topic="T", broker_name="broker-a", queue_id=0)
SUBSCRIPTION = SubscriptionData(topic="T", sub_version=1700000000000)
CONNECTION = ClientConnection(
    client_addr=derived.CLIENT_ADDR, client_id=derived.CLIENT, language="JAVA", version=453
)
LOCK = LockBatchRequestBody(consumer_group="G", client_id=derived.CLIENT, mq_set=[MQ])
GROUP = GroupConfig(group_name="MyGroup")
GROUP_MISSING = ("attributes", "consumeTimeoutMinute", "groupRetryPolicy", "groupSysFlag")
"""`SubscriptionGroupConfig` fields ferrymq's GroupConfig (broker/metadata.py) does not have."""
MAPPING = ("mappingDataVersion", "topicQueueMappingDetailMap")
"""Static-topic mapping fields: ferrymq has no static topics."""
SYNC = SyncStateSet(sync_state_set=[1, 2], sync_state_set_epoch=3)
RESET = {("topicB", "RaftNode00", queue_id): 0 for queue_id in range(4)}

ROWS: list[Row] = [
    Row(
        (R.HEART_BEAT,),
        "request",
        derived.HEART_BEAT,
        HeartbeatData(
            client_id=derived.CLIENT,
            producer_data_set=[ProducerData("PG")],
            consumer_data_set=[ConsumerData(group_name="G", subscription_data_set=[SUBSCRIPTION])],
        ),
        encode_body,
        _struct(HeartbeatData),
        exact=False,
        rocketmq_only=("heartbeatFingerprint", "withoutSub"),
    ),
    Row(
        (R.HEART_BEAT, R.GET_CONSUMER_CONNECTION_LIST),
        "request (a SubscriptionData)",
        recorded.HEARTBEAT_SUBSCRIPTION_4X,
        SubscriptionData(topic="gaohongbin-test", sub_version=1680444498755),
        encode_body,
        _struct(SubscriptionData),
    ),
    Row(
        (R.GET_CONSUMER_LIST_BY_GROUP,),
        "answer",
        derived.CONSUMER_LIST,
        ConsumerIdList([derived.CLIENT, derived.CLIENT_2]),
        encode_body,
        _struct(ConsumerIdList),
    ),
    Row(
        (R.LOCK_BATCH_MQ, R.UNLOCK_BATCH_MQ),
        "request",
        derived.LOCK_BATCH_REQUEST,
        LOCK,
        encode_body,
        _struct(LockBatchRequestBody),
    ),
    Row(
        (R.LOCK_BATCH_MQ,),
        "answer",
        derived.LOCK_BATCH_RESPONSE,
        LockBatchResponseBody([MQ]),
        encode_body,
        _struct(LockBatchResponseBody),
    ),
    Row(
        (R.GET_ALL_TOPIC_CONFIG,),
        "answer",
        derived.TOPIC_CONFIG_WRAPPER,
        WRAPPER,
        encode_body,
        _struct(TopicConfigSerializeWrapper),
        exact=False,
        rocketmq_only=MAPPING,
    ),
    Row(
        (R.GET_TOPIC_CONFIG,),
        "answer",
        recorded.TOPIC_CONFIG_5X,
        TopicConfig(
            topic_name="attr-topic",
            attributes={"+fileReservedTime": "72", "+deleteWhen": "04"},
        ),
        fastjson.encode_sorted,
        _struct(TopicConfig),
        exact=False,
        unordered=("attributes",),
    ),
    Row(
        (R.GET_TOPIC_CONFIG,),
        "answer (no attributes)",
        derived.TOPIC_CONFIG,
        TOPIC,
        fastjson.encode_sorted,
        _struct(TopicConfig),
    ),
    Row(
        (R.REGISTER_BROKER,),
        "request",
        derived.REGISTER_BROKER,
        RegisterBrokerBody(WRAPPER),
        lambda body: encode_register_body(body, compressed=False),
        lambda data: decode_register_body(data, compressed=False),
        exact=False,
        rocketmq_only=tuple(f"topicConfigSerializeWrapper.{name}" for name in MAPPING),
    ),
    Row(
        (R.GET_SUBSCRIPTIONGROUP_CONFIG, R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP),
        "answer / request",
        recorded.SUBSCRIPTION_GROUP_5X,
        GROUP,
        fastjson.encode_sorted,
        _struct(GroupConfig),
        exact=False,
        rocketmq_only=GROUP_MISSING,
    ),
    Row(
        (R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,),
        "answer",
        derived.GROUP_WRAPPER,
        GroupFile({"MyGroup": GROUP}, VERSION),
        encode_body,
        _struct(GroupFile),
        exact=False,
        rocketmq_only=(
            "forbiddenTable",
            *(f"subscriptionGroupTable.MyGroup.{name}" for name in GROUP_MISSING),
        ),
    ),
    Row(
        (R.GET_BROKER_RUNTIME_INFO,),
        "answer",
        derived.RUNTIME_INFO,
        KVTable({"brokerVersionDesc": "V5_3_2", "msgPutTotalTodayNow": "5"}),
        encode_body,
        _struct(KVTable),
    ),
    Row(
        (R.GET_TOPIC_STATS_INFO,),
        "answer",
        recorded.TOPIC_STATS_5X,
        TopicStatsTable(
            [
                TopicOffsetEntry(
                    topic="MyTopic",
                    broker_name="broker-a",
                    queue_id=3,
                    min_offset=0,
                    max_offset=500,
                    last_update_timestamp=1700000000000,
                )
            ]
        ),
        encode_topic_stats,
        decode_topic_stats,
    ),
    Row(
        (R.GET_CONSUME_STATS,),
        "answer",
        recorded.CONSUME_STATS_5X,
        ConsumeStats(
            [
                ConsumeStatsEntry(
                    topic="MyTopic",
                    broker_name="broker-a",
                    queue_id=3,
                    broker_offset=100,
                    consumer_offset=90,
                    last_timestamp=1700000000000,
                )
            ],
            consume_tps=1.5,
        ),
        encode_consume_stats,
        decode_consume_stats,
    ),
    Row(
        (R.GET_CONSUME_STATS,),
        "answer (4.x, read only)",
        recorded.CONSUME_STATS_4X,
        ConsumeStats(
            [
                ConsumeStatsEntry(
                    topic="topic_test",
                    broker_name="broker-a",
                    queue_id=queue_id,
                    broker_offset=0,
                    consumer_offset=0,
                )
                for queue_id in (7, 6)
            ]
        ),
        None,
        decode_consume_stats,
    ),
    Row(
        (R.INVOKE_BROKER_TO_RESET_OFFSET, R.RESET_CONSUMER_CLIENT_OFFSET),
        "answer / request",
        recorded.RESET_OFFSET_BODY_4X,
        RESET,
        encode_reset_offsets,
        decode_reset_offsets,
    ),
    Row(
        (R.GET_CONSUMER_CONNECTION_LIST,),
        "answer",
        derived.CONSUMER_CONNECTION,
        ConsumerConnection(connection_set=[CONNECTION], subscription_table={"T": SUBSCRIPTION}),
        fastjson.encode_sorted,
        _struct(ConsumerConnection),
    ),
    Row(
        (R.GET_PRODUCER_CONNECTION_LIST,),
        "answer",
        derived.PRODUCER_CONNECTION,
        ProducerConnection([CONNECTION]),
        fastjson.encode_sorted,
        _struct(ProducerConnection),
    ),
    Row(
        (R.QUERY_TOPIC_CONSUME_BY_WHO,),
        "answer",
        derived.GROUP_LIST,
        GroupList(["G1", "G2"]),
        fastjson.encode_sorted,
        _struct(GroupList),
    ),
    Row(
        (R.VIEW_BROKER_STATS_DATA,),
        "answer",
        derived.BROKER_STATS,
        BrokerStatsData(
            stats_day=BrokerStatsItem(sum=120, tps=0.5),
            stats_hour=BrokerStatsItem(sum=60, tps=0.25),
            stats_minute=BrokerStatsItem(sum=6, tps=0.1),
        ),
        fastjson.encode_sorted,
        _struct(BrokerStatsData),
    ),
    Row(
        (R.GET_ALL_PRODUCER_INFO,),
        "answer",
        derived.PRODUCER_TABLE,
        ProducerTableInfo(
            {
                "PG": [
                    ProducerInfo(
                        client_id=derived.CLIENT,
                        last_update_timestamp=1700000000000,
                        remote_i_p=derived.CLIENT_ADDR,
                        version=453,
                    )
                ]
            }
        ),
        fastjson.encode_sorted,
        _struct(ProducerTableInfo),
    ),
    Row(
        (R.GET_ROUTEINFO_BY_TOPIC,),
        "answer",
        recorded.TOPIC_ROUTE_52,
        TopicRouteData(
            queue_datas=[
                QueueData(broker_name="broker-a", read_queue_nums=4, write_queue_nums=4, perm=6)
            ],
            broker_datas=[
                BrokerData(
                    cluster="DefaultCluster",
                    broker_name="broker-a",
                    broker_addrs={0: "127.0.0.1:10911"},
                )
            ],
        ),
        encode_body,
        _struct(TopicRouteData),
        exact=False,
    ),
    Row(
        (R.GET_BROKER_CLUSTER_INFO,),
        "answer",
        recorded.CLUSTER_INFO_4X,
        ClusterInfo(
            {
                "broker-a": BrokerData(
                    cluster="DefaultCluster",
                    broker_name="broker-a",
                    broker_addrs={0: "127.0.1.111:10911"},
                )
            },
            {"DefaultCluster": ["broker-a"]},
        ),
        encode_body,
        _struct(ClusterInfo),
        exact=False,
        ferry_only=("brokerAddrTable.broker-a.enableActingMaster",),
    ),
    Row(
        (R.GET_BROKER_CLUSTER_INFO,),
        "answer (5.x)",
        derived.CLUSTER_INFO,
        ClusterInfo(
            {
                "broker-a": BrokerData(
                    cluster="DefaultCluster",
                    broker_name="broker-a",
                    broker_addrs={0: "127.0.0.1:10911"},
                )
            },
            {"DefaultCluster": ["broker-a"]},
        ),
        encode_body,
        _struct(ClusterInfo),
        exact=False,
    ),
    Row(
        (R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, R.GET_TOPICS_BY_CLUSTER),
        "answer",
        derived.TOPIC_LIST,
        TopicList(["T1", "T2"]),
        encode_body,
        _struct(TopicList),
        exact=False,
    ),
    Row(
        (R.GET_SYSTEM_TOPIC_LIST_FROM_NS,),
        "answer",
        derived.SYSTEM_TOPIC_LIST,
        TopicList(["DefaultCluster", "broker-a"], "127.0.0.1:10911"),
        encode_body,
        _struct(TopicList),
    ),
    Row(
        (R.GET_SYSTEM_TOPIC_LIST_FROM_BROKER,),
        "answer",
        derived.SYSTEM_TOPIC_LIST_FROM_BROKER,
        TopicList(["SCHEDULE_TOPIC_XXXX", "TBW102"]),
        lambda body: admin.system_topic_list(set(body.topic_list)),
        _struct(TopicList),
    ),
    Row(
        (R.CONSUME_MESSAGE_DIRECTLY,),
        "answer (the client's, relayed)",
        derived.CONSUME_DIRECTLY_RESULT,
        ConsumeMessageDirectlyResult(consume_result="CR_SUCCESS", spent_time_mills=12),
        encode_directly_result,
        _struct(ConsumeMessageDirectlyResult),
    ),
    Row(
        (R.CONSUME_MESSAGE_DIRECTLY,),
        "answer (a listener that threw)",
        derived.CONSUME_DIRECTLY_THREW,
        ConsumeMessageDirectlyResult(
            order=True, consume_result="CR_THROW_EXCEPTION", remark="boom", spent_time_mills=3
        ),
        encode_directly_result,
        _struct(ConsumeMessageDirectlyResult),
    ),
    Row(
        (
            R.CONTROLLER_ALTER_SYNC_STATE_SET,
            R.CONTROLLER_GET_REPLICA_INFO,
            R.NOTIFY_BROKER_ROLE_CHANGED,
        ),
        "request / answer",
        derived.SYNC_STATE_SET,
        SYNC,
        encode_body,
        _struct(SyncStateSet),
    ),
    Row(
        (R.CONTROLLER_ELECT_MASTER,),
        "answer",
        derived.ELECT_MASTER,
        ElectMasterResponseBody(
            broker_member_group=BrokerMemberGroup(
                cluster="DefaultCluster",
                broker_name="broker-a",
                broker_addrs={1: "127.0.0.1:30911", 2: "127.0.0.1:30921"},
            ),
            sync_state_set=[1, 2],
        ),
        encode_body,
        _struct(ElectMasterResponseBody),
        exact=False,
    ),
    Row(
        (R.CONTROLLER_GET_SYNC_STATE_DATA,),
        "request",
        derived.BROKER_NAMES,
        ["broker-a"],
        encode_body,
        decode_broker_names,
    ),
    Row(
        (R.CONTROLLER_GET_SYNC_STATE_DATA,),
        "answer",
        derived.REPLICAS_INFO,
        BrokerReplicasInfo(
            {
                "broker-a": ReplicasInfo(
                    master_broker_id=1,
                    master_address="127.0.0.1:30911",
                    master_epoch=2,
                    sync_state_set_epoch=3,
                    in_sync_replicas=[
                        ReplicaIdentity(
                            broker_name="broker-a",
                            broker_id=1,
                            broker_address="127.0.0.1:30911",
                            alive=True,
                        )
                    ],
                )
            }
        ),
        encode_body,
        _struct(BrokerReplicasInfo),
    ),
    Row(
        (R.GET_BROKER_EPOCH_CACHE,),
        "answer",
        derived.EPOCH_CACHE,
        EpochEntryCache(
            cluster_name="DefaultCluster",
            broker_name="broker-a",
            broker_id=1,
            epoch_list=[EpochEntry(epoch=1, start_offset=0, end_offset=1024)],
            max_offset=1024,
        ),
        encode_body,
        _struct(EpochEntryCache),
    ),
]

USER = acl2.User("alice", "secret1")
USER_STATE = acl2.apply(acl2.AuthState(), acl2.UserPut(USER))
ACL_STATE = acl2.apply(
    USER_STATE,
    acl2.create_acl(
        USER_STATE,
        "User:alice",
        [acl2.PolicyEntry.of("Topic:T", ["Pub", "Sub"], "Allow", ["127.0.0.1"])],
    ),
)


def _auth_answer(code: int, fields: dict[str, str]) -> Callable[[Any], bytes]:
    """ferrymq's answer to an ACL 2.0 read (`security/acl2admin.py`) in ACL_STATE."""
    return lambda _: decide_admin(ACL_STATE, code, fields, b"").body


ROWS += [
    Row(
        (R.BATCH_ACK_MESSAGE,),
        "request",
        derived.BATCH_ACK,
        BatchAckMessageRequestBody(
            [BatchAck(c="G", t="T", r="0", so=10, q=0, rq=0, pt=1700000000000, it=30000, b="BQ==")],
            broker_name="broker-a",
        ),
        encode_body,
        _struct(BatchAckMessageRequestBody),
    ),
    Row(
        (R.AUTH_CREATE_USER, R.AUTH_UPDATE_USER),
        "request",
        derived.USER_INFO,
        USER,
        None,
        lambda data: acl2.user_from_info(fastjson.loads(data)),
    ),
    Row(
        (R.AUTH_CREATE_ACL, R.AUTH_UPDATE_ACL),
        "request",
        derived.ACL_INFO,
        ACL_STATE.acls["User:alice"],
        None,
        lambda data: acl2.apply(USER_STATE, acl2.create_acl(USER_STATE, *_one_policy(data))).acls[
            "User:alice"
        ],
    ),
]


def _one_policy(data: bytes) -> tuple[str, list[acl2.PolicyEntry]]:
    subject, policies = acl2.acl_from_info(fastjson.loads(data))
    return subject, policies[0][1]


ACL2_ANSWERS = [
    Row(
        (R.AUTH_GET_USER, R.AUTH_LIST_USER),
        "answer",
        derived.USER_INFO,
        None,
        _auth_answer(R.AUTH_GET_USER, {"username": "alice"}),
        lambda data: None,
        exact=False,
        rocketmq_only=("password",),
    ),
    Row(
        (R.AUTH_GET_ACL, R.AUTH_LIST_ACL),
        "answer",
        derived.ACL_INFO,
        None,
        _auth_answer(R.AUTH_GET_ACL, {"subject": "User:alice"}),
        lambda data: None,
        exact=False,
    ),
]
"""ACL 2.0 answers: UserInfo and AclInfo in FastJSON's order (security/acl2admin.py sorts the
properties). ferrymq never answers the password (RocketMQ does): it is the one field left out."""

NOT_JSON: frozenset[int] = frozenset(
    {
        R.SEND_MESSAGE,
        R.SEND_MESSAGE_V2,
        R.SEND_BATCH_MESSAGE,
        R.CONSUMER_SEND_MSG_BACK,
        R.END_TRANSACTION,
        R.PULL_MESSAGE,
        R.UNREGISTER_CLIENT,
        R.QUERY_CONSUMER_OFFSET,
        R.UPDATE_CONSUMER_OFFSET,
        R.GET_MAX_OFFSET,
        R.GET_MIN_OFFSET,
        R.SEARCH_OFFSET_BY_TIMESTAMP,
        R.GET_EARLIEST_MSG_STORETIME,
        R.QUERY_MESSAGE,
        R.VIEW_MESSAGE_BY_ID,
        R.UPDATE_AND_CREATE_TOPIC,
        R.DELETE_TOPIC_IN_BROKER,
        R.DELETE_SUBSCRIPTIONGROUP,
        R.GET_BROKER_CONFIG,
        R.UPDATE_BROKER_CONFIG,
        R.DELETE_EXPIRED_COMMITLOG,
        R.CLONE_GROUP_OFFSET,
        R.POP_MESSAGE,
        R.ACK_MESSAGE,
        R.CHANGE_MESSAGE_INVISIBLETIME,
        R.NOTIFICATION,
        R.PEEK_MESSAGE,
        R.POLLING_INFO,
        R.POP_ROLLBACK,
        R.AUTH_DELETE_USER,
        R.AUTH_DELETE_ACL,
        R.UNREGISTER_BROKER,
        R.BROKER_HEARTBEAT,
        R.DELETE_TOPIC_IN_NAMESRV,
        R.GET_KV_CONFIG,
        R.PUT_KV_CONFIG,
        R.DELETE_KV_CONFIG,
        R.GET_NAMESRV_CONFIG,
        R.UPDATE_NAMESRV_CONFIG,
        R.WIPE_WRITE_PERM_OF_BROKER,
        R.ADD_WRITE_PERM_OF_BROKER,
        R.CONTROLLER_GET_NEXT_BROKER_ID,
        R.CONTROLLER_APPLY_BROKER_ID,
        R.CONTROLLER_REGISTER_BROKER,
        R.CONTROLLER_GET_METADATA_INFO,
        R.CLEAN_BROKER_DATA,
        R.GET_CONTROLLER_CONFIG,
        R.UPDATE_CONTROLLER_CONFIG,
    }
)
"""Codes whose bodies are headers only, message bytes or properties text."""

CONTROLLER_SERVED: frozenset[int] = frozenset(
    {
        R.CONTROLLER_GET_NEXT_BROKER_ID,
        R.CONTROLLER_APPLY_BROKER_ID,
        R.CONTROLLER_REGISTER_BROKER,
        R.CONTROLLER_ALTER_SYNC_STATE_SET,
        R.CONTROLLER_ELECT_MASTER,
        R.CONTROLLER_GET_REPLICA_INFO,
        R.CONTROLLER_GET_METADATA_INFO,
        R.CONTROLLER_GET_SYNC_STATE_DATA,
        R.CLEAN_BROKER_DATA,
        R.GET_CONTROLLER_CONFIG,
        R.UPDATE_CONTROLLER_CONFIG,
        R.BROKER_HEARTBEAT,
        *auth_admin.HANDLERS,
        # and ferrymq's own 9240-9247 (topics, queue moves, CONTROLLER_GET_AUTH)
    }
)
"""What `ControllerServer.register` routes (controller/server.py), written out: building a
controller takes a Raft node. A broker in controller mode adds NOTIFY_BROKER_ROLE_CHANGED and
GET_BROKER_EPOCH_CACHE (broker.py)."""
FERRYMQ_OWN = 9000
"""Codes from here on are ferrymq's own (wire/codes.py): no RocketMQ body to match."""

NOT_CHECKED: frozenset[int] = frozenset(
    {
        R.GET_CONSUMER_RUNNING_INFO,  # relayed from the client as it is, never re-encoded
    }
)


def _without(found: Any, drop: frozenset[str], unordered: frozenset[str], path: str = "") -> Any:
    """`found` without nulls and the fields at the dotted paths in `drop`, `unordered` sorted."""
    if isinstance(found, dict):
        kept = {}
        items = sorted(found.items()) if path in unordered else found.items()
        for key, value in items:
            where = f"{path}.{key}" if path else key
            if value is not None and where not in drop:
                kept[key] = _without(value, drop, unordered, where)
        return kept
    if isinstance(found, list):
        return [_without(item, drop, unordered, path) for item in found]
    return found


def _shape(data: bytes, drop: tuple[str, ...], unordered: tuple[str, ...] = ()) -> str:
    """The body as compact JSON text, fields in the order written, map keys as strings."""
    kept = _without(fastjson.loads(data), frozenset(drop), frozenset(unordered))
    return json.dumps(kept, separators=(",", ":"))


@pytest.mark.parametrize(
    "row", ROWS, ids=[f"{row.codes[0]}-{row.part.split()[0]}-{i}" for i, row in enumerate(ROWS)]
)
def test_ferrymq_writes_and_reads_rocketmq_bodies(row: Row) -> None:
    if row.encode is not None:
        ours = row.encode(row.value)
        if row.exact:
            assert ours == row.rocketmq
        assert _shape(ours, row.ferry_only, row.unordered) == _shape(
            row.rocketmq, row.rocketmq_only, row.unordered
        )
    assert row.decode(row.rocketmq) == row.value


@pytest.mark.parametrize("row", ACL2_ANSWERS, ids=[str(row.codes[0]) for row in ACL2_ANSWERS])
def test_acl2_answers_are_written_in_fastjson_order(row: Row) -> None:
    assert row.encode is not None
    assert _shape(row.encode(None), ()) == _shape(row.rocketmq, row.rocketmq_only)


def test_acl2_answers_hold_rocketmq_fields_but_the_password() -> None:
    for row in ACL2_ANSWERS:
        assert row.encode is not None
        ours = json.loads(_shape(row.encode(None), ()))
        assert ours == json.loads(_shape(row.rocketmq, row.rocketmq_only))


def test_a_batch_ack_bit_set_names_rocketmq_offsets() -> None:
    body = decode_body(derived.BATCH_ACK, BatchAckMessageRequestBody)
    assert body.acks[0].offsets == [10, 12]


def test_every_served_code_is_classified() -> None:
    checked = {code for row in ROWS + ACL2_ANSWERS for code in row.codes}
    namesrv = NameServer(NamesrvConfig()).router.codes
    controller_mode = {R.NOTIFY_BROKER_ROLE_CHANGED, R.GET_BROKER_EPOCH_CACHE}
    served = {*BROKER_HANDLERS, *auth_admin.HANDLERS, *namesrv, *CONTROLLER_SERVED}
    served |= controller_mode
    unclassified = {
        code for code in served - checked - NOT_JSON - NOT_CHECKED if code < FERRYMQ_OWN
    }
    assert not unclassified, sorted(RequestCode(code).name for code in unclassified)


def test_a_rocketmq_route_with_unquoted_broker_ids_decodes() -> None:
    """A RocketMQ NameServer writes `{0:"addr"}`; standard JSON parsers refuse it."""
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(recorded.TOPIC_ROUTE_52)
    route = decode_body(recorded.TOPIC_ROUTE_52, TopicRouteData)
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}
