"""FerrymqReplicator: the queue map, the sink id, and a task across checkpoints and owners.

In process, on the session's ferrymq cluster and SparkSession (conftest): a task copies a topic
(every source queue into the target queue of its id, in order, with keys, tags and properties);
its checkpoint is lost (a new worker): the task resumes from the decided positions, nothing
dropped or repeated; its older owner cannot start again (fenced); a stale checkpoint (the task
ran elsewhere since) is dropped; an offsets reset copies everything once more, once, however
many checkpoints the change is passed to.
"""

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.connect.plugin import TaskContext
from ferrymq.connect.records import OffsetEntry, OffsetsPut
from ferrymq.connectors.replicator import FerrymqReplicator, queue_map, sink_id_of
from ferrymq.model import MessageQueue
from ferrymq.spark.plan import stable_partition

from ..spark.conftest import Ferry
from .conftest import create_topic, run_until


def mq(broker: str, queue_id: int, topic: str = "t") -> MessageQueue:
    return MessageQueue(topic, broker, queue_id)


def test_the_queue_map_keeps_queue_ids_when_the_shapes_match() -> None:
    source = [mq("dc1-a", i) for i in range(4)] + [mq("dc1-b", i) for i in range(2)]
    same = [mq("dc2-a", i) for i in range(4)] + [mq("dc2-b", i) for i in range(2)]
    assert queue_map(source, same) == {
        **{f"dc1-a:{i}": stable_partition("dc2-a", i) for i in range(4)},
        **{f"dc1-b:{i}": stable_partition("dc2-b", i) for i in range(2)},
    }
    # another shape: the source queues in route order dealt over the target's, each to one
    other = [mq("x", i) for i in range(4)]
    dealt = queue_map(source, other)
    order = ["dc1-a:0", "dc1-a:1", "dc1-a:2", "dc1-a:3", "dc1-b:0", "dc1-b:1"]
    assert [dealt[q] for q in order] == [stable_partition("x", i % 4) for i in range(6)]
    assert queue_map(source, []) == {}


def test_the_sink_id_names_connector_incarnation_and_task_in_what_a_sink_id_holds() -> None:
    context = TaskContext("my mirror/eu", "inc 1", 3, 7, "c", "127.0.0.1:1", "/tmp/x")
    assert sink_id_of(context) == "my_mirror_eu:inc_1:3"
    long = replace(context, connector="m" * 200)
    sink_id = sink_id_of(long)
    assert len(sink_id) <= 128
    assert sink_id.endswith(":3")
    assert sink_id != sink_id_of(replace(long, connector="m" * 199 + "n"))


def test_offsets_edits_are_checked() -> None:
    plugin = FerrymqReplicator()
    config = {"topics": "a,b"}
    good = OffsetEntry({"topic": "a", "broker": "broker-a", "queue": 1}, {"offset": 5})
    assert plugin.check_offsets(config, [good]) == []
    assert plugin.check_offsets(config, [OffsetEntry(good.partition, None)]) == []
    bad_topic = OffsetEntry({"topic": "c", "broker": "broker-a", "queue": 1}, {"offset": 5})
    assert "not one of the connector's topics" in plugin.check_offsets(config, [bad_topic])[0]
    bad_shape = OffsetEntry({"table": "a"}, {"offset": 5})
    assert "a partition is" in plugin.check_offsets(config, [bad_shape])[0]
    bad_offset = OffsetEntry(good.partition, {"offset": -1})
    assert "offset" in plugin.check_offsets(config, [bad_offset])[0]


SOURCE, TARGET = "RepIn", "RepIn-copy"


async def produce(servers: str, prefix: str, count: int) -> None:
    """`count` messages over the four queues, in order per queue, with keys, tags, properties."""
    async with Producer(servers, "replicator-tests") as producer:
        queues = sorted((await producer.routes.get(SOURCE)).write_queues)
        for i in range(count):
            await producer.send(
                SOURCE,
                f"{prefix}-{i:05d}".encode(),
                tags=f"tag{i % 3}",
                keys=[f"key-{i}", "k b"],
                properties={"n": str(i), "origin": prefix},
                queue=queues[i % len(queues)],
            )


async def by_queue(servers: str, topic: str) -> dict[tuple[str, int], list[Message]]:
    async with PullConsumer(servers, "replicator-check") as consumer:
        found: dict[tuple[str, int], list[Message]] = {}
        for queue in await consumer.queues(topic):
            end = await consumer.max_offset(queue)
            found[(queue.broker_name, queue.queue_id)] = await consumer.fetch_range(queue, 0, end)
        return found


