"""Batch reads: what Spark reads is what was produced (content, offsets, headers)."""

import asyncio
import datetime
from typing import Any

import pytest

from ferrymq.client.producer import Producer
from ferrymq.spark.plan import stable_partition

from .conftest import Ferry, create_topic

pytestmark = pytest.mark.spark


def test_batch_read_equals_what_was_produced(spark: Any, ferry: Ferry) -> None:
    topic = "SparkRead"

    async def produce() -> list[Any]:
        await create_topic(ferry.servers, topic, 4)
        async with Producer(ferry.servers, "spark-read") as producer:
            return [
                await producer.send(
                    topic,
                    f"value-{i}".encode(),
                    tags=f"tag{i % 3}",
                    keys=[f"key-{i}"],
                    properties={"n": str(i)},
                )
                for i in range(400)
            ]

    sent = asyncio.run(produce())
    partition_of = {r.queue: stable_partition(r.queue.broker_name, r.queue.queue_id) for r in sent}
    df = (
        spark.read.format("ferrymq")
        .option("servers", ferry.servers)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("includeFerryColumns", "true")
        .load()
    )
    assert df.columns == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
        "headers", "tags", "keys", "msgId", "storeTimestamp", "brokerName", "queueId",
    ]  # fmt: skip
    rows = {(r["partition"], r["offset"]): r for r in df.collect()}
    assert len(rows) == len(sent)
    for i, result in enumerate(sent):
        row = rows[(partition_of[result.queue], result.queue_offset)]
        assert row["value"] == f"value-{i}".encode()
        assert row["key"] == f"key-{i}".encode()
        assert row["topic"] == topic
        assert row["timestampType"] == 0
        assert isinstance(row["timestamp"], datetime.datetime)
        headers = {h["key"]: h["value"] for h in row["headers"]}
        assert headers["n"] == str(i).encode()
        assert headers["TAGS"] == f"tag{i % 3}".encode()
        assert (row["tags"], row["keys"], row["msgId"]) == (
            f"tag{i % 3}",
            [f"key-{i}"],
            result.msg_id,
        )
        assert row["storeTimestamp"] >= row["timestamp"] - datetime.timedelta(seconds=1)
        assert (row["brokerName"], row["queueId"]) == (
            result.queue.broker_name,
            result.queue.queue_id,
        )

    # a slice: explicit offsets per queue (-2 earliest, -1 latest), split over more tasks; queues
    # named by broker group and queue id, by stable partition number, or (one group) by position
    p0, p1 = stable_partition("broker-a", 0), stable_partition("broker-a", 1)
    for assign, starting, ending in [
        (
            '{"broker-a": [0, 1]}',
            '{"broker-a": {"0": 10, "1": -2}}',
            '{"broker-a": {"0": 30, "1": -1}}',
        ),
        (f"[{p0}, {p1}]", f'{{"{p0}": 10, "{p1}": -2}}', f'{{"{p0}": 30, "{p1}": -1}}'),
        ("[0, 1]", '{"0": 10, "1": -2}', '{"0": 30, "1": -1}'),
    ]:
        sliced = (
            spark.read.format("ferrymq")
            .option("servers", ferry.servers)
            .option("assign", f'{{"{topic}": {assign}}}')
            .option("startingOffsets", f'{{"{topic}": {starting}}}')
            .option("endingOffsets", f'{{"{topic}": {ending}}}')
            .option("minPartitions", "6")
            .load()
        )
        assert sliced.rdd.getNumPartitions() >= 6
        got = sorted(
            (r["partition"], r["offset"]) for r in sliced.select("partition", "offset").collect()
        )
        assert got == [(p0, o) for o in range(10, 30)] + [(p1, o) for o in range(100)], assign
        assert "headers" not in sliced.columns
