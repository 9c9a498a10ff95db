"""Typed headers of the requests a broker answers (RocketMQ `*RequestHeader` classes).

Field names on the wire are RocketMQ's; SEND_MESSAGE_V2 uses single-letter aliases
(`SendMessageRequestHeaderV2`), converted with `to_v1` / `from_v1`.
"""

from __future__ import annotations

import struct
from typing import Final

import msgspec

from ferrymq.wire.frame import ROCKETMQ_VERSION
from ferrymq.wire.headers import I32, I64, CommandHeader

__all__ = [
    "CheckTransactionStateRequestHeader",
    "ConsumeMessageDirectlyResultRequestHeader",
    "ConsumerSendMsgBackRequestHeader",
    "CreateTopicRequestHeader",
    "DeleteSubscriptionGroupRequestHeader",
    "DeleteTopicRequestHeader",
    "EndTransactionRequestHeader",
    "GetConsumeStatsRequestHeader",
    "GetConsumerConnectionListRequestHeader",
    "GetConsumerListByGroupRequestHeader",
    "GetConsumerRunningInfoRequestHeader",
    "GetEarliestMsgStoretimeRequestHeader",
    "GetEarliestMsgStoretimeResponseHeader",
    "GetFenceRequestHeader",
    "GetGroupMembersRequestHeader",
    "GetMaxOffsetRequestHeader",
    "GetMaxOffsetResponseHeader",
    "GetMinOffsetRequestHeader",
    "GetMinOffsetResponseHeader",
    "GetProducerConnectionListRequestHeader",
    "GetSubscriptionGroupConfigRequestHeader",
    "GetTopicConfigRequestHeader",
    "GetTopicStatsInfoRequestHeader",
    "NotifyConsumerIdsChangedRequestHeader",
    "PullMessageRequestHeader",
    "PullMessageResponseHeader",
    "QueryConsumerOffsetRequestHeader",
    "QueryConsumerOffsetResponseHeader",
    "QueryMessageRequestHeader",
    "QueryMessageResponseHeader",
    "QueryTopicConsumeByWhoRequestHeader",
    "ResetOffsetRequestHeader",
    "SearchOffsetRequestHeader",
    "SearchOffsetResponseHeader",
    "SendMessageRequestHeader",
    "SendMessageRequestHeaderV2",
    "SendMessageResponseHeader",
    "SwitchBrokerRoleRequestHeader",
    "SwitchBrokerRoleResponseHeader",
    "UnregisterClientRequestHeader",
    "UpdateConsumerOffsetRequestHeader",
    "ViewBrokerStatsDataRequestHeader",
    "ViewMessageRequestHeader",
    "encode_send_ok",
    "format_attribute_changes",
    "parse_attribute_changes",
]


class SendMessageRequestHeader(CommandHeader):
    """SEND_MESSAGE (10) and SEND_BATCH_MESSAGE (320)."""

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: I32
    queue_id: I32
    sys_flag: I32
    born_timestamp: I64
    flag: I32
    properties: str | None = None
    reconsume_times: I32 | None = None
    unit_mode: bool | None = None
    batch: bool | None = None
    max_reconsume_times: I32 | None = None


class SendMessageRequestHeaderV2(CommandHeader):
    """SEND_MESSAGE_V2 (310): the same fields under one-letter names."""

    producer_group: str = msgspec.field(name="a")
    topic: str = msgspec.field(name="b")
    default_topic: str = msgspec.field(name="c")
    default_topic_queue_nums: I32 = msgspec.field(name="d")
    queue_id: I32 = msgspec.field(name="e")
    sys_flag: I32 = msgspec.field(name="f")
    born_timestamp: I64 = msgspec.field(name="g")
    flag: I32 = msgspec.field(name="h")
    properties: str | None = msgspec.field(default=None, name="i")
    reconsume_times: I32 | None = msgspec.field(default=None, name="j")
    unit_mode: bool | None = msgspec.field(default=None, name="k")
    max_reconsume_times: I32 | None = msgspec.field(default=None, name="l")
    batch: bool | None = msgspec.field(default=None, name="m")
    broker_name: str | None = msgspec.field(default=None, name="n")

    def to_v1(self) -> SendMessageRequestHeader:
        """The same request with long field names."""
        return SendMessageRequestHeader(
            producer_group=self.producer_group,
            topic=self.topic,
            default_topic=self.default_topic,
            default_topic_queue_nums=self.default_topic_queue_nums,
            queue_id=self.queue_id,
            sys_flag=self.sys_flag,
            born_timestamp=self.born_timestamp,
            flag=self.flag,
            properties=self.properties,
            reconsume_times=self.reconsume_times,
            unit_mode=self.unit_mode,
            batch=self.batch,
            max_reconsume_times=self.max_reconsume_times,
        )

    @classmethod
    def from_v1(cls, header: SendMessageRequestHeader) -> SendMessageRequestHeaderV2:
        """The V2 form of a V1 header."""
        return cls(
            producer_group=header.producer_group,
            topic=header.topic,
            default_topic=header.default_topic,
            default_topic_queue_nums=header.default_topic_queue_nums,
            queue_id=header.queue_id,
            sys_flag=header.sys_flag,
            born_timestamp=header.born_timestamp,
            flag=header.flag,
            properties=header.properties,
            reconsume_times=header.reconsume_times,
            unit_mode=header.unit_mode,
            max_reconsume_times=header.max_reconsume_times,
            batch=header.batch,
        )


