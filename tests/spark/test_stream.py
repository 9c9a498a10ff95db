"""Streaming reads: maxOffsetsPerTrigger, AvailableNow, queues and topics added mid-stream."""

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ferrymq.spark.plan import stable_partition

from .conftest import Ferry, create_topic, produce_bulk

pytestmark = pytest.mark.spark


def run_available_now(spark: Any, ferry: Ferry, out: Path, checkpoint: Path) -> list[int]:
    query = (
        spark.readStream.format("ferrymq")
        .option("servers", ferry.servers)
        .option("subscribePattern", "SparkGrow.*")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "250")
        .load()
        .selectExpr("value", "topic", "partition", "offset")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(100)
    assert query.exception() is None
    return [p["numInputRows"] for p in query.recentProgress]


def test_new_queues_and_topics_join_a_running_stream_exactly_once(
    spark: Any, ferry: Ferry, tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    asyncio.run(create_topic(ferry.servers, "SparkGrow", 2))
    produced = asyncio.run(produce_bulk(ferry.servers, "SparkGrow", "a", 600))

    first = run_available_now(spark, ferry, out, checkpoint)
    assert sum(first) == 600
    assert max(first) <= 250 + 2  # maxOffsetsPerTrigger, split over the queues by backlog
    assert len(first) >= 3

    async def grow() -> list[bytes]:
        await create_topic(ferry.servers, "SparkGrow", 4)  # two more queues
        await create_topic(ferry.servers, "SparkGrowMore", 2)  # a new topic of the pattern
        return await produce_bulk(ferry.servers, "SparkGrow", "b", 800) + await produce_bulk(
            ferry.servers, "SparkGrowMore", "c", 200
        )

    produced += asyncio.run(grow())
    second = run_available_now(spark, ferry, out, checkpoint)
    assert sum(second) == 1000

    rows = spark.read.parquet(str(out))
    assert rows.count() == len(produced)
    assert rows.select("topic", "partition", "offset").distinct().count() == len(produced)
    assert sorted(r["value"] for r in rows.select("value").collect()) == sorted(produced)
    partitions = {r["partition"] for r in rows.where("topic = 'SparkGrow'").collect()}
    assert partitions == {stable_partition("broker-a", i) for i in range(4)}
