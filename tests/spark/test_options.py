"""Bad options fail the query at once, with a message naming the option."""

from typing import Any

import pytest

from ferrymq.spark.options import OptionError, parse_read_options, parse_write_options

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