class SendMessageResponseHeader(CommandHeader):
    """Answer to a send: where the message went."""

    msg_id: str
    queue_id: I32
    queue_offset: I64
    transaction_id: str | None = None
    batch_uniq_id: str | None = None


_SEND_OK_HEADER: Final = (
    '{"code":0,"extFields":{"msgId":"%s","queueId":"%d","queueOffset":"%d"},"flag":1,'
    '"language":"PYTHON","opaque":%d,"serializeTypeCurrentRPC":"JSON","version":%d}'
)
_FRAME_PREFIX: Final = struct.Struct(">iI")


def encode_send_ok(opaque: int, msg_id: str, queue_id: int, queue_offset: int) -> bytes:
    """The whole frame of a SUCCESS answer to a send, JSON-serialized.

    The bytes `encode_frame` gives for `request.make_response(SUCCESS, ext_fields={"msgId",
    "queueId", "queueOffset"})`, written without a `RemotingCommand` because a broker answers
    every send (a unit test holds the two equal). `msg_id` is an offset message id: hex digits,
    nothing JSON would escape.
    """
    header = (_SEND_OK_HEADER % (msg_id, queue_id, queue_offset, opaque, ROCKETMQ_VERSION)).encode()
    return _FRAME_PREFIX.pack(4 + len(header), len(header)) + header


class PullMessageRequestHeader(CommandHeader):
    """PULL_MESSAGE (11)."""

    consumer_group: str
    topic: str
    queue_id: I32
    queue_offset: I64
    max_msg_nums: I32
    sys_flag: I32
    commit_offset: I64
    suspend_timeout_millis: I64
    subscription: str | None = None
    sub_version: I64 = 0
    expression_type: str | None = None
    max_msg_bytes: I32 | None = None
    min_msg_bytes: I32 | None = None
    """ferrymq's own (RocketMQ clients never send it): a suspending pull is held until this many
    bytes can be returned or `suspendTimeoutMillis` passes (Kafka's fetch min bytes, seed 003)."""
    ferry_follows_map: bool | None = None
    """ferrymq's own: the client reads moved queues' segments in turn (`wire.queuemap`), so
    the end of a closed segment is answered at once (`ferrySealed`), not long-polled."""


class PullMessageResponseHeader(CommandHeader):
    """Answer to PULL_MESSAGE: the queue's bounds and where to continue."""

    suggest_which_broker_id: I64
    next_begin_offset: I64
    min_offset: I64
    max_offset: I64
    offset_delta: I64 | None = None
    topic_sys_flag: I32 | None = None
    group_sys_flag: I32 | None = None
    forbidden_type: I32 | None = None


class QueryConsumerOffsetRequestHeader(CommandHeader):
    """QUERY_CONSUMER_OFFSET (14)."""

    consumer_group: str
    topic: str
    queue_id: I32
    set_zero_if_not_found: bool | None = None


class QueryConsumerOffsetResponseHeader(CommandHeader):
    """The committed queue offset of a group."""

    offset: I64


class UpdateConsumerOffsetRequestHeader(CommandHeader):
    """UPDATE_CONSUMER_OFFSET (15)."""

    consumer_group: str
    topic: str
    queue_id: I32
    commit_offset: I64


