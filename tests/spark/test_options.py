"""Bad options fail the query at once, with a message naming the option."""

from typing import Any

import pytest

from ferrymq.model import MessageQueue
from ferrymq.spark.fetch import resolve_offsets
from ferrymq.spark.options import (
    EARLIEST,
    LATEST,
    OptionError,
    parse_read_options,
    parse_write_options,
    resolve_queue,
)
from ferrymq.spark.plan import LegacyOffsets, PartitionCollisionError, QueueKey, stable_partition
from ferrymq.spark.sink import queue_of_partition

from .conftest import Ferry

pytestmark = pytest.mark.spark

BAD_READS = [
    ({"subscribe": "T"}, "'servers': required"),
    ({"servers": "nohost", "subscribe": "T"}, "is not HOST:PORT"),
    ({"servers": "127.0.0.1:1"}, "exactly one of subscribe, subscribePattern or assign"),
    ({"servers": "127.0.0.1:1", "subscribe": "T", "assign": '{"T":[0]}'}, "got subscribe, assign"),
    ({"servers": "127.0.0.1:1", "subscribe": "bad topic"}, "only letters, digits"),
    ({"servers": "127.0.0.1:1", "subscribePattern": "("}, "not a regular expression"),
    ({"servers": "127.0.0.1:1", "assign": "[0]"}, "non-empty JSON object"),
    ({"servers": "127.0.0.1:1", "subscribe": "T", "startingOffsets": "{"}, "must be earliest"),
    ({"servers": "127.0.0.1:1", "subscribe": "T", "endingOffsets": "earliest"}, "not allowed"),
    (
        {"servers": "127.0.0.1:1", "subscribe": "T", "startingOffsets": '{"T":{"0":-3}}'},
        "offset -3",
    ),
    ({"servers": "127.0.0.1:1", "subscribe": "T", "failOnDataLoss": "yes"}, "true or false"),
    ({"servers": "127.0.0.1:1", "subscribe": "T", "minPartitions": "0"}, "positive integer"),
    ({"servers": "127.0.0.1:1", "subscribe": "T", "maxOffsetsPerTrigger": "9"}, "streaming"),
    ({"servers": "127.0.0.1:1", "subscribe": "T", "failoverTimeoutMs": "-1"}, "positive integer"),
    (
        {"servers": "127.0.0.1:1", "subscribe": "T", "startingOffsets": '{"T":{"b":{"1024":0}}}'},
        r"T/b: queue ids are integers 0..1023",
    ),
    (
        {"servers": "127.0.0.1:1", "subscribe": "T", "startingOffsets": '{"T":{"b":{"0":1.5}}}'},
        "offsets integers",
    ),
    ({"servers": "127.0.0.1:1", "assign": '{"T":{"b":[-1]}}'}, "queue ids are integers"),
    ({"servers": "127.0.0.1:1", "assign": '{"T":{"b":0}}'}, "must list partitions"),
    (
        {"servers": "127.0.0.1:1", "subscribe": "T", "legacyOffsets": "guess"},
        "auto or currentRoute",
    ),
]


@pytest.mark.parametrize(("options", "message"), BAD_READS)
def test_bad_read_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_read_options(options, streaming=False)


def test_bad_options_fail_the_spark_query_with_the_message(spark: Any, ferry: Ferry) -> None:
    reader = spark.read.format("ferrymq").option("servers", ferry.servers)
    with pytest.raises(Exception, match="give exactly one of subscribe"):
        reader.load().count()
    with pytest.raises(Exception, match="no route for topic 'NoSuchTopic'"):
        reader.option("subscribe", "NoSuchTopic").load().count()  # (the last use of reader)

    def stream() -> Any:  # readers are mutable builders: a fresh one each time
        return spark.readStream.format("ferrymq").option("servers", ferry.servers)

    with pytest.raises(Exception, match="'startingOffsets': must be earliest"):
        stream().option("subscribe", "T").option("startingOffsets", "first").load()
    query = (
        stream()
        .option("subscribe", "T")
        .option("endingOffsets", "latest")
        .load()
        .writeStream.format("noop")
        .start()
    )
    with pytest.raises(Exception, match="'endingOffsets': only a batch read"):
        query.awaitTermination(60)
    with pytest.raises(Exception, match="rows to write need a value column"):
        spark.range(3).write.format("ferrymq").option("servers", ferry.servers).option(
            "topic", "T"
        ).mode("append").save()
    with pytest.raises(OptionError, match="sinkId"):
        parse_write_options({"servers": "127.0.0.1:1", "sinkId": "a b"})


def test_the_failover_timeout_is_in_milliseconds_and_defaults_to_30_s() -> None:
    read = {"servers": "127.0.0.1:1", "subscribe": "T"}
    assert parse_read_options(read, streaming=True).failover_timeout_s == 30.0
    timed = {**read, "failoverTimeoutMs": "250"}
    assert parse_read_options(timed, streaming=True).failover_timeout_s == 0.25
    write = {"servers": "127.0.0.1:1", "FAILOVERTIMEOUTMS": "1500"}
    assert parse_write_options(write).failover_timeout_s == 1.5
    with pytest.raises(OptionError, match="failoverTimeoutMs"):
        parse_write_options({"servers": "127.0.0.1:1", "failoverTimeoutMs": "soon"})


