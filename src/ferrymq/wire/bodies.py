"""JSON bodies of remoting commands: routes, cluster info, broker registration, heartbeats, offsets.

Field names are RocketMQ's (FastJSON serializes getters, so `topicConfigTable`, `brokerAddrs`),
written in FastJSON's order: every object's fields sorted by name (`encode_body`). Map keys that
are numbers in Java (broker ids) are written as strings, which every RocketMQ client accepts
(reference/compat-notes.md); null fields are written as null where FastJSON leaves them out
(Java reads both alike). Bodies keyed by `MessageQueue` objects are written as FastJSON writes
them (`encode_topic_stats` and the like). Decoding reads standard JSON and FastJSON's
unquoted number and object map keys (what a RocketMQ NameServer or broker sends), is strict
about types and raises `ProtocolError` naming what is wrong; unknown fields are ignored.
The shapes are checked against RocketMQ's in tests/unit/wire/test_rocketmq_bodies.py.

REGISTER_BROKER bodies may also come zlib-compressed in RocketMQ's own layout
(`RegisterBrokerBody.encode(true)`): see `decode_register_body`.
"""

from __future__ import annotations

import struct
import zlib
from enum import IntFlag
from typing import Any, Final, TypeVar

import msgspec

from ferrymq.errors import ProtocolError
from ferrymq.wire.fastjson import encode_object_map, encode_sorted, loads, mq_key, parse_mq_key

__all__ = [
    "MAX_MEMBER_DATA_BYTES",
    "MAX_SESSION_TIMEOUT_MS",
    "MIN_SESSION_TIMEOUT_MS",
    "BrokerData",
    "BrokerStatsData",
    "BrokerStatsItem",
    "ClientConnection",
    "ClusterInfo",
    "ConsumeMessageDirectlyResult",
    "ConsumeStats",
    "ConsumeStatsEntry",
    "ConsumerConnection",
    "ConsumerData",
    "ConsumerIdList",
    "DataVersion",
    "FenceHolder",
    "FencedRemark",
    "GroupList",
    "GroupMember",
    "GroupMembers",
    "HeartbeatData",
    "KVTable",
    "LockBatchRequestBody",
    "LockBatchResponseBody",
    "MessageQueueBody",
    "Perm",
    "ProducerConnection",
    "ProducerData",
    "ProducerInfo",
    "ProducerTableInfo",
    "QueueData",
    "RegisterBrokerBody",
    "SubscriptionData",
    "TopicConfig",
    "TopicConfigSerializeWrapper",
    "TopicList",
    "TopicOffsetEntry",
    "TopicRouteData",
    "TopicStatsTable",
    "decode_body",
    "decode_consume_stats",
    "decode_register_body",
    "decode_reset_offsets",
    "decode_topic_stats",
    "encode_body",
    "encode_consume_stats",
    "encode_directly_result",
    "encode_register_body",
    "encode_reset_offsets",
    "encode_topic_stats",
]


class Perm(IntFlag):
    """Topic and broker permissions (`PermName`)."""

    INHERIT = 1
    WRITE = 2
    READ = 4
    PRIORITY = 8


class _Body(msgspec.Struct, rename="camel", forbid_unknown_fields=False):
    """Base of JSON bodies: snake_case fields, camelCase on the wire."""


class DataVersion(_Body):
    """Version of a broker's metadata (`DataVersion`); `state_version` fences stale masters."""

    state_version: int = 0
    timestamp: int = 0
    counter: int = 0


class TopicConfig(_Body, kw_only=True):
    """A topic's queues and permissions on one broker group (`TopicConfig`)."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = Perm.READ | Perm.WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = msgspec.field(default_factory=dict)


class TopicConfigSerializeWrapper(_Body):
    """Topic configs with their data version."""

    topic_config_table: dict[str, TopicConfig] = msgspec.field(default_factory=dict)
    data_version: DataVersion = msgspec.field(default_factory=DataVersion)


class RegisterBrokerBody(_Body):
    """Body of REGISTER_BROKER."""

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = msgspec.field(
        default_factory=TopicConfigSerializeWrapper
    )
    filter_server_list: list[str] = msgspec.field(default_factory=list)


class QueueData(_Body, kw_only=True):
    """A topic's queues on one broker group, as routes carry them."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0


