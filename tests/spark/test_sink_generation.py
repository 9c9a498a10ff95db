"""The ferrymq sink across checkpoints and owners: sink ids, generations, source positions.

- a batch read of a topic with no message reads nothing (PySpark's stand-in partition);
- a new checkpoint under the same `sinkId` numbers its batches from 0 again, and none of them
  is swallowed by the decisions of the old checkpoint's batches;
- two drivers on one sink id, generations 1 and 2 (a zombie: the task moved while its old
  owner kept running): once generation 2 fenced, generation 1's next micro-batch (other rows,
  its own next batch id) is refused, its query fails with `WriterFencedError`, and the target
  holds every source row exactly once (generation 2 starts from the decided source positions).
"""

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.consumer import PullConsumer
from ferrymq.spark.options import WriteOptions
from ferrymq.spark.sink import start_sink

from .conftest import Ferry, create_topic, produce_bulk

pytestmark = pytest.mark.spark


async def queue_bodies(servers: str, topic: str) -> dict[tuple[str, int], list[bytes]]:
    """Every queue's bodies in offset order."""
    async with PullConsumer(servers, "sink-generation-check") as consumer:
        found: dict[tuple[str, int], list[bytes]] = {}
        for queue in await consumer.queues(topic):
            end = await consumer.max_offset(queue)
            found[(queue.broker_name, queue.queue_id)] = [
                m.body for m in await consumer.fetch_range(queue, 0, end)
            ]
        return found


async def end_offsets(servers: str, topic: str) -> dict[str, Any]:
    """The topic's end offsets as startingOffsets JSON."""
    async with PullConsumer(servers, "sink-generation-check") as consumer:
        ends: dict[str, dict[str, int]] = {}
        for queue in await consumer.queues(topic):
            ends.setdefault(queue.broker_name, {})[str(queue.queue_id)] = await consumer.max_offset(
                queue
            )
        return {topic: ends}


def bodies(servers: str, topic: str) -> list[bytes]:
    return sorted(b for q in asyncio.run(queue_bodies(servers, topic)).values() for b in q)


def test_a_batch_read_of_an_empty_topic_reads_nothing(spark: Any, ferry: Ferry) -> None:
    asyncio.run(create_topic(ferry.servers, "SparkEmpty", 3))
    df = (
        spark.read.format("ferrymq")
        .option("servers", ferry.servers)
        .option("subscribe", "SparkEmpty")
        .load()
    )
    assert df.count() == 0
    assert df.select("value").collect() == []


def copy(
    spark: Any,
    ferry: Ferry,
    source: str,
    target: str,
    checkpoint: Path,
    *,
    sink_id: str,
    generation: int | None = None,
    starting: str = "earliest",
    initial: Any = None,
    trigger: dict[str, Any] | None = None,
    max_offsets: int | None = None,
) -> Any:
    """source -> target through the ferrymq sink, with the source columns (positions)."""
    reader = (
        spark.readStream.format("ferrymq")
        .option("servers", ferry.servers)
        .option("subscribe", source)
        .option("startingOffsets", starting)
        .option("includeFerryColumns", "true")
    )
    if initial is not None:
        reader = reader.option("initialOffsets", json.dumps(initial))
    if max_offsets is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    writer = (
        reader.load()
        .selectExpr(
            "value",
            "topic AS sourceTopic",
            "brokerName AS sourceBroker",
            "queueId AS sourceQueueId",
            "offset AS sourceOffset",
        )
        .writeStream.format("ferrymq")
        .option("servers", ferry.servers)
        .option("topic", target)
        .option("sinkId", sink_id)
        .option("checkpointLocation", str(checkpoint))
    )
    if generation is not None:
        writer = writer.option("generation", str(generation))
    return writer.trigger(**(trigger or {"availableNow": True})).start()


def finish(query: Any) -> None:
    assert query.awaitTermination(120), "the query did not finish"
    assert query.exception() is None, str(query.exception())[-3000:]