class GetMaxOffsetRequestHeader(CommandHeader):
    """GET_MAX_OFFSET (30)."""

    topic: str
    queue_id: I32


class GetMaxOffsetResponseHeader(CommandHeader):
    """The next queue offset of a queue."""

    offset: I64


class GetMinOffsetRequestHeader(CommandHeader):
    """GET_MIN_OFFSET (31)."""

    topic: str
    queue_id: I32


class GetMinOffsetResponseHeader(CommandHeader):
    """The first readable queue offset of a queue."""

    offset: I64


class SearchOffsetRequestHeader(CommandHeader):
    """SEARCH_OFFSET_BY_TIMESTAMP (29)."""

    topic: str
    queue_id: I32
    timestamp: I64


class SearchOffsetResponseHeader(CommandHeader):
    """The first queue offset stored at or after the timestamp."""

    offset: I64


class GetEarliestMsgStoretimeRequestHeader(CommandHeader):
    """GET_EARLIEST_MSG_STORETIME (32)."""

    topic: str
    queue_id: I32


class GetEarliestMsgStoretimeResponseHeader(CommandHeader):
    """Store time of the oldest readable message."""

    timestamp: I64


class ViewMessageRequestHeader(CommandHeader):
    """VIEW_MESSAGE_BY_ID (33): the log offset decoded from an offset message id."""

    offset: I64


class QueryMessageRequestHeader(CommandHeader):
    """QUERY_MESSAGE (12): messages by key within a time range."""

    topic: str
    key: str
    max_num: I32
    begin_timestamp: I64
    end_timestamp: I64


class QueryMessageResponseHeader(CommandHeader):
    """How far the key index reaches."""

    index_last_update_timestamp: I64
    index_last_update_phyoffset: I64


class ConsumerSendMsgBackRequestHeader(CommandHeader):
    """CONSUMER_SEND_MSG_BACK (36): retry a consumed message later."""

    offset: I64
    group: str
    delay_level: I32
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: I32 | None = None


class GetConsumerListByGroupRequestHeader(CommandHeader):
    """GET_CONSUMER_LIST_BY_GROUP (38)."""

    consumer_group: str


class NotifyConsumerIdsChangedRequestHeader(CommandHeader):
    """NOTIFY_CONSUMER_IDS_CHANGED (40), pushed by the broker."""

    consumer_group: str


class UnregisterClientRequestHeader(CommandHeader):
    """UNREGISTER_CLIENT (35)."""

    client_i_d: str = msgspec.field(name="clientID")
    producer_group: str | None = None
    consumer_group: str | None = None


class CreateTopicRequestHeader(CommandHeader):
    """UPDATE_AND_CREATE_TOPIC (17)."""

    topic: str
    default_topic: str = "TBW102"
    read_queue_nums: I32 = 8
    write_queue_nums: I32 = 8
    perm: I32 = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: I32 | None = None
    order: bool = False
    attributes: str | None = None


def parse_attribute_changes(text: str | None) -> dict[str, str]:
    """RocketMQ 5's topic attribute changes (`AttributeParser.parseToMap`).

    `+key=value` adds or sets, `-key` deletes, comma-separated; the keys keep their sign.

    Raises:
        ValueError: an item is malformed or a key comes twice.
    """
    if not text:
        return {}
    changes: dict[str, str] = {}
    for item in text.split(","):
        key, equals, value = item.partition("=")
        if key.startswith("+"):
            if len(key) < 2 or not value or "=" in value:
                raise ValueError(f"attribute {item!r}: an addition is written +key=value")
        elif key.startswith("-"):
            if len(key) < 2 or equals:
                raise ValueError(f"attribute {item!r}: a deletion is written -key")
        else:
            raise ValueError(f"attribute {item!r}: a change starts with + (set) or - (delete)")
        if any(sign in key[1:] for sign in "+-"):
            raise ValueError(f"attribute {item!r}: a key holds no + or -")
        if key in changes:
            raise ValueError(f"attribute {key[1:]!r} is given twice")
        changes[key] = value
    return changes


def format_attribute_changes(changes: dict[str, str]) -> str:
    """RocketMQ 5's text of attribute changes (`AttributeParser.parseToString`)."""
    return ",".join(f"{key}={value}" if value else key for key, value in changes.items())


