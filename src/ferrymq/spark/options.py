"""The data source's options: parsed and checked once, with errors that name the option.

Names follow Spark's Kafka source (`structured-streaming-kafka-integration`), with `servers` for
`kafka.bootstrap.servers` (NameServer addresses, `;` or `,` separated; `kafka.bootstrap.servers`
and `kafka.group.id` are taken as aliases of `servers` and `groupId`). An option ferrymq does not
know is refused (`OptionError`), so a Kafka job's option that has no meaning here never silently
changes what is read; docs/spark.md has them all:

- exactly one of `subscribe` (comma list), `subscribePattern` (a Python regex over every topic
  the NameServers route) or `assign` (JSON: `{"topic": {"broker-a": [0, 1]}}`, or partition
  numbers `{"topic": [669289472]}`);
- `startingOffsets` / `endingOffsets`: `earliest`, `latest` or JSON naming queues, with -2 =
  earliest and -1 = latest (Kafka's sentinels): `{"topic": {"broker-a": {"0": 23}}}`, or
  partition numbers as keys, `{"topic": {"669289472": 23}}`;
- `startingTimestamp` / `endingTimestamp` (milliseconds since the epoch, every queue) and
  `startingOffsetsByTimestamp` / `endingOffsetsByTimestamp` (JSON naming queues, values in
  milliseconds): a queue starts (ends) at its first message stored at or after the time, as
  Kafka's offsetsForTimes. Precedence as Kafka's: `startingTimestamp`, then
  `startingOffsetsByTimestamp`, then `startingOffsets` (queues the JSON does not name take
  `startingOffsets`). A start with no message at or after the time fails the read unless
  `startingOffsetsByTimestampStrategy` is `latest`; an end with none is the queue's end. The
  ending options are for batch reads only;
- `maxOffsetsPerTrigger`, `minOffsetsPerTrigger` with `maxTriggerDelay` (default 15m: a batch
  with fewer than the minimum waits at most that long), `minPartitions`, `failOnDataLoss`
  (default true), `includeHeaders`;
- `includeFerryColumns`: add the ferrymq columns `tags`, `keys`, `msgId`, `storeTimestamp`,
  `brokerName`, `queueId`;
- `initialOffsets` (streams): JSON in the checkpoint's own shape, `{"topic": {"broker-a": {"0":
  23}}}`: a new query starts those queues there, as a checkpoint would (a queue not in the route
  now keeps its offset and is read once it returns); other queues start at `startingOffsets`.
  What a Connect task without a checkpoint resumes from (connectors/replicator.py);
- `legacyOffsets` (`auto`, the default, or `currentRoute`): how a checkpoint written in the old
  positional layout is read (`plan.LegacyOffsets`);
- writing: `topic` (else the `topic` column), `sinkId` (else the streaming query id),
  `generation` (the writer's fencing generation: a decide below the highest one recorded for the
  sink id is refused, and the query fails with `WriterFencedError`);
- both: `failoverTimeoutMs` (default 30000): how long a read or write retries while a broker
  group has no master (a failover) or a queue of the read is not in the route before the query
  fails with a `RetryableQueryError`, and how long a read waits for a queue that ends below the
  planned offsets (a new master's watermark catching up) before those offsets count as lost
  (`failOnDataLoss`).

A partition number in the JSON is resolved against the topic's route (`resolve_queue`): a stable
number (>= 1024, what the `partition` column shows) names one queue whatever the route; a number
below 1024 is the old position, accepted only while the topic's route has one broker group
(where position i is queue id i).
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ferrymq.errors import FerryError
from ferrymq.model import validate_topic
from ferrymq.security.acl import Credentials, credentials_of
from ferrymq.spark.plan import (
    EARLIEST,
    LATEST,
    MAX_QUEUES_PER_GROUP,
    LegacyOffsets,
    Offsets,
    QueueKey,
    is_stable_partition,
    legacy_topics,
    parse_offsets,
    stable_partition,
)

__all__ = [
    "DEFAULT_FAILOVER_TIMEOUT_S",
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "OptionError",
    "QueueRef",
    "ReadOptions",
    "TimeSpec",
    "TlsOption",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
    "resolve_queue",
]

DEFAULT_FAILOVER_TIMEOUT_S: Final = 30.0
"""Well above a kill -9 failover (about 1.3 s on the bench)."""

QueueRef = QueueKey | int
"""A queue as a user names it: by name, or by a partition number (stable, or a position)."""


class OptionError(FerryError, ValueError):
    """A data source option is missing, unknown in combination, or malformed."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"ferrymq data source option {option!r}: {reason}")
        self.option = option
        self.reason = reason