class BrokerData(_Body, kw_only=True):
    """The addresses of one broker group: id 0 is the master."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = msgspec.field(default_factory=dict)
    zone_name: str | None = None
    enable_acting_master: bool = False


class TopicRouteData(_Body, kw_only=True):
    """Answer to GET_ROUTEINFO_BY_TOPIC.

    `ferry_queue_map`: a topic with moved queues (issue 20 section 4, `wire.queuemap`), the
    newest map a group registered (JSON text; null otherwise). RocketMQ clients ignore it.
    """

    order_topic_conf: str | None = None
    queue_datas: list[QueueData] = msgspec.field(default_factory=list)
    broker_datas: list[BrokerData] = msgspec.field(default_factory=list)
    filter_server_table: dict[str, list[str]] = msgspec.field(default_factory=dict)
    ferry_queue_map: str | None = None


class ClusterInfo(_Body):
    """Answer to GET_BROKER_CLUSTER_INFO."""

    broker_addr_table: dict[str, BrokerData] = msgspec.field(default_factory=dict)
    cluster_addr_table: dict[str, list[str]] = msgspec.field(default_factory=dict)


class TopicList(_Body):
    """Answer to GET_ALL_TOPIC_LIST_FROM_NAMESERVER and similar."""

    topic_list: list[str] = msgspec.field(default_factory=list)
    broker_addr: str | None = None


class SubscriptionData(_Body, kw_only=True):
    """One topic subscription of a consumer group (`SubscriptionData`)."""

    topic: str
    sub_string: str = "*"
    class_filter_mode: bool = False
    tags_set: list[str] = msgspec.field(default_factory=list)
    code_set: list[int] = msgspec.field(default_factory=list)
    sub_version: int = 0
    expression_type: str = "TAG"


_CONSUME_TYPES: Final = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
_MESSAGE_MODELS: Final = ("BROADCASTING", "CLUSTERING")
_CONSUME_FROM: Final = (
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
)


def _enum_name(value: str | int, names: tuple[str, ...]) -> str:
    """Java writes enums by name; the C++ client writes their ordinal."""
    if isinstance(value, int):
        return names[value] if 0 <= value < len(names) else str(value)
    return value


class ConsumerData(_Body, kw_only=True):
    """A consumer group as one client reports it in HEART_BEAT."""

    group_name: str
    consume_type: str | int = "CONSUME_PASSIVELY"
    message_model: str | int = "CLUSTERING"
    consume_from_where: str | int = "CONSUME_FROM_LAST_OFFSET"
    subscription_data_set: list[SubscriptionData] = msgspec.field(default_factory=list)
    unit_mode: bool = False
    member_data: str | None = None
    """ferrymq's own (Java brokers ignore it): opaque text the group's members read back
    (GET_GROUP_MEMBERS), at most `MAX_MEMBER_DATA_BYTES` of UTF-8."""
    session_timeout_ms: int | None = None
    """ferrymq's own: drop this member after this much silence (1000..120000) instead of the
    broker's `channelExpiredTimeout`."""

    @property
    def consume_type_name(self) -> str:
        """`CONSUME_PASSIVELY` (push) or `CONSUME_ACTIVELY` (pull)."""
        return _enum_name(self.consume_type, _CONSUME_TYPES)

    @property
    def message_model_name(self) -> str:
        """`CLUSTERING` or `BROADCASTING`."""
        return _enum_name(self.message_model, _MESSAGE_MODELS)

    @property
    def consume_from_where_name(self) -> str:
        """Where a group without committed offsets starts."""
        return _enum_name(self.consume_from_where, _CONSUME_FROM)


MAX_MEMBER_DATA_BYTES: Final = 8 * 1024
MIN_SESSION_TIMEOUT_MS: Final = 1_000
MAX_SESSION_TIMEOUT_MS: Final = 120_000


class ProducerData(_Body):
    """A producer group as one client reports it in HEART_BEAT."""

    group_name: str