def count(ferry: Ferry, topic: str) -> int:
    return sum(len(m) for m in asyncio.run(by_queue(ferry.servers, topic)).values())


def context(tmp_path: Path, ferry: Ferry, checkpoint: str, generation: int) -> TaskContext:
    return TaskContext(
        "mirror one", "inc-1", 0, generation, "tests", ferry.servers, str(tmp_path / checkpoint)
    )


def run(spark: Any, ferry: Ferry, tmp_path: Path, checkpoint: str, generation: int, total: int,
        offsets: OffsetsPut | None = None) -> None:  # fmt: skip
    task = context(tmp_path, ferry, checkpoint, generation)
    if offsets is not None:
        task = replace(task, extra={"offsets": offsets})
    config = {
        "name": "mirror one",
        "connector.class": "FerrymqReplicator",
        "topics": SOURCE,
        "target.topic.format": "${topic}-copy",
        "trigger.interval.ms": "200",
    }
    query = FerrymqReplicator().build(spark, config, task)
    try:
        ends = asyncio.run(end_offsets(ferry.servers))
        run_until(query, "the source's end", lambda: read_up_to(query) == ends)
        assert count(ferry, TARGET) == total
    finally:
        query.stop()


async def end_offsets(servers: str) -> dict[str, Any]:
    async with PullConsumer(servers, "replicator-check") as consumer:
        ends: dict[str, dict[str, int]] = {}
        for queue in await consumer.queues(SOURCE):
            ends.setdefault(queue.broker_name, {})[str(queue.queue_id)] = await consumer.max_offset(
                queue
            )
        return {SOURCE: ends}


def read_up_to(query: Any) -> Any:
    """The source offsets the query's last completed micro-batch ended at."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return None
    end = progress["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else end


@pytest.mark.spark
@pytest.mark.timeout(400)
def test_a_task_on_a_new_checkpoint_resumes_from_the_decided_positions(
    spark: Any, ferry: Ferry, tmp_path: Path
) -> None:
    asyncio.run(create_topic(ferry.servers, SOURCE, 4))
    asyncio.run(produce(ferry.servers, "a", 400))
    run(spark, ferry, tmp_path, "worker-1", 1, 400)
    source = asyncio.run(by_queue(ferry.servers, SOURCE))
    copied = asyncio.run(by_queue(ferry.servers, TARGET))
    assert sorted(copied) == sorted(source)  # the same shape: broker-a, 4 queues
    for queue, messages in source.items():
        copies = copied[queue]
        assert [m.body for m in copies] == [m.body for m in messages], queue
        for original, copy in zip(messages, copies, strict=True):
            assert (copy.keys, copy.tags) == (original.keys, original.tags)
            assert {k: v for k, v in copy.properties.items() if k in ("n", "origin")} == {
                "n": original.properties["n"],
                "origin": "a",
            }

    # the task moves to a worker without its checkpoint (generation 2): it resumes where the
    # decisions say; before, its batch ids 0, 1, ... met worker-1's decided batches
    asyncio.run(produce(ferry.servers, "b", 200))
    run(spark, ferry, tmp_path, "worker-2", 2, 600)

    # the old owner cannot start again
    with pytest.raises(Exception, match="generation 2 owns the sink"):
        FerrymqReplicator().build(
            spark,
            {"name": "mirror one", "topics": SOURCE, "target.topic.format": "${topic}-copy"},
            context(tmp_path, ferry, "worker-1", 1),
        )

    # back on worker-1 (generation 3): its checkpoint is stale (worker-2 copied since): dropped
    asyncio.run(produce(ferry.servers, "c", 100))
    run(spark, ferry, tmp_path, "worker-1", 3, 700)
    assert (tmp_path / "worker-1" / "metadata").exists()

    # DELETE /offsets: the task starts over from earliest, once, whatever checkpoint it is on
    reset = OffsetsPut("mirror one", "inc-1", "req-1", None)
    run(spark, ferry, tmp_path, "after-reset", 3, 1400, reset)
    asyncio.run(produce(ferry.servers, "d", 40))
    run(spark, ferry, tmp_path, "after-reset-elsewhere", 4, 1440, reset)

    bodies = sorted(
        m.body for q in asyncio.run(by_queue(ferry.servers, TARGET)).values() for m in q
    )
    source_bodies = sorted(
        m.body for q in asyncio.run(by_queue(ferry.servers, SOURCE)).values() for m in q
    )
    first_700 = [b for b in source_bodies if not b.startswith(b"d-")]
    assert bodies == sorted(first_700 * 2 + [b for b in source_bodies if b.startswith(b"d-")])