class DeleteTopicRequestHeader(CommandHeader):
    """DELETE_TOPIC_IN_BROKER (215)."""

    topic: str


class SwitchBrokerRoleRequestHeader(CommandHeader):
    """SWITCH_BROKER_ROLE (ferrymq's own): classic mode, the id and role a switchover assigns."""

    broker_id: I64
    broker_role: str
    """SYNC_MASTER or ASYNC_MASTER (with broker id 0), or SLAVE."""
    master_address: str | None = None
    """A slave's new master."""
    master_epoch: I32 | None = None
    """A slave's new master's epoch."""


class SwitchBrokerRoleResponseHeader(CommandHeader):
    """The master epoch the broker now follows or leads."""

    master_epoch: I32


class GetFenceRequestHeader(CommandHeader):
    """GET_FENCE (ferrymq's own): a fenced topic's holder and live start."""

    topic: str


class GetGroupMembersRequestHeader(CommandHeader):
    """GET_GROUP_MEMBERS (ferrymq's own): a consumer group's members with their member data."""

    consumer_group: str


class GetTopicStatsInfoRequestHeader(CommandHeader):
    """GET_TOPIC_STATS_INFO (202)."""

    topic: str


class GetConsumeStatsRequestHeader(CommandHeader):
    """GET_CONSUME_STATS (208)."""

    consumer_group: str
    topic: str | None = None


class GetConsumerConnectionListRequestHeader(CommandHeader):
    """GET_CONSUMER_CONNECTION_LIST (203)."""

    consumer_group: str


class GetProducerConnectionListRequestHeader(CommandHeader):
    """GET_PRODUCER_CONNECTION_LIST (204)."""

    producer_group: str


class QueryTopicConsumeByWhoRequestHeader(CommandHeader):
    """QUERY_TOPIC_CONSUME_BY_WHO (300)."""

    topic: str


class ViewBrokerStatsDataRequestHeader(CommandHeader):
    """VIEW_BROKER_STATS_DATA (315): `statsName` (TOPIC_PUT_NUMS...) and its key."""

    stats_name: str
    stats_key: str


class GetConsumerRunningInfoRequestHeader(CommandHeader):
    """GET_CONSUMER_RUNNING_INFO (307): admin -> broker, then broker -> the client."""

    consumer_group: str
    client_id: str
    jstack_enable: bool = False


class ConsumeMessageDirectlyResultRequestHeader(CommandHeader):
    """CONSUME_MESSAGE_DIRECTLY (309): admin -> broker, then broker -> the client.

    `msg_id` is the offset message id (it names the log offset); the broker sets `broker_name`
    before relaying, as RocketMQ's `AdminBrokerProcessor.consumeMessageDirectly` does.
    """

    consumer_group: str
    client_id: str | None = None
    msg_id: str | None = None
    broker_name: str | None = None
    topic: str | None = None


class GetTopicConfigRequestHeader(CommandHeader):
    """GET_TOPIC_CONFIG (351): one topic's config on this broker."""

    topic: str


class GetSubscriptionGroupConfigRequestHeader(CommandHeader):
    """GET_SUBSCRIPTIONGROUP_CONFIG (352): one subscription group's config on this broker."""

    group: str


class ResetOffsetRequestHeader(CommandHeader):
    """INVOKE_BROKER_TO_RESET_OFFSET (222) and RESET_CONSUMER_CLIENT_OFFSET (220).

    `timestamp` -1: to each queue's end. `is_force` false: a queue is moved back only (an
    offset past the committed one keeps the committed one), as RocketMQ's `Broker2Client`.
    """

    topic: str
    group: str
    timestamp: I64
    is_force: bool = True


class DeleteSubscriptionGroupRequestHeader(CommandHeader):
    """DELETE_SUBSCRIPTIONGROUP (207)."""

    group_name: str
    clean_offset: bool = False


class EndTransactionRequestHeader(CommandHeader):
    """END_TRANSACTION (37): commit or roll back a half message."""

    producer_group: str
    tran_state_table_offset: I64
    commit_log_offset: I64
    commit_or_rollback: I32
    from_transaction_check: bool = False
    msg_id: str | None = None
    transaction_id: str | None = None


class CheckTransactionStateRequestHeader(CommandHeader):
    """CHECK_TRANSACTION_STATE (39), pushed by the broker to a producer of the group."""

    tran_state_table_offset: I64
    commit_log_offset: I64
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None
