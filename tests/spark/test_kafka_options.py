"""The Kafka source's options a Spark user brings: refused when unknown, honoured when they map.

Unknown options fail the read or write naming the option (a Kafka job's `startingTimestamp`
used to start silently at latest); `kafka.bootstrap.servers` and `kafka.group.id` are aliases;
the timestamp options start and end queues at the first message stored at or after a time
(checked against a real broker and Spark); a batch write takes `mode("append")` only;
`minOffsetsPerTrigger` holds a micro-batch back until
enough messages wait or `maxTriggerDelay` has passed (the reader's planning, on a model).
"""

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import StructType

from ferrymq.spark.options import (
    DEFAULT_MAX_TRIGGER_DELAY_S,
    OptionError,
    ReadOptions,
    parse_read_options,
    parse_write_options,
)
from ferrymq.spark.plan import Bounds, Offsets, QueueKey, QueueRange
from ferrymq.spark.source import FerryStreamReader

from .conftest import Ferry, create_topic, produce_bulk

pytestmark = pytest.mark.spark

READ = {"servers": "127.0.0.1:1", "subscribe": "T"}

BAD = [
    ({**READ, "startingTimestampp": "1"}, False, "'startingTimestampp': unknown option"),
    ({**READ, "kafka.security.protocol": "SSL"}, False, "a Kafka option with no ferrymq meaning"),
    ({**READ, "topic": "T"}, False, "'topic': only a write"),
    ({"servers": "127.0.0.1:1", "subscribe": "T", "sinkId": "s"}, False, "'sinkId': only a write"),
    ({**READ, "startingTimestamp": "yesterday"}, False, "milliseconds since the epoch"),
    ({**READ, "startingTimestamp": "-5"}, False, "milliseconds since the epoch"),
    ({**READ, "startingOffsetsByTimestamp": "[1]"}, False, "must be JSON like"),
    ({**READ, "startingOffsetsByTimestamp": '{"T":{"b":{"0":-1}}}'}, False, "times are"),
    ({**READ, "startingOffsetsByTimestampStrategy": "skip"}, False, "error or latest"),
    ({**READ, "endingTimestamp": "5"}, True, "'endingTimestamp': only a batch read"),
    ({**READ, "endingOffsetsByTimestamp": '{"T":{"0":5}}'}, True, "only a batch read"),
    ({**READ, "minOffsetsPerTrigger": "5"}, False, "only a streaming read"),
    ({**READ, "maxTriggerDelay": "5m"}, False, "only a streaming read"),
    ({**READ, "maxTriggerDelay": "soon"}, True, "a duration like 15m"),
    (
        {**READ, "minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"},
        True,
        "50 is more than maxOffsetsPerTrigger",
    ),
]


@pytest.mark.parametrize(("options", "streaming", "message"), BAD)
def test_unknown_and_bad_kafka_options_are_refused_by_name(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        parse_read_options(options, streaming=streaming)


def test_writes_refuse_read_options_and_unknown_ones() -> None:
    with pytest.raises(OptionError, match="'subscribe': only a read"):
        parse_write_options({"servers": "127.0.0.1:1", "subscribe": "T"})
    with pytest.raises(OptionError, match=r"'kafka\.acks': unknown option"):
        parse_write_options({"servers": "127.0.0.1:1", "kafka.acks": "all"})
    written = parse_write_options(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "T", "checkpointLocation": "/x"}
    )
    assert (written.servers, written.topic) == ("127.0.0.1:1", "T")


def test_kafka_aliases_durations_and_timestamp_precedence() -> None:
    options = parse_read_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1,127.0.0.2:2",
            "kafka.group.id": "g1",
            "subscribe": "T",
            "startingTimestamp": "1700000000000",
            "startingOffsetsByTimestamp": '{"T":{"broker-a":{"0":5}}}',
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "30s",
        },
        streaming=True,
    )
    assert options.servers == "127.0.0.1:1;127.0.0.2:2"
    assert options.group == "g1"
    assert options.starting_time is not None
    assert options.starting_time.every_ms == 1700000000000  # startingTimestamp wins, as Kafka's
    assert (options.min_offsets_per_trigger, options.max_trigger_delay_s) == (10, 30.0)
    by_queue = parse_read_options(
        {**READ, "startingOffsetsByTimestamp": '{"T":{"broker-a":{"1":7}}}'}, streaming=True
    )
    assert by_queue.starting_time is not None
    assert by_queue.starting_time.per_queue == {"T": {QueueKey("broker-a", 1): 7}}
    assert not by_queue.starting_time_latest
    plain = parse_read_options(READ, streaming=True)
    assert (plain.starting_time, plain.max_trigger_delay_s) == (None, DEFAULT_MAX_TRIGGER_DELAY_S)
    assert (
        parse_read_options({**READ, "maxTriggerDelay": "250"}, streaming=True).max_trigger_delay_s
        == 0.25
    )