_SPARK_OPTIONS: Final = frozenset({"checkpointlocation", "path", "queryname"})
"""What Spark itself passes with a stream's options (`option("checkpointLocation", ...)`, and
`queryName(...)` as `queryname`)."""
_BOTH: Final = frozenset(
    {
        "servers",
        "ferrymq.servers",
        "kafka.bootstrap.servers",
        "failovertimeoutms",
        "accesskey",
        "secretkey",
        "tls",
        "tlstrustcertpath",
    }
)
_READ_ONLY: Final = {
    name.lower(): name
    for name in (
        "subscribe",
        "subscribePattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "endingTimestamp",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "minPartitions",
        "failOnDataLoss",
        "includeHeaders",
        "includeFerryColumns",
        "groupId",
        "kafka.group.id",
        "fetchMaxBytes",
        "legacyOffsets",
        "initialOffsets",
        "rowsAs",
    )
}
_WRITE_ONLY: Final = {name.lower(): name for name in ("topic", "sinkId", "generation")}
DEFAULT_MAX_TRIGGER_DELAY_S: Final = 15 * 60.0
"""Kafka's `maxTriggerDelay` default (15m)."""
_DURATION: Final = re.compile(r"(\d+)\s*(ms|s|m|min|h|d)?", re.IGNORECASE)
_DURATION_UNITS_S: Final = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}


def _check_known(raw: Mapping[str, str], *, reading: bool) -> None:
    """Refuse an option this side of the data source does not take (names ignore case)."""
    mine, theirs = (_READ_ONLY, _WRITE_ONLY) if reading else (_WRITE_ONLY, _READ_ONLY)
    for name in sorted(raw):
        key = name.lower()
        if key in mine or key in _BOTH or key in _SPARK_OPTIONS:
            continue
        if key in theirs:
            side = "a write (df.write / writeStream)" if reading else "a read"
            raise OptionError(theirs[key], f"only {side} takes it")
        hint = " (a Kafka option with no ferrymq meaning)" if key.startswith("kafka") else ""
        known = ", ".join([*sorted(mine.values()), "servers", "failoverTimeoutMs"])
        raise OptionError(name, f"unknown option{hint}; known here: {known}")


@dataclass(frozen=True, slots=True)
class TimeSpec:
    """Where to start or end by store time: every queue, or per named queue (milliseconds)."""

    every_ms: int | None
    """`startingTimestamp` / `endingTimestamp`: every covered queue at this time."""
    per_queue: Mapping[str, Mapping[QueueRef, int]]
    """`...OffsetsByTimestamp`: topic -> queue -> time; used when `every_ms` is None."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to start or end: a default for every queue, overridden per named queue."""

    default: int
    """EARLIEST or LATEST."""
    per_queue: Mapping[str, Mapping[QueueRef, int]]
    """topic -> queue -> offset (or EARLIEST / LATEST); queues not named: `default`."""


def _forms(topic: str, example: QueueKey) -> str:
    number = stable_partition(example.broker_name, example.queue_id)
    return (
        f'name queues, {{"{topic}": {{"{example.broker_name}": {{"{example.queue_id}": 23}}}}}}, '
        f"or use the stable partition numbers the partition column shows "
        f"({number} is {example.broker_name} queue {example.queue_id}), "
        f'{{"{topic}": {{"{number}": 23}}}}'
    )