class HeartbeatData(_Body, kw_only=True):
    """Body of HEART_BEAT: a client's id and the groups it belongs to."""

    client_id: str = msgspec.field(name="clientID")
    producer_data_set: list[ProducerData] = msgspec.field(default_factory=list)
    consumer_data_set: list[ConsumerData] = msgspec.field(default_factory=list)


class ConsumerIdList(_Body):
    """Answer to GET_CONSUMER_LIST_BY_GROUP."""

    consumer_id_list: list[str] = msgspec.field(default_factory=list)


class MessageQueueBody(_Body, kw_only=True):
    """A queue as JSON bodies name it (`MessageQueue`)."""

    topic: str
    broker_name: str
    queue_id: int


class LockBatchRequestBody(_Body, kw_only=True):
    """Body of LOCK_BATCH_MQ and UNLOCK_BATCH_MQ."""

    consumer_group: str
    client_id: str
    only_this_broker: bool = False
    mq_set: list[MessageQueueBody] = msgspec.field(default_factory=list)


class LockBatchResponseBody(_Body):
    """Answer to LOCK_BATCH_MQ: the queues now locked by the caller."""

    lock_o_k_m_q_set: list[MessageQueueBody] = msgspec.field(
        default_factory=list, name="lockOKMQSet"
    )


class TopicOffsetEntry(_Body, kw_only=True):
    """One queue's bounds (RocketMQ `TopicOffset`, with its `MessageQueue` key inlined)."""

    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp: int = 0


class TopicStatsTable(_Body):
    """Answer to GET_TOPIC_STATS_INFO, one entry per queue.

    On the wire `offsetTable` is RocketMQ's map keyed by `MessageQueue` objects, in FastJSON's
    form (`encode_topic_stats`, `decode_topic_stats`); in Python a list with the key inlined.
    """

    offset_table: list[TopicOffsetEntry] = msgspec.field(default_factory=list)
    topic_put_tps: float = 0.0
    """Messages put per second into the topic on this broker (RocketMQ 5's `topicPutTps`)."""


class ConsumeStatsEntry(_Body, kw_only=True):
    """A group's progress in one queue (RocketMQ `OffsetWrapper` with its queue inlined)."""

    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_timestamp: int = 0
    pull_offset: int = 0


class ConsumeStats(_Body):
    """Answer to GET_CONSUME_STATS (`MessageQueue`-keyed on the wire, as `TopicStatsTable`)."""

    offset_table: list[ConsumeStatsEntry] = msgspec.field(default_factory=list)
    consume_tps: float = 0.0


def encode_topic_stats(table: TopicStatsTable) -> bytes:
    """GET_TOPIC_STATS_INFO's body as RocketMQ writes it (`offsetTable` keyed by MessageQueue)."""
    offsets = encode_object_map(
        (
            mq_key(e.topic, e.broker_name, e.queue_id),
            {
                "lastUpdateTimestamp": e.last_update_timestamp,
                "maxOffset": e.max_offset,
                "minOffset": e.min_offset,
            },
        )
        for e in table.offset_table
    )
    tps = msgspec.json.encode(float(table.topic_put_tps))
    return b'{"offsetTable":' + offsets + b',"topicPutTps":' + tps + b"}"


def encode_consume_stats(stats: ConsumeStats) -> bytes:
    """GET_CONSUME_STATS's body as RocketMQ writes it (`offsetTable` keyed by MessageQueue)."""
    offsets = encode_object_map(
        (
            mq_key(e.topic, e.broker_name, e.queue_id),
            {
                "brokerOffset": e.broker_offset,
                "consumerOffset": e.consumer_offset,
                "lastTimestamp": e.last_timestamp,
                "pullOffset": e.pull_offset,
            },
        )
        for e in stats.offset_table
    )
    tps = msgspec.json.encode(float(stats.consume_tps))
    return b'{"consumeTps":' + tps + b',"offsetTable":' + offsets + b"}"


def encode_reset_offsets(offsets: dict[tuple[str, str, int], int]) -> bytes:
    """`ResetOffsetBody` as RocketMQ writes it: (topic, broker name, queue id) -> offset."""
    table = encode_object_map(
        (mq_key(topic, broker_name, queue_id), offset)
        for (topic, broker_name, queue_id), offset in sorted(offsets.items())
    )
    return b'{"offsetTable":' + table + b"}"