class Backlog:
    """A `QueueSource` of one queue whose end the test moves (no reads: planning only)."""

    def __init__(self) -> None:
        self.end = 0

    def bounds(self, options: ReadOptions, start: Offsets | None) -> Bounds:
        return {"T": {QueueKey("broker-a", 0): (0, self.end)}}

    def routes(self, options: ReadOptions, topics: Any) -> dict[str, list[QueueKey]]:
        return {"T": [QueueKey("broker-a", 0)]}

    def read(
        self, options: ReadOptions, queue_range: QueueRange, schema: StructType
    ) -> Iterator[Any]:
        raise AssertionError("planning only")

    def times(self, options: ReadOptions, times: dict[str, dict[QueueKey, int]]) -> Any:
        """Message i was stored at millisecond 1000 + 10 i."""
        return {
            t: {k: min(self.end, max(0, -(-(ms - 1000) // 10))) for k, ms in queues.items()}
            for t, queues in times.items()
        }


def test_min_offsets_per_trigger_waits_for_enough_messages_or_the_delay() -> None:
    now = [100.0]
    source = Backlog()
    options = parse_read_options(
        {
            **READ,
            "startingOffsets": "earliest",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "60s",
        },
        streaming=True,
    )
    reader = FerryStreamReader(options, StructType(), source, clock=lambda: now[0])
    start = reader.initialOffset()
    source.end = 4
    assert reader.latestOffset(start, ReadAllAvailable()) == start  # 4 < 10: no batch
    now[0] += 59
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    source.end = 12
    first = reader.latestOffset(start, ReadAllAvailable())  # 12 >= 10: a batch at once
    assert first == {"T": {"broker-a": {"0": 12}}}
    source.end = 15
    assert reader.latestOffset(first, ReadAllAvailable()) == first  # 3 new, delay not passed
    now[0] += 60
    assert reader.latestOffset(first, ReadAllAvailable()) == {"T": {"broker-a": {"0": 15}}}
    # maxOffsetsPerTrigger still caps; AvailableNow never waits
    capped = parse_read_options(
        {
            **READ,
            "startingOffsets": "earliest",
            "minOffsetsPerTrigger": "2",
            "maxOffsetsPerTrigger": "5",
        },
        streaming=True,
    )
    reader = FerryStreamReader(capped, StructType(), source, clock=lambda: now[0])
    assert reader.latestOffset(reader.initialOffset(), ReadMaxRows(5)) == {
        "T": {"broker-a": {"0": 5}}
    }
    reader = FerryStreamReader(options, StructType(), source, clock=lambda: now[0])
    reader.prepareForTriggerAvailableNow()
    begin = {"T": {"broker-a": {"0": 14}}}
    assert reader.latestOffset(begin, ReadAllAvailable()) == {"T": {"broker-a": {"0": 15}}}


def test_starting_timestamps_position_queues_or_fail_as_the_strategy_says() -> None:
    source = Backlog()
    source.end = 20
    timed = parse_read_options({**READ, "startingTimestamp": "1055"}, streaming=True)
    reader = FerryStreamReader(timed, StructType(), source)
    assert reader.initialOffset() == {"T": {"broker-a": {"0": 6}}}  # 1060 is the first at or after
    late = parse_read_options({**READ, "startingTimestamp": "5000"}, streaming=True)
    with pytest.raises(OptionError, match="holds no message stored at or after 5000 ms"):
        FerryStreamReader(late, StructType(), source).initialOffset()
    latest = parse_read_options(
        {**READ, "startingTimestamp": "5000", "startingOffsetsByTimestampStrategy": "latest"},
        streaming=True,
    )
    assert FerryStreamReader(latest, StructType(), source).initialOffset() == {
        "T": {"broker-a": {"0": 20}}
    }
    wrong = parse_read_options(
        {**READ, "startingOffsetsByTimestamp": '{"Other":{"broker-a":{"0":1}}}'}, streaming=True
    )
    with pytest.raises(OptionError, match="topic Other is not a topic of this read"):
        FerryStreamReader(wrong, StructType(), source).initialOffset()


def test_a_batch_read_between_two_times_against_a_real_broker(spark: Any, ferry: Ferry) -> None:
    topic = "KafkaTimes"
    asyncio.run(create_topic(ferry.servers, topic, 2))
    early = asyncio.run(produce_bulk(ferry.servers, topic, "early", 400))
    time.sleep(0.05)
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    later = asyncio.run(produce_bulk(ferry.servers, topic, "later", 400))
    time.sleep(0.05)
    end_ms = int(time.time() * 1000)
    time.sleep(0.05)
    asyncio.run(produce_bulk(ferry.servers, topic, "last", 200))

    def read(**options: str) -> set[bytes]:
        frame = (
            spark.read.format("ferrymq")
            .option("kafka.bootstrap.servers", ferry.servers)
            .option("subscribe", topic)
            .options(**options)
            .load()
        )
        rows = [bytes(r.value) for r in frame.select("value").collect()]
        assert len(rows) == len(set(rows)), "a message was read twice"
        return set(rows)

    assert read(startingTimestamp=str(middle_ms), endingTimestamp=str(end_ms)) == set(later)
    assert read(endingTimestamp=str(middle_ms)) == set(early)
    with pytest.raises(
        Exception, match=r"(?i)'startingTimestampMs': unknown option"
    ):  # Spark lowercases keys
        read(startingTimestampMs=str(middle_ms))
    with pytest.raises(Exception, match="holds no message stored at or after"):
        read(startingTimestamp=str(end_ms + 3_600_000))

    def write() -> Any:
        frame = spark.createDataFrame([("v",)], "value STRING")
        return frame.write.format("ferrymq").option("servers", ferry.servers).option("topic", topic)

    with pytest.raises(Exception, match="overwrite is not possible: a topic is a log"):
        write().mode("overwrite").save()
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        write().save()  # Spark's default mode, refused by Spark itself (docs/spark.md)