def resolve_queue(option: str, topic: str, ref: QueueRef, routed: Sequence[QueueKey]) -> QueueKey:
    """The routed queue `ref` names (`routed`: the topic's readable queues now).

    Raises:
        OptionError: the queue is not routed, the stable number is unknown, or a position is
            ambiguous (the topic spans several broker groups).
    """
    if isinstance(ref, QueueKey):
        if ref not in routed:
            raise OptionError(
                option,
                f"topic {topic} has no queue {ref.queue_id} of broker group {ref.broker_name} "
                "in its route now",
            )
        return ref
    if is_stable_partition(ref):
        found = [k for k in routed if stable_partition(k.broker_name, k.queue_id) == ref]
        if not found:
            raise OptionError(
                option,
                f"topic {topic}: partition {ref} is no queue of the topic's route now (a stable "
                "partition number names one queue of one broker group)",
            )
        return found[0]
    groups = sorted({k.broker_name for k in routed})
    if not groups:
        raise OptionError(option, f"topic {topic} has no readable queue in its route now")
    if len(groups) != 1:
        raise OptionError(
            option,
            f"topic {topic} spans {len(groups)} broker groups ({', '.join(groups)}), so partition "
            f"{ref}, a position in its route, does not name one queue: "
            + _forms(topic, min(routed)),
        )
    key = QueueKey(groups[0], ref)
    if key not in routed:
        raise OptionError(option, f"topic {topic} has {len(routed)} partitions; {ref} is not one")
    return key


def _queue_id(option: str, topic: str, broker: str, text: object) -> int:
    if not str(text).isdecimal() or int(str(text)) >= MAX_QUEUES_PER_GROUP:
        raise OptionError(
            option, f"{topic}/{broker}: queue ids are integers 0..{MAX_QUEUES_PER_GROUP - 1}"
        )
    return int(str(text))


def _offset(option: str, where: str, offset: object, *, ending: bool) -> int:
    if type(offset) is not int:
        raise OptionError(option, f"{where}: partitions are integers, offsets integers")
    if offset < EARLIEST or (ending and offset == EARLIEST):
        allowed = "-1 (latest)" if ending else "-2 (earliest), -1 (latest)"
        raise OptionError(option, f"{where}: offset {offset}; use >= 0 or {allowed}")
    return offset


