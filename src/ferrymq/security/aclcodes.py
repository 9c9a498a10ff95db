"""Every request code's kind for ACL 1.0, and the topics and groups a request needs perms on.

One table (`KINDS`) classifies every `RequestCode`: PRODUCER and CONSUMER requests need a signed
account with PUB / SUB on the topics and groups they name; CLIENT requests (route lookups,
heartbeats) are made by producers and consumers alike and need a signed account (and SUB on the
consumer groups they name, as RocketMQ checks them; route lookups name no resource, since the
C++ producer also looks up `TBW102`);
ADMIN requests need an `admin: true` account; INTERNAL requests (broker registration, controller,
Raft, HA metadata, server-to-client calls) are the cluster's own and need its admin account too.
A code missing from the table is treated as ADMIN (fail closed), and a test fails on any code a
server routes that the table does not name: a new request code is classified where it is added.

Resources follow RocketMQ's `PlainAccessResource.parse`: the topic of a send needs PUB (SUB when
it is a retry topic), a pull needs SUB on the topic and on the group (named by its retry topic
`%RETRY%group`), a heartbeat needs SUB on each consumer group and subscribed topic. ferrymq also
checks the topic and group named by its other consumer and producer requests (offsets, pop, the
Spark sink's codes; a BATCH_ACK_MESSAGE's topics and groups from its body), which RocketMQ
leaves to the signature alone.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import msgspec

from ferrymq.errors import ProtocolError
from ferrymq.security.acl import RETRY_PREFIX, Perm
from ferrymq.wire.bodies import HeartbeatData, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.pop import BatchAckMessageRequestBody

__all__ = ["KINDS", "USER_CODES", "Kind", "kind_of", "resource_key", "resources"]


class Kind(enum.StrEnum):
    """Who makes a request, for ACL."""

    PRODUCER = "producer"
    CONSUMER = "consumer"
    CLIENT = "client"
    ADMIN = "admin"
    INTERNAL = "internal"


R = RequestCode

_PRODUCER: Final = {
    R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE, R.END_TRANSACTION,
    R.SEND_REPLY_MESSAGE, R.SEND_REPLY_MESSAGE_V2,
    R.SINK_PREPARE, R.SINK_DECIDE, R.SINK_COMMIT, R.SINK_FENCE, R.SINK_QUERY_FENCE,
}  # fmt: skip
_CONSUMER: Final = {
    R.PULL_MESSAGE, R.LITE_PULL_MESSAGE, R.QUERY_MESSAGE, R.VIEW_MESSAGE_BY_ID,
    R.QUERY_CONSUMER_OFFSET, R.UPDATE_CONSUMER_OFFSET, R.SEARCH_OFFSET_BY_TIMESTAMP,
    R.GET_MAX_OFFSET, R.GET_MIN_OFFSET, R.GET_EARLIEST_MSG_STORETIME, R.CONSUMER_SEND_MSG_BACK,
    R.GET_CONSUMER_LIST_BY_GROUP, R.LOCK_BATCH_MQ, R.UNLOCK_BATCH_MQ, R.QUERY_ASSIGNMENT,
    R.SET_MESSAGE_REQUEST_MODE, R.POP_MESSAGE, R.ACK_MESSAGE, R.BATCH_ACK_MESSAGE,
    R.PEEK_MESSAGE, R.CHANGE_MESSAGE_INVISIBLETIME, R.NOTIFICATION, R.POLLING_INFO,
    R.GET_FENCE, R.GET_GROUP_MEMBERS,
}  # fmt: skip
_CLIENT: Final = {
    R.HEART_BEAT, R.UNREGISTER_CLIENT, R.GET_ROUTEINFO_BY_TOPIC, R.CHECK_CLIENT_CONFIG,
    R.GET_CLIENT_CONFIG, R.GET_KV_CONFIG,
}  # fmt: skip
_INTERNAL: Final = {
    R.REGISTER_BROKER, R.UNREGISTER_BROKER, R.BROKER_HEARTBEAT, R.QUERY_DATA_VERSION,
    R.REGISTER_TOPIC_IN_NAMESRV, R.GET_BROKER_MEMBER_GROUP, R.ADD_BROKER, R.REMOVE_BROKER,
    R.NOTIFY_MIN_BROKER_ID_CHANGE, R.EXCHANGE_BROKER_HA_INFO, R.RESET_MASTER_FLUSH_OFFSET,
    R.CONTROLLER_ALTER_SYNC_STATE_SET, R.CONTROLLER_ELECT_MASTER, R.CONTROLLER_REGISTER_BROKER,
    R.CONTROLLER_GET_REPLICA_INFO, R.CONTROLLER_GET_METADATA_INFO,
    R.CONTROLLER_GET_SYNC_STATE_DATA, R.GET_BROKER_EPOCH_CACHE, R.NOTIFY_BROKER_ROLE_CHANGED,
    R.CONTROLLER_GET_NEXT_BROKER_ID, R.CONTROLLER_APPLY_BROKER_ID, R.RAFT_MESSAGE,
    R.CONTROLLER_GET_GROUP_TOPICS, R.CONTROLLER_GET_TOPICS, R.NOTIFY_TOPICS_CHANGED,
    R.SEAL_QUEUE, R.TEST_CLOCK, R.CONTROLLER_GET_AUTH,
    # served by clients, never by servers (server -> client calls)
    R.CHECK_TRANSACTION_STATE, R.NOTIFY_CONSUMER_IDS_CHANGED, R.RESET_CONSUMER_CLIENT_OFFSET,
    R.GET_CONSUMER_STATUS_FROM_CLIENT, R.GET_CONSUMER_RUNNING_INFO, R.CONSUME_MESSAGE_DIRECTLY,
    R.PUSH_REPLY_MESSAGE_TO_CLIENT,
}  # fmt: skip

_ADMIN: Final = {
    R.QUERY_BROKER_OFFSET, R.UPDATE_AND_CREATE_TOPIC, R.UPDATE_AND_CREATE_TOPIC_LIST,
    R.GET_ALL_TOPIC_CONFIG, R.GET_TOPIC_CONFIG_LIST, R.GET_TOPIC_NAME_LIST,
    R.UPDATE_BROKER_CONFIG, R.GET_BROKER_CONFIG, R.TRIGGER_DELETE_FILES,
    R.GET_BROKER_RUNTIME_INFO, R.GET_ALL_CONSUMER_OFFSET, R.GET_ALL_DELAY_OFFSET, R.PUT_KV_CONFIG,
    R.DELETE_KV_CONFIG, R.GET_BROKER_CLUSTER_INFO, R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    R.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, R.GET_TOPIC_STATS_INFO, R.GET_CONSUMER_CONNECTION_LIST,
    R.GET_PRODUCER_CONNECTION_LIST, R.WIPE_WRITE_PERM_OF_BROKER,
    R.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, R.DELETE_SUBSCRIPTIONGROUP, R.GET_CONSUME_STATS,
    R.SUSPEND_CONSUMER, R.RESUME_CONSUMER, R.RESET_CONSUMER_OFFSET_IN_CONSUMER,
    R.RESET_CONSUMER_OFFSET_IN_BROKER, R.ADJUST_CONSUMER_THREAD_POOL, R.WHO_CONSUME_THE_MESSAGE,
    R.DELETE_TOPIC_IN_BROKER, R.DELETE_TOPIC_IN_NAMESRV, R.GET_KVLIST_BY_NAMESPACE,
    R.INVOKE_BROKER_TO_RESET_OFFSET, R.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
    R.GET_TOPICS_BY_CLUSTER, R.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST,
    R.QUERY_TOPIC_CONSUME_BY_WHO, R.QUERY_CONSUME_TIME_SPAN, R.GET_SYSTEM_TOPIC_LIST_FROM_NS,
    R.GET_SYSTEM_TOPIC_LIST_FROM_BROKER, R.CLEAN_EXPIRED_CONSUMEQUEUE, R.QUERY_CORRECTION_OFFSET,
    R.GET_UNIT_TOPIC_LIST, R.CLONE_GROUP_OFFSET, R.VIEW_BROKER_STATS_DATA, R.CLEAN_UNUSED_TOPIC,
    R.GET_BROKER_CONSUME_STATS, R.UPDATE_NAMESRV_CONFIG, R.GET_NAMESRV_CONFIG,
    R.QUERY_CONSUME_QUEUE, R.RESUME_CHECK_HALF_MESSAGE, R.ADD_WRITE_PERM_OF_BROKER,
    R.GET_ALL_PRODUCER_INFO, R.DELETE_EXPIRED_COMMITLOG, R.QUERY_TOPICS_BY_CONSUMER,
    R.QUERY_SUBSCRIPTION_BY_CONSUMER, R.GET_TOPIC_CONFIG, R.GET_SUBSCRIPTIONGROUP_CONFIG,
    R.GET_BROKER_HA_STATUS, R.UPDATE_CONTROLLER_CONFIG, R.GET_CONTROLLER_CONFIG,
    R.CLEAN_BROKER_DATA, R.SWITCH_BROKER_ROLE, R.CONTROLLER_UPDATE_TOPIC,
    R.CONTROLLER_DELETE_TOPIC, R.CONTROLLER_REASSIGN_QUEUES,
    R.AUTH_CREATE_USER, R.AUTH_UPDATE_USER, R.AUTH_DELETE_USER, R.AUTH_GET_USER,
    R.AUTH_LIST_USER, R.AUTH_CREATE_ACL, R.AUTH_UPDATE_ACL, R.AUTH_DELETE_ACL, R.AUTH_GET_ACL,
    R.AUTH_LIST_ACL,
    R.POP_ROLLBACK,  # RocketMQ 5.3's mqadmin exportPopRecord (AdminBrokerProcessor)
}  # fmt: skip

KINDS: Final[Mapping[int, Kind]] = {
    **{int(code): Kind.ADMIN for code in _ADMIN},
    **{int(code): Kind.INTERNAL for code in _INTERNAL},
    **{int(code): Kind.CLIENT for code in _CLIENT},
    **{int(code): Kind.CONSUMER for code in _CONSUMER},
    **{int(code): Kind.PRODUCER for code in _PRODUCER},
}
"""Request code -> kind: each code named once above (a new code must be added to one set)."""
USER_CODES: Final = frozenset(
    code for code, kind in KINDS.items() if kind in (Kind.PRODUCER, Kind.CONSUMER, Kind.CLIENT)
)
"""The codes an account without `admin: true` may send (every other code needs admin)."""

_TOPIC_IN_B: Final = frozenset({RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE})
"""SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE name the topic `b`."""
_GROUP_FIELDS: Final = ("consumerGroup", "group")
_BATCH_ACK_BODY: Final = msgspec.json.Decoder(BatchAckMessageRequestBody)


def kind_of(code: int) -> Kind:
    """The request's kind; a code no table names is ADMIN."""
    return KINDS.get(code, Kind.ADMIN)


