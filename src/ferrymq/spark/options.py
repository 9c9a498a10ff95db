"""The data source's options: parsed and checked once, with errors that name the option.

Names follow Spark's Kafka source (`structured-streaming-kafka-integration`), with `servers` for
`kafka.bootstrap.servers` (NameServer addresses, `;` or `,` separated):

- exactly one of `subscribe` (comma list), `subscribePattern` (a Python regex over every topic
  the NameServers route) or `assign` (JSON `{"topic": [partition, ...]}`);
- `startingOffsets` / `endingOffsets`: `earliest`, `latest` or JSON
  `{"topic": {"partition": offset}}` with -2 = earliest and -1 = latest (Kafka's sentinels);
- `maxOffsetsPerTrigger`, `minPartitions`, `failOnDataLoss` (default true), `includeHeaders`;
- `includeFerryColumns`: add the ferrymq columns `tags`, `keys`, `msgId`, `storeTimestamp`;
- writing: `topic` (else the `topic` column), `sinkId` (else the streaming query id);
- both: `failoverTimeoutMs` (default 30000): how long a read or write retries while a broker
  group has no master (a failover) before the query fails with a `RetryableQueryError`, and how
  long a read waits for a queue that ends below the planned offsets (a new master's watermark
  catching up) before those offsets count as lost (`failOnDataLoss`).

A partition is a topic-global queue index: the topic's readable queues ordered by broker name,
then queue id (so broker groups added later should sort after the existing ones).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ferrymq.errors import FerryError
from ferrymq.model import validate_topic

__all__ = [
    "DEFAULT_FAILOVER_TIMEOUT_S",
    "EARLIEST",
    "LATEST",
    "OffsetSpec",
    "OptionError",
    "ReadOptions",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
]

EARLIEST: Final = -2
LATEST: Final = -1
DEFAULT_FAILOVER_TIMEOUT_S: Final = 30.0
"""Well above a kill -9 failover (about 1.3 s on the bench)."""


class OptionError(FerryError, ValueError):
    """A data source option is missing, unknown in combination, or malformed."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"ferrymq data source option {option!r}: {reason}")
        self.option = option
        self.reason = reason


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to start or end: a default for every queue, overridden per (topic, partition)."""

    default: int
    """EARLIEST or LATEST."""
    per_queue: Mapping[str, Mapping[int, int]]
    """topic -> partition -> offset (or EARLIEST / LATEST); partitions not listed: `default`."""

    def for_queue(self, topic: str, partition: int) -> int:
        """The offset (or sentinel) asked for one queue."""
        return self.per_queue.get(topic, {}).get(partition, self.default)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What to read, from where, and how."""

    servers: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: Mapping[str, tuple[int, ...]] | None = None
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
    group: str = "ferrymq-spark-sink"
    failover_timeout_s: float = DEFAULT_FAILOVER_TIMEOUT_S
    """How long a prepare or commit is retried across a failover."""


def _servers(options: Mapping[str, str]) -> str:
    servers = options.get("servers") or options.get("ferrymq.servers")
    if not servers or not servers.strip():
        raise OptionError("servers", "required: the NameServer addresses, e.g. 127.0.0.1:9876")
    addresses = [a.strip() for a in re.split(r"[;,]", servers) if a.strip()]
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
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
            name, f'must be earliest, latest or JSON like {{"topic":{{"0":23}}}}, not {text!r}'
        ) from None
    if not isinstance(parsed, dict):
        raise OptionError(name, "the JSON must be an object of topics")
    per_queue: dict[str, dict[int, int]] = {}
    for topic, queues in parsed.items():
        if not isinstance(queues, dict):
            raise OptionError(name, f"topic {topic!r} must map partitions to offsets")
        per_topic: dict[int, int] = {}
        for partition, offset in queues.items():
            if not str(partition).isdigit() or type(offset) is not int:
                raise OptionError(
                    name, f"{topic}/{partition}: partitions are integers, offsets integers"
                )
            if offset < EARLIEST or (ending and offset == EARLIEST):
                allowed = "-1 (latest)" if ending else "-2 (earliest), -1 (latest)"
                raise OptionError(
                    name, f"{topic}/{partition}: offset {offset}; use >= 0 or {allowed}"
                )
            per_topic[int(partition)] = offset
        per_queue[topic] = per_topic
    return OffsetSpec(default, per_queue)


def _assign(text: str) -> dict[str, tuple[int, ...]]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        raise OptionError("assign", f'must be JSON like {{"topic":[0,1]}}, not {text!r}') from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError("assign", 'must be a non-empty JSON object like {"topic":[0,1]}')
    result: dict[str, tuple[int, ...]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(
            type(p) is int and p >= 0 for p in partitions
        ):
            raise OptionError("assign", f"topic {topic!r} must list partitions (integers >= 0)")
        _topics(topic, "assign")
        result[topic] = tuple(sorted(set(partitions)))
    return result


def parse_read_options(raw: Mapping[str, str], *, streaming: bool | None) -> ReadOptions:
    """Check the options of a read (None: batch or stream, not known yet); keys ignore case.

    Raises:
        OptionError: naming the first bad option.
    """
    options = {k.lower(): v for k, v in raw.items()}
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
    assign: dict[str, tuple[int, ...]] | None = None
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
    if streaming is True and "endingoffsets" in options:
        raise OptionError("endingOffsets", "only a batch read (spark.read) takes it")
    if streaming is False and "maxoffsetspertrigger" in options:
        raise OptionError(
            "maxOffsetsPerTrigger", "only a streaming read (spark.readStream) takes it"
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
        max_offsets_per_trigger=_positive(options, "maxOffsetsPerTrigger"),
        min_partitions=_positive(options, "minPartitions"),
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        include_headers=_bool(options, "includeHeaders", False),
        include_ferry_columns=_bool(options, "includeFerryColumns", False),
        group=options.get("groupid", "ferrymq-spark"),
        fetch_max_bytes=_positive(options, "fetchMaxBytes") or 4 * 1024 * 1024,
        failover_timeout_s=_failover_timeout(options),
    )


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    """Check the options of a write.

    Raises:
        OptionError: naming the first bad option.
    """
    options = {k.lower(): v for k, v in raw.items()}
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
        failover_timeout_s=_failover_timeout(options),
    )