def _topic_offsets(
    name: str, topic: str, queues: Mapping[str, Any], *, ending: bool
) -> dict[QueueRef, int]:
    """One topic's entries: `{"broker": {"queue id": offset}}` or `{"partition": offset}`."""
    per_topic: dict[QueueRef, int] = {}
    for ref, value in queues.items():
        if isinstance(value, dict):
            if not ref:
                raise OptionError(name, f"topic {topic}: a broker name is empty")
            for queue_id, offset in value.items():
                key = QueueKey(ref, _queue_id(name, topic, ref, queue_id))
                per_topic[key] = _offset(name, f"{topic}/{ref}/{queue_id}", offset, ending=ending)
            continue
        if not str(ref).isdecimal() or int(ref) >= 2**31:
            raise OptionError(name, f"{topic}/{ref}: partitions are integers, offsets integers")
        per_topic[int(ref)] = _offset(name, f"{topic}/{ref}", value, ending=ending)
    return per_topic


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What to read, from where, and how."""

    servers: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: Mapping[str, tuple[QueueRef, ...]] | None = None
    starting: OffsetSpec = OffsetSpec(EARLIEST, {})
    ending: OffsetSpec = OffsetSpec(LATEST, {})
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    include_ferry_columns: bool = False
    group: str = "ferrymq-spark"
    """The consumer group pulls name (pulls commit nothing; Spark's checkpoint holds offsets)."""
    fetch_max_bytes: int = 4 * 1024 * 1024
    """Bytes one pull may return."""
    failover_timeout_s: float = DEFAULT_FAILOVER_TIMEOUT_S
    """How long a request is retried across a failover."""
    credentials: Credentials | None = None
    """`accessKey`/`secretKey`: every request is signed (ACL 1.0); the repr hides the secret."""
    tls: TlsOption | None = None
    """`tls` / `tlsTrustCertPath` (None: the process's TLS, `FERRYMQ_TLS`)."""
    legacy_offsets: LegacyOffsets = LegacyOffsets.AUTO
    """How checkpoint offsets of the old positional layout are read."""
    initial: Offsets | None = None
    """`initialOffsets`: where a new stream starts the queues it names (checkpoint shape)."""
    starting_time: TimeSpec | None = None
    """`startingTimestamp` / `startingOffsetsByTimestamp` (they win over startingOffsets)."""
    ending_time: TimeSpec | None = None
    """`endingTimestamp` / `endingOffsetsByTimestamp` (batch reads)."""
    starting_time_latest: bool = False
    """`startingOffsetsByTimestampStrategy=latest`: a queue with no message at or after the
    starting time starts at its end (the default, `error`, fails the read)."""
    min_offsets_per_trigger: int | None = None
    """A micro-batch waits for at least this many new messages ..."""
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S
    """... for at most this long since the last batch (`maxTriggerDelay`)."""
    rows_as_ranges: bool = False
    """`rowsAs=ranges` (streams): one row per planned queue range instead of its messages."""

    def topic_filter(self, topic: str) -> bool:
        """Whether `subscribePattern` takes this topic (system topics never)."""
        if self.subscribe_pattern is None or topic.startswith(("rmq_sys_", "%", "RMQ_SYS_")):
            return False
        return re.fullmatch(self.subscribe_pattern, topic) is not None


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """Where rows go."""

    servers: str
    topic: str | None = None
    sink_id: str | None = None
    generation: int | None = None
    """The writer's fencing generation (Connect passes the task's)."""
    group: str = "ferrymq-spark-sink"
    failover_timeout_s: float = DEFAULT_FAILOVER_TIMEOUT_S
    """How long a prepare or commit is retried across a failover."""
    credentials: Credentials | None = None
    """`accessKey`/`secretKey`: every request is signed (ACL 1.0); the repr hides the secret."""
    tls: TlsOption | None = None
    """`tls` / `tlsTrustCertPath` (None: the process's TLS, `FERRYMQ_TLS`)."""


@dataclass(frozen=True, slots=True)
class TlsOption:
    """`tls` (true/false) and `tlsTrustCertPath`: the clients' TLS.

    As the SDK's `tls.enable` and `tls.client.trustCertPath` (the CA's PEM file; without it, the
    system's CAs).
    """

    enable: bool
    trust_cert_path: str | None = None


def _tls(options: Mapping[str, str]) -> TlsOption | None:
    """`tls` and `tlsTrustCertPath`; None when neither is given (the process's TLS applies)."""
    if "tls" not in options and "tlstrustcertpath" not in options:
        return None
    enable = _bool(options, "tls", False)
    trust = options.get("tlstrustcertpath")
    if trust is None:
        return TlsOption(enable)
    if not enable:
        raise OptionError("tlsTrustCertPath", "is read only with tls=true")
    try:
        ssl.create_default_context(cafile=trust)
    except (OSError, ssl.SSLError) as exc:
        raise OptionError(
            "tlsTrustCertPath", f"{trust!r} is not a readable PEM CA file: {exc}"
        ) from None
    return TlsOption(enable, trust)


def _credentials(options: Mapping[str, str]) -> Credentials | None:
    """`accessKey` and `secretKey` (ACL 1.0): both or neither."""
    try:
        return credentials_of(options.get("accesskey"), options.get("secretkey"))
    except ValueError:
        raise OptionError("accessKey", "give both accessKey and secretKey, or neither") from None


def _servers(options: Mapping[str, str]) -> str:
    servers = (
        options.get("servers")
        or options.get("ferrymq.servers")
        or options.get("kafka.bootstrap.servers")
    )
    if not servers or not servers.strip():
        raise OptionError("servers", "required: the NameServer addresses, e.g. 127.0.0.1:9876")
    addresses = [a.strip() for a in re.split(r"[;,]", servers) if a.strip()]
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdecimal():
            raise OptionError("servers", f"{address!r} is not HOST:PORT")
    return ";".join(addresses)


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise OptionError(name, f"must be true or false, not {text!r}")
    return lowered == "true"


def _positive(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(name, f"must be a positive integer, not {text!r}") from None
    if value <= 0:
        raise OptionError(name, f"must be a positive integer, not {value}")
    return value


def _failover_timeout(options: Mapping[str, str]) -> float:
    millis = _positive(options, "failoverTimeoutMs")
    return DEFAULT_FAILOVER_TIMEOUT_S if millis is None else millis / 1000


def _topics(text: str, name: str) -> tuple[str, ...]:
    topics = tuple(t.strip() for t in text.split(",") if t.strip())
    if not topics:
        raise OptionError(name, "names no topic")
    for topic in topics:
        try:
            validate_topic(topic)
        except ValueError as exc:
            raise OptionError(name, str(exc)) from None
    return topics


def _offset_spec(text: str | None, name: str, default: int, *, ending: bool) -> OffsetSpec:
    if text is None:
        return OffsetSpec(default, {})
    stripped = text.strip()
    if stripped.lower() == "earliest":
        if ending:
            raise OptionError(name, "'earliest' is not allowed for the end of a read")
        return OffsetSpec(EARLIEST, {})
    if stripped.lower() == "latest":
        return OffsetSpec(LATEST, {})
    try:
        parsed = json.loads(stripped)
    except json.JSONDecodeError:
        raise OptionError(
            name,
            'must be earliest, latest or JSON like {"topic":{"broker-a":{"0":23}}}, '
            f"not {text!r}",
        ) from None
    if not isinstance(parsed, dict):
        raise OptionError(name, "the JSON must be an object of topics")
    per_queue: dict[str, dict[QueueRef, int]] = {}
    for topic, queues in parsed.items():
        if not isinstance(queues, dict):
            raise OptionError(name, f"topic {topic!r} must map queues to offsets")
        per_queue[topic] = _topic_offsets(name, topic, queues, ending=ending)
    return OffsetSpec(default, per_queue)


def _assigned(topic: str, queues: object) -> tuple[QueueRef, ...]:
    """One topic's assignment: `[partition, ...]` or `{"broker": [queue id, ...]}`."""
    refs: list[QueueRef] = []
    if isinstance(queues, list) and all(type(p) is int and 0 <= p < 2**31 for p in queues):
        refs += queues
    elif isinstance(queues, dict) and all(
        b and isinstance(ids, list) and all(type(i) is int for i in ids)
        for b, ids in queues.items()
    ):
        for broker, ids in queues.items():
            refs += [QueueKey(broker, _queue_id("assign", topic, broker, i)) for i in ids]
    else:
        raise OptionError(
            "assign",
            f"topic {topic!r} must list partitions ([669289472, ...]) or queues per broker group "
            '({"broker-a": [0, 1]})',
        )
    unique = dict.fromkeys(refs)
    return tuple(unique)


def _assign(text: str) -> dict[str, tuple[QueueRef, ...]]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        raise OptionError(
            "assign", f'must be JSON like {{"topic":{{"broker-a":[0,1]}}}}, not {text!r}'
        ) from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(
            "assign", 'must be a non-empty JSON object like {"topic":{"broker-a":[0,1]}}'
        )
    result: dict[str, tuple[QueueRef, ...]] = {}
    for topic, queues in parsed.items():
        _topics(topic, "assign")
        result[topic] = _assigned(topic, queues)
    return result


def _legacy(options: Mapping[str, str]) -> LegacyOffsets:
    text = options.get("legacyoffsets")
    if text is None:
        return LegacyOffsets.AUTO
    for mode in LegacyOffsets:
        if text.strip().lower() == mode.value.lower():
            return mode
    choices = " or ".join(m.value for m in LegacyOffsets)
    raise OptionError("legacyOffsets", f"must be {choices}, not {text!r}")


def _initial(text: str | None) -> Offsets | None:
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or legacy_topics(parsed):
        raise OptionError(
            "initialOffsets",
            f'must be JSON like {{"topic":{{"broker-a":{{"0":23}}}}}}, not {text!r}',
        )
    try:
        offsets = parse_offsets(parsed)
    except ValueError as exc:
        raise OptionError("initialOffsets", str(exc)) from None
    for topic, queues in offsets.items():
        for key, offset in queues.items():
            if type(offset) is not int or offset < 0 or key.queue_id >= MAX_QUEUES_PER_GROUP:
                raise OptionError(
                    "initialOffsets",
                    f"{topic}/{key.broker_name}/{key.queue_id}: offsets are integers >= 0",
                )
    return offsets


def _millis(text: str, name: str) -> int:
    stripped = text.strip()
    if not stripped.isdecimal() or int(stripped) >= 2**63:
        raise OptionError(
            name, f"must be milliseconds since the epoch (an integer >= 0), not {text!r}"
        )
    return int(stripped)


def _time_spec(options: Mapping[str, str], every: str, per_queue: str) -> TimeSpec | None:
    """`every` (one time for every queue) wins over `per_queue` (JSON), as in Kafka's source."""
    if every.lower() in options:
        return TimeSpec(_millis(options[every.lower()], every), {})
    text = options.get(per_queue.lower())
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(
            per_queue,
            f'must be JSON like {{"topic":{{"broker-a":{{"0":1700000000000}}}}}}, not {text!r}',
        )
    times: dict[str, dict[QueueRef, int]] = {}
    for topic, queues in parsed.items():
        if not isinstance(queues, dict) or not queues:
            raise OptionError(per_queue, f"topic {topic!r} must map queues to times")
        times[topic] = {}
        for ref, value in _topic_offsets(per_queue, topic, queues, ending=False).items():
            if value < 0:
                raise OptionError(per_queue, f"{topic}/{ref}: times are milliseconds >= 0")
            times[topic][ref] = value
    return TimeSpec(None, times)


def _strategy(options: Mapping[str, str]) -> bool:
    text = options.get("startingoffsetsbytimestampstrategy")
    if text is None or text.strip().lower() == "error":
        return False
    if text.strip().lower() == "latest":
        return True
    raise OptionError(
        "startingOffsetsByTimestampStrategy", f"must be error or latest, not {text!r}"
    )


def _trigger_delay(options: Mapping[str, str]) -> float:
    """`maxTriggerDelay`: a duration like Spark's (`15m`, `30s`, `500ms`; a bare number: ms)."""
    text = options.get("maxtriggerdelay")
    if text is None:
        return DEFAULT_MAX_TRIGGER_DELAY_S
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise OptionError(
            "maxTriggerDelay", f"must be a duration like 15m, 30s or 500ms, not {text!r}"
        )
    unit = (match.group(2) or "ms").lower()
    return int(match.group(1)) * _DURATION_UNITS_S[unit]


def _generation(options: Mapping[str, str]) -> int | None:
    text = options.get("generation")
    if text is None:
        return None
    if not text.strip().isdecimal() or int(text) >= 2**63:
        raise OptionError("generation", f"must be an integer >= 0, not {text!r}")
    return int(text)


def parse_read_options(raw: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Check the options of a read (None: batch or stream, not known yet); keys ignore case.

    Raises:
        OptionError: naming the first bad option.
    """
    options = {k.lower(): v for k, v in raw.items()}
    _check_known(raw, reading=True)
    servers = _servers(options)
    chosen = [n for n in ("subscribe", "subscribepattern", "assign") if options.get(n)]
    if len(chosen) != 1:
        raise OptionError(
            "subscribe",
            "give exactly one of subscribe, subscribePattern or assign"
            + (f" (got {', '.join(chosen)})" if chosen else ""),
        )
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[QueueRef, ...]] | None = None
    if "subscribe" in chosen:
        subscribe = _topics(options["subscribe"], "subscribe")
    elif "subscribepattern" in chosen:
        pattern = options["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError("subscribePattern", f"not a regular expression: {exc}") from None
    else:
        assign = _assign(options["assign"])
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        if streaming is True and name.lower() in options:
            raise OptionError(name, "only a batch read (spark.read) takes it")
    for name in (
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "initialOffsets",
    ):
        if streaming is False and name.lower() in options:
            raise OptionError(name, "only a streaming read (spark.readStream) takes it")
    ranges = _rows_as(options, streaming)
    max_rows = _positive(options, "maxOffsetsPerTrigger")
    min_rows = _positive(options, "minOffsetsPerTrigger")
    if min_rows is not None and max_rows is not None and min_rows > max_rows:
        raise OptionError(
            "minOffsetsPerTrigger",
            f"{min_rows} is more than maxOffsetsPerTrigger ({max_rows}): no batch could start",
        )
    return ReadOptions(
        servers=servers,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting=_offset_spec(
            options.get("startingoffsets"),
            "startingOffsets",
            LATEST if streaming else EARLIEST,
            ending=False,
        ),
        ending=_offset_spec(options.get("endingoffsets"), "endingOffsets", LATEST, ending=True),
        max_offsets_per_trigger=max_rows,
        min_partitions=_positive(options, "minPartitions"),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        include_headers=_bool(options, "includeHeaders", False),
        include_ferry_columns=_bool(options, "includeFerryColumns", False),
        group=options.get("groupid") or options.get("kafka.group.id") or "ferrymq-spark",
        fetch_max_bytes=_positive(options, "fetchMaxBytes") or 4 * 1024 * 1024,
        failover_timeout_s=_failover_timeout(options),
        credentials=_credentials(options),
        tls=_tls(options),
        legacy_offsets=_legacy(options),
        initial=_initial(options.get("initialoffsets")),
        starting_time=_time_spec(options, "startingTimestamp", "startingOffsetsByTimestamp"),
        ending_time=_time_spec(options, "endingTimestamp", "endingOffsetsByTimestamp"),
        starting_time_latest=_strategy(options),
        min_offsets_per_trigger=min_rows,
        max_trigger_delay_s=_trigger_delay(options),
        rows_as_ranges=ranges,
    )


def _rows_as(options: Mapping[str, str], streaming: bool | None) -> bool:
    """Whether `rowsAs` asks for one row per queue range (streams only)."""
    value = (options.get("rowsas") or "messages").strip().lower()
    if value not in ("messages", "ranges"):
        raise OptionError("rowsAs", f"{value!r}: give messages or ranges")
    if value == "ranges":
        if streaming is False:
            raise OptionError(
                "rowsAs",
                "ranges is for streams whose writer reads each range itself; a batch read "
                "returns messages",
            )
        for name in ("includeHeaders", "includeFerryColumns"):
            if _bool(options, name, False):
                raise OptionError(name, "rows of rowsAs=ranges hold no message columns")
    return value == "ranges"


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    """Check the options of a write.

    Raises:
        OptionError: naming the first bad option.
    """
    options = {k.lower(): v for k, v in raw.items()}
    _check_known(raw, reading=False)
    topic = options.get("topic")
    if topic is not None:
        topic = _topics(topic, "topic")[0]
    sink_id = options.get("sinkid")
    if sink_id is not None and not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", sink_id):
        raise OptionError("sinkId", "use 1-128 letters, digits and _.:-")
    return WriteOptions(
        servers=_servers(options),
        topic=topic,
        sink_id=sink_id,
        generation=_generation(options),
        failover_timeout_s=_failover_timeout(options),
        credentials=_credentials(options),
        tls=_tls(options),
    )