def decode_reset_offsets(data: bytes) -> dict[tuple[str, str, int], int]:
    """Parse a `ResetOffsetBody` (RESET_CONSUMER_CLIENT_OFFSET's body, 222's answer).

    Raises:
        ProtocolError: not that shape.
    """
    _, pairs = _mq_table(data, "ResetOffsetBody")
    try:
        return {(q["topic"], q["brokerName"], int(q["queueId"])): int(v) for q, v in pairs}
    except (TypeError, ValueError, KeyError) as exc:
        raise ProtocolError(f"bad ResetOffsetBody body: {exc}") from None


def _mq_table(data: bytes, what: str) -> tuple[dict[str, Any], list[tuple[dict[str, Any], Any]]]:
    """The body's fields and its `offsetTable` as (queue fields, value) pairs.

    Both RocketMQ's map and the list form ferrymq wrote before are read.
    """
    found = loads(data)
    if not isinstance(found, dict):
        raise ProtocolError(f"bad {what} body: not an object")
    table = found.get("offsetTable", {})
    pairs: list[tuple[dict[str, Any], Any]] = []
    if isinstance(table, list):
        pairs = [(entry, entry) for entry in table if isinstance(entry, dict)]
    elif isinstance(table, dict):
        for key, value in table.items():
            topic, broker_name, queue_id = parse_mq_key(key)
            queue = {"topic": topic, "brokerName": broker_name, "queueId": queue_id}
            pairs.append((queue, value))
    else:
        raise ProtocolError(f"bad {what} body: offsetTable is neither a map nor a list")
    return found, pairs


def decode_topic_stats(data: bytes) -> TopicStatsTable:
    """Parse GET_TOPIC_STATS_INFO's body (RocketMQ's FastJSON map, or standard JSON).

    Raises:
        ProtocolError: not that shape.
    """
    found, pairs = _mq_table(data, "TopicStatsTable")
    entries = _entries(pairs, "TopicStatsTable")
    return _convert(
        {"offsetTable": entries, "topicPutTps": found.get("topicPutTps", 0)}, TopicStatsTable
    )


def decode_consume_stats(data: bytes) -> ConsumeStats:
    """Parse GET_CONSUME_STATS's body (RocketMQ's FastJSON map, or standard JSON).

    Raises:
        ProtocolError: not that shape.
    """
    found, pairs = _mq_table(data, "ConsumeStats")
    entries = _entries(pairs, "ConsumeStats")
    return _convert(
        {"offsetTable": entries, "consumeTps": found.get("consumeTps", 0)}, ConsumeStats
    )


def _entries(pairs: list[tuple[dict[str, Any], Any]], what: str) -> list[dict[str, Any]]:
    if not all(isinstance(value, dict) for _, value in pairs):
        raise ProtocolError(f"bad {what} body: an offsetTable value is not an object")
    return [{**value, **queue} for queue, value in pairs]


def _convert(found: dict[str, Any], body_type: type[B]) -> B:
    try:
        return msgspec.convert(found, body_type, strict=False)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"bad {body_type.__name__} body: {exc}") from None


class FencedRemark(_Body, kw_only=True):
    """The remark of a FENCED answer: the topic's current holder and why the record was refused."""

    topic: str
    epoch: int
    writer: str
    url: str
    reason: str


class FenceHolder(_Body, kw_only=True):
    """Answer to GET_FENCE: a fenced topic's holder and where its live tail starts."""

    epoch: int
    writer: str
    url: str
    live_start_offset: int


class GroupMember(_Body, kw_only=True):
    """One member of a consumer group as GET_GROUP_MEMBERS lists it."""

    client_id: str
    member_data: str = ""
    last_heartbeat_ago_ms: int = 0


class GroupMembers(_Body, kw_only=True):
    """Answer to GET_GROUP_MEMBERS.

    `master_since_ms`: how long this broker has been master (or, not a master, serving in its
    role), so a caller tells a fresh, still empty membership table from a real absence.
    """

    members: list[GroupMember] = msgspec.field(default_factory=list)
    master_since_ms: int = 0