def _retry(group: str) -> str:
    return group if group.startswith(RETRY_PREFIX) else RETRY_PREFIX + group


def _plan(code: int) -> tuple[str | None, bool, bool]:
    """Where a request's resources are: its topic field (None: none), PUB?, its group?.

    The topic field names a producer's topic (PUB; SUB for a retry topic) or a consumer's (SUB);
    the group (SUB on its retry topic) is checked for consumer and client requests.
    """
    kind = kind_of(code)
    field = "b" if code in _TOPIC_IN_B else "topic"
    topic = field if kind in (Kind.PRODUCER, Kind.CONSUMER) else None
    return topic, kind is Kind.PRODUCER, kind in (Kind.CONSUMER, Kind.CLIENT)


_PLANS: Final = {
    code: _plan(code)
    for code in KINDS
    if code not in (RequestCode.BATCH_ACK_MESSAGE, RequestCode.HEART_BEAT)
}
"""Request code -> `_plan`, worked out once: a request's resources are then two field reads."""


def resources(code: int, fields: Mapping[str, str], body: bytes) -> list[tuple[str, Perm]]:
    """The topics and groups (as retry topics) a request needs perms on, with the perm.

    Raises:
        ProtocolError: a HEART_BEAT or BATCH_ACK_MESSAGE body that does not decode (RocketMQ
            answers an AclException).
    """
    plan = _PLANS.get(code)
    if plan is None:
        return _body_resources(code, body)
    topic_field, producer, group_checked = plan
    needed: list[tuple[str, Perm]] = []
    if topic_field is not None:
        topic = fields.get(topic_field)
        if topic:
            if producer and not topic.startswith(RETRY_PREFIX):
                needed.append((topic, Perm.PUB))
            else:
                needed.append((topic, Perm.SUB))
    if group_checked:
        group = next((fields[f] for f in _GROUP_FIELDS if fields.get(f)), None)
        if group:
            needed.append((_retry(group), Perm.SUB))
    return needed