A = [QueueKey("broker-a", i) for i in range(4)]
B = [QueueKey("broker-b", i) for i in range(4)]


def test_offsets_json_takes_queue_names_stable_numbers_and_positions() -> None:
    stable = stable_partition("broker-b", 2)
    text = f'{{"T": {{"broker-a": {{"0": 23, "3": -2}}, "{stable}": 7}}, "U": {{"1": -1}}}}'
    options = parse_read_options(
        {"servers": "127.0.0.1:1", "subscribe": "T,U", "startingOffsets": text}, streaming=True
    )
    assert options.starting.default == LATEST
    assert options.starting.per_queue == {
        "T": {A[0]: 23, A[3]: EARLIEST, stable: 7},
        "U": {1: LATEST},
    }
    bounds = {
        "T": dict.fromkeys(A + B, (2, 50)),
        "U": {QueueKey("broker-c", i): (0, 9) for i in range(2)},
    }
    assert resolve_offsets(options.starting, bounds, "startingOffsets") == {
        "T": {**dict.fromkeys(A + B, 50), A[0]: 23, A[3]: 2, B[2]: 7},
        "U": {QueueKey("broker-c", 0): 9, QueueKey("broker-c", 1): 9},
    }


def test_a_position_is_refused_once_a_topic_spans_several_groups() -> None:
    assert resolve_queue("startingOffsets", "T", 2, A) == A[2]
    with pytest.raises(OptionError, match="has 4 partitions; 4 is not one"):
        resolve_queue("startingOffsets", "T", 4, A)
    with pytest.raises(OptionError, match="no readable queue in its route now"):
        resolve_queue("startingOffsets", "T", 0, [])
    with pytest.raises(OptionError) as refused:
        resolve_queue("startingOffsets", "T", 2, A + B)
    message = str(refused.value)
    assert "topic T spans 2 broker groups (broker-a, broker-b)" in message
    assert '{"T": {"broker-a": {"0": 23}}}' in message
    number = stable_partition("broker-a", 0)
    assert f'({number} is broker-a queue 0), {{"T": {{"{number}": 23}}}}' in message


def test_unknown_queues_and_numbers_are_option_errors() -> None:
    assert resolve_queue("assign", "T", stable_partition("broker-b", 3), A + B) == B[3]
    with pytest.raises(OptionError, match="partition 2048 is no queue of the topic's route now"):
        resolve_queue("assign", "T", 2048, A + B)
    with pytest.raises(OptionError, match="no queue 5 of broker group broker-a in its route"):
        resolve_queue("assign", "T", QueueKey("broker-a", 5), A + B)
    spec = parse_read_options(
        {
            "servers": "127.0.0.1:1",
            "subscribe": "T",
            "endingOffsets": f'{{"T": {{"{stable_partition("broker-a", 1)}": 5, '
            '"broker-a": {"1": 6}}}',
        },
        streaming=False,
    ).ending
    with pytest.raises(OptionError, match="broker-a queue 1 is named twice"):
        resolve_offsets(spec, {"T": dict.fromkeys(A, (0, 9))}, "endingOffsets")
    with pytest.raises(OptionError, match="topic T is not a topic of this read"):
        resolve_offsets(spec, {"V": {}}, "endingOffsets")


def test_assign_takes_queues_per_group_or_partition_numbers() -> None:
    number = stable_partition("broker-b", 1)
    options = parse_read_options(
        {
            "servers": "127.0.0.1:1",
            "assign": f'{{"T": {{"broker-a": [1, 0, 1]}}, "U": [{number}, 0]}}',
        },
        streaming=True,
    )
    assert options.assign == {"T": (A[1], A[0]), "U": (number, 0)}
    assert options.legacy_offsets is LegacyOffsets.AUTO
    legacy = parse_read_options(
        {"servers": "127.0.0.1:1", "assign": '{"T": [0]}', "legacyoffsets": "CURRENTROUTE"},
        streaming=True,
    )
    assert legacy.legacy_offsets is LegacyOffsets.CURRENT_ROUTE


def test_the_sink_s_partition_is_a_stable_number_or_a_position() -> None:
    queues = [MessageQueue("T", k.broker_name, k.queue_id) for k in A + B]
    assert queue_of_partition("T", stable_partition("broker-b", 2), queues) == queues[6]
    assert queue_of_partition("T", 5, queues) == queues[5]  # Kafka-style: route-dependent
    with pytest.raises(OptionError, match="8 writable queues; partition 8 is neither"):
        queue_of_partition("T", 8, queues)
    gone = stable_partition("broker-c", 0)
    with pytest.raises(OptionError, match=r"queue 0 of the broker group with code \d+ \(no broker"):
        queue_of_partition("T", gone, queues)
    with pytest.raises(
        OptionError, match=r"queue 7 of the broker group with code \d+ \(broker group broker-a\)"
    ):
        queue_of_partition("T", stable_partition("broker-a", 7), queues)


def test_the_sink_refuses_a_stable_number_when_two_groups_share_its_code() -> None:
    from .test_plan import colliding_names

    first, second = colliding_names()
    queues = [MessageQueue("T", first, 0), MessageQueue("T", second, 0)]
    with pytest.raises(PartitionCollisionError, match="rename one group"):
        queue_of_partition("T", stable_partition(first, 0), queues)