class ClientConnection(_Body, kw_only=True):
    """One client connection (RocketMQ `Connection`); fields in FastJSON's order (by name)."""

    client_addr: str
    client_id: str
    language: str = "JAVA"
    version: int = 0


class ConsumerConnection(_Body, kw_only=True):
    """Answer to GET_CONSUMER_CONNECTION_LIST (203): a group's online clients and subscriptions."""

    connection_set: list[ClientConnection] = msgspec.field(default_factory=list)
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    subscription_table: dict[str, SubscriptionData] = msgspec.field(default_factory=dict)


class ProducerConnection(_Body):
    """Answer to GET_PRODUCER_CONNECTION_LIST (204)."""

    connection_set: list[ClientConnection] = msgspec.field(default_factory=list)


class GroupList(_Body):
    """Answer to QUERY_TOPIC_CONSUME_BY_WHO (300): groups consuming a topic."""

    group_list: list[str] = msgspec.field(default_factory=list)


class ProducerInfo(_Body, kw_only=True):
    """One producer client (RocketMQ `ProducerInfo`), fields by name as FastJSON writes them."""

    client_id: str
    language: str = "JAVA"
    last_update_timestamp: int = 0
    remote_i_p: str = msgspec.field(name="remoteIP")
    version: int = 0


class ProducerTableInfo(_Body):
    """Answer to GET_ALL_PRODUCER_INFO (328): producer group -> its clients."""

    data: dict[str, list[ProducerInfo]] = msgspec.field(default_factory=dict)


class BrokerStatsItem(_Body, kw_only=True):
    """One period of a stat (RocketMQ `BrokerStatsItem`): its sum, rate and average per add."""

    avgpt: float = 0.0
    sum: int = 0
    tps: float = 0.0


class BrokerStatsData(_Body, kw_only=True):
    """Answer to VIEW_BROKER_STATS_DATA (315): a stat over the last minute, hour and day."""

    stats_day: BrokerStatsItem = msgspec.field(default_factory=BrokerStatsItem)
    stats_hour: BrokerStatsItem = msgspec.field(default_factory=BrokerStatsItem)
    stats_minute: BrokerStatsItem = msgspec.field(default_factory=BrokerStatsItem)


class ConsumeMessageDirectlyResult(_Body, kw_only=True):
    """A client's answer to CONSUME_MESSAGE_DIRECTLY (309): RocketMQ `ConsumeMessageDirectlyResult`.

    `consume_result` is a `CMResult` name: CR_SUCCESS, CR_LATER, CR_ROLLBACK, CR_COMMIT,
    CR_THROW_EXCEPTION or CR_RETURN_NULL. `spent_time_mills` (RocketMQ's spelling): how long
    the listener ran. FastJSON leaves a null `remark` out.
    """

    auto_commit: bool = True
    consume_result: str | None = None
    order: bool = False
    remark: str | None = None
    spent_time_mills: int = 0


def encode_directly_result(result: ConsumeMessageDirectlyResult) -> bytes:
    """A `ConsumeMessageDirectlyResult` as FastJSON writes it: by name, a null remark left out."""
    found = msgspec.to_builtins(result)
    return encode_sorted({key: value for key, value in found.items() if value is not None})


class KVTable(_Body):
    """A string map (GET_BROKER_RUNTIME_INFO)."""

    table: dict[str, str] = msgspec.field(default_factory=dict)


B = TypeVar("B")


def encode_body(body: msgspec.Struct | dict[str, Any] | list[Any]) -> bytes:
    """JSON bytes of a body, each object's fields sorted by name as FastJSON writes a bean."""
    return encode_sorted(body)


def decode_body(data: bytes, body_type: type[B]) -> B:
    """Parse a JSON body; numbers given as strings (and the reverse) are accepted.

    Standard JSON takes the fast path; a body that is not (FastJSON's `{0:"addr"}` broker-id
    keys, as a RocketMQ NameServer writes routes and cluster info) is read by `fastjson.loads`.

    Raises:
        ProtocolError: the bytes are not JSON of that shape; the message says where.
    """
    name = getattr(body_type, "__name__", "JSON")
    try:
        return msgspec.json.decode(data, type=body_type, strict=False)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"bad {name} body: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        first = exc
    try:
        found = loads(data)
    except ProtocolError:
        raise ProtocolError(f"bad {name} body: {first}") from None
    try:
        return msgspec.convert(found, body_type, strict=False)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"bad {name} body: {exc}") from None


