"""Typed headers of the requests a NameServer answers (RocketMQ `namesrv` headers)."""

from __future__ import annotations

from ferrymq.wire.headers import I32, I64, CommandHeader

__all__ = [
    "AddWritePermOfBrokerRequestHeader",
    "AddWritePermOfBrokerResponseHeader",
    "BrokerHeartbeatRequestHeader",
    "DeleteTopicFromNamesrvRequestHeader",
    "GetRouteInfoRequestHeader",
    "GetTopicsByClusterRequestHeader",
    "KvConfigRequestHeader",
    "KvConfigResponseHeader",
    "PutKvConfigRequestHeader",
    "RegisterBrokerRequestHeader",
    "RegisterBrokerResponseHeader",
    "UnregisterBrokerRequestHeader",
    "WipeWritePermOfBrokerRequestHeader",
    "WipeWritePermOfBrokerResponseHeader",
]


class GetRouteInfoRequestHeader(CommandHeader):
    """GET_ROUTEINFO_BY_TOPIC (105)."""

    topic: str
    accept_standard_json_only: bool | None = None


class RegisterBrokerRequestHeader(CommandHeader):
    """REGISTER_BROKER (103); the body carries topic configs, maybe zlib-compressed."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    ha_server_addr: str
    broker_id: I64
    heartbeat_timeout_millis: I64 | None = None
    enable_acting_master: bool | None = None
    compressed: bool = False
    body_crc32: I32 = 0


class RegisterBrokerResponseHeader(CommandHeader):
    """What the NameServer tells a registering broker."""

    ha_server_addr: str | None = None
    master_addr: str | None = None


class UnregisterBrokerRequestHeader(CommandHeader):
    """UNREGISTER_BROKER (104)."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: I64


class BrokerHeartbeatRequestHeader(CommandHeader):
    """BROKER_HEARTBEAT (904), to a NameServer or a controller."""

    cluster_name: str
    broker_addr: str
    broker_name: str
    broker_id: I64 | None = None
    epoch: I32 | None = None
    max_offset: I64 | None = None
    confirm_offset: I64 | None = None
    heartbeat_timeout_mills: I64 | None = None
    election_priority: I32 | None = None


class DeleteTopicFromNamesrvRequestHeader(CommandHeader):
    """DELETE_TOPIC_IN_NAMESRV (216)."""

    topic: str
    cluster_name: str | None = None


class GetTopicsByClusterRequestHeader(CommandHeader):
    """GET_TOPICS_BY_CLUSTER (224)."""

    cluster: str


class KvConfigRequestHeader(CommandHeader):
    """GET_KV_CONFIG (101) and DELETE_KV_CONFIG (102)."""

    namespace: str
    key: str


class KvConfigResponseHeader(CommandHeader):
    """GET_KV_CONFIG's answer: the value."""

    value: str


class PutKvConfigRequestHeader(CommandHeader):
    """PUT_KV_CONFIG (100)."""

    namespace: str
    key: str
    value: str


class WipeWritePermOfBrokerRequestHeader(CommandHeader):
    """WIPE_WRITE_PERM_OF_BROKER (205): routes stop offering a group's queues for writing."""

    broker_name: str


class WipeWritePermOfBrokerResponseHeader(CommandHeader):
    """How many topics had queues on the group."""

    wipe_topic_count: I32


class AddWritePermOfBrokerRequestHeader(CommandHeader):
    """ADD_WRITE_PERM_OF_BROKER (327): undo WIPE_WRITE_PERM_OF_BROKER."""

    broker_name: str


class AddWritePermOfBrokerResponseHeader(CommandHeader):
    """How many topics had queues on the group."""

    add_topic_count: I32