def test_a_new_checkpoint_under_the_same_sink_id_drops_no_batch(
    spark: Any, ferry: Ferry, tmp_path: Path
) -> None:
    async def prepare() -> list[bytes]:
        await create_topic(ferry.servers, "NewCpIn", 2)
        await create_topic(ferry.servers, "NewCpOut", 2)
        return await produce_bulk(ferry.servers, "NewCpIn", "first", 600)

    produced = asyncio.run(prepare())
    first = copy(
        spark, ferry, "NewCpIn", "NewCpOut", tmp_path / "cp1", sink_id="newcp", max_offsets=200
    )
    finish(first)
    assert len(first.recentProgress) >= 3  # batches 0, 1, 2 decided under the sink id
    assert bodies(ferry.servers, "NewCpOut") == sorted(produced)

    # the checkpoint is lost: a new one starts where the first ended; its batch ids are 0, 1, 2
    # again, and each is written (the sink numbers them under <sink id>/<the new query id>)
    ends = asyncio.run(end_offsets(ferry.servers, "NewCpIn"))
    produced += asyncio.run(produce_bulk(ferry.servers, "NewCpIn", "second", 600))
    second = copy(
        spark,
        ferry,
        "NewCpIn",
        "NewCpOut",
        tmp_path / "cp2",
        sink_id="newcp",
        starting=json.dumps(ends),
        max_offsets=200,
    )
    finish(second)
    assert len(second.recentProgress) >= 3
    assert bodies(ferry.servers, "NewCpOut") == sorted(produced)


def committed(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


@pytest.mark.timeout(300)
def test_a_zombie_of_an_older_generation_is_fenced_and_the_copy_stays_exact(
    spark: Any, ferry: Ferry, tmp_path: Path
) -> None:
    source, target, sink_id = "ZombieIn", "ZombieOut", "mirror:inc-z:0"

    async def prepare() -> list[bytes]:
        await create_topic(ferry.servers, source, 2)
        await create_topic(ferry.servers, target, 2)
        return await produce_bulk(ferry.servers, source, "a", 2_000)

    produced = asyncio.run(prepare())
    options = WriteOptions(servers=ferry.servers, sink_id=sink_id, generation=1)
    asyncio.run(start_sink(options, start={}))
    zombie = copy(
        spark,
        ferry,
        source,
        target,
        tmp_path / "gen1",
        sink_id=sink_id,
        generation=1,
        trigger={"processingTime": "200 milliseconds"},
        max_offsets=100,
    )
    new_owner: Any = None
    try:
        deadline = time.monotonic() + 120
        while committed(tmp_path / "gen1") < 3:
            assert zombie.isActive, str(zombie.exception())[-3000:]
            assert time.monotonic() < deadline, "generation 1 committed no micro-batch"
            time.sleep(0.1)
        # the task moves: its new owner (generation 2, another machine: no checkpoint) fences,
        # finishes what generation 1 decided, and starts from the decided positions
        state = asyncio.run(
            start_sink(WriteOptions(servers=ferry.servers, sink_id=sink_id, generation=2))
        )
        assert state.generation == 2
        assert state.positions
        produced += asyncio.run(produce_bulk(ferry.servers, source, "b", 500))
        new_owner = copy(
            spark,
            ferry,
            source,
            target,
            tmp_path / "gen2",
            sink_id=sink_id,
            generation=2,
            initial=state.positions,
            max_offsets=400,
        )
        finish(new_owner)
        # generation 1 planned a different next batch: its decide is refused, its query stops
        deadline = time.monotonic() + 60
        while zombie.isActive:
            assert time.monotonic() < deadline, "generation 1 was never refused"
            time.sleep(0.1)
        error = str(zombie.exception())
        assert "WriterFencedError" in error, error[-3000:]
        assert "generation 2 owns the sink" in error, error[-3000:]
        assert bodies(ferry.servers, target) == sorted(produced)
        # the zombie cannot start again either
        with pytest.raises(Exception, match="generation 2 owns the sink"):
            asyncio.run(start_sink(options))
    finally:
        for query in (zombie, new_owner):
            if query is not None and query.isActive:
                query.stop()