_I32: Final = struct.Struct(">i")
_MAX_INFLATED: Final = 64 * 1024 * 1024


def decode_register_body(data: bytes, compressed: bool) -> RegisterBrokerBody:
    """Parse a REGISTER_BROKER body, plain JSON or RocketMQ's compressed layout.

    The compressed layout is a zlib stream of: int32 length + DataVersion JSON; int32 topic count;
    per topic int32 length + `TopicConfig.encode()` (`name read write perm filterType
    [attributesJson]`, space-separated); int32 length + filter-server JSON list; and, in newer
    brokers, int32 count + that many length-prefixed queue-mapping JSON objects (ignored).
    """
    if not compressed:
        return decode_body(data, RegisterBrokerBody)
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, _MAX_INFLATED)
    except zlib.error as exc:
        raise ProtocolError(f"bad compressed REGISTER_BROKER body: {exc}") from None
    if inflater.unconsumed_tail:
        raise ProtocolError("compressed REGISTER_BROKER body inflates past 64 MiB")
    view = memoryview(raw)
    pos = 0

    def take() -> bytes:
        nonlocal pos
        if pos + 4 > len(view):
            raise ProtocolError("compressed REGISTER_BROKER body is truncated")
        (length,) = _I32.unpack_from(view, pos)
        if length < 0 or pos + 4 + length > len(view):
            raise ProtocolError(f"compressed REGISTER_BROKER body: bad length {length}")
        pos += 4 + length
        return bytes(view[pos - length : pos])

    def count() -> int:
        nonlocal pos
        if pos + 4 > len(view):
            raise ProtocolError("compressed REGISTER_BROKER body is truncated")
        (number,) = _I32.unpack_from(view, pos)
        pos += 4
        if number < 0:
            raise ProtocolError(f"compressed REGISTER_BROKER body: bad count {number}")
        return int(number)

    version = decode_body(take(), DataVersion)
    table: dict[str, TopicConfig] = {}
    for _ in range(count()):
        config = _decode_topic_config_line(take())
        table[config.topic_name] = config
    filters = decode_body(take(), list[str]) if pos < len(view) else []
    return RegisterBrokerBody(TopicConfigSerializeWrapper(table, version), filters)


def _decode_topic_config_line(data: bytes) -> TopicConfig:
    try:
        fields = data.decode().split(" ", 5)
        attributes = decode_body(fields[5].encode(), dict[str, str]) if len(fields) == 6 else {}
        if len(fields) < 5:
            raise ValueError(f"{len(fields)} fields")
        return TopicConfig(
            topic_name=fields[0],
            read_queue_nums=int(fields[1]),
            write_queue_nums=int(fields[2]),
            perm=int(fields[3]),
            topic_filter_type=fields[4],
            attributes=attributes,
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(f"bad topic config {data[:80]!r}: {exc}") from None


def encode_register_body(body: RegisterBrokerBody, compressed: bool) -> bytes:
    """Encode a REGISTER_BROKER body as JSON or in RocketMQ's compressed layout."""
    if not compressed:
        return encode_body(body)
    wrapper = body.topic_config_serialize_wrapper
    parts: list[bytes] = []

    def put(data: bytes) -> None:
        parts.extend((_I32.pack(len(data)), data))

    put(encode_body(wrapper.data_version))
    parts.append(_I32.pack(len(wrapper.topic_config_table)))
    for config in wrapper.topic_config_table.values():
        line = " ".join(
            (
                config.topic_name,
                str(config.read_queue_nums),
                str(config.write_queue_nums),
                str(config.perm),
                config.topic_filter_type,
            )
        )
        if config.attributes:
            line += " " + encode_body(config.attributes).decode()
        put(line.encode())
    put(encode_body(body.filter_server_list))
    parts.append(_I32.pack(0))
    return zlib.compress(b"".join(parts), 9)