def resource_key(code: int, fields: Mapping[str, str]) -> tuple[object, ...] | None:
    """What `resources(code, fields, body)` depends on, or None when it reads the body.

    Two requests with one key need the same perms (`acl.decide` remembers the answer by it).
    """
    plan = _PLANS.get(code)
    if plan is None:
        return None
    topic_field, _, group_checked = plan
    topic = fields.get(topic_field) if topic_field is not None else None
    if group_checked:  # resources' group: the first of _GROUP_FIELDS that is not empty
        return code, topic, fields.get("consumerGroup") or fields.get("group")
    return code, topic


def _body_resources(code: int, body: bytes) -> list[tuple[str, Perm]]:
    """BATCH_ACK_MESSAGE's and HEART_BEAT's resources, in their bodies; other codes: none.

    Only codes without a `_PLANS` entry come here: those two, and codes no table names (ADMIN).
    """
    needed: list[tuple[str, Perm]] = []
    if code == RequestCode.BATCH_ACK_MESSAGE:  # its topics and groups are in the body only
        try:
            acks = _BATCH_ACK_BODY.decode(body).acks
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"bad BatchAckMessageRequestBody: {exc}") from None
        for ack in acks:
            needed.append((ack.t, Perm.SUB))
            needed.append((_retry(ack.c), Perm.SUB))
    elif code == RequestCode.HEART_BEAT:
        data = decode_body(body, HeartbeatData)
        for consumer in data.consumer_data_set:
            needed.append((_retry(consumer.group_name), Perm.SUB))
            needed.extend((s.topic, Perm.SUB) for s in consumer.subscription_data_set)
    return needed
