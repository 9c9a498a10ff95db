"""Issue 20 with real processes: a streaming query reads a two-group topic exactly once while
one group leaves the route and returns, and the other group's queue count grows.

A `ferry namesrv` with a 2 s route expiry and two `ferry broker` processes, broker-a and
broker-b, each with its own store directory, hold a topic of 4 queues per group. A streaming
query (real Spark, checkpointed) reads it into Parquet while a producer sends unique bodies. The
test kills -9 broker-b (its only replica) and keeps it down past the route expiry while the query
reads what is sent to broker-a (its checkpoint keeps broker-b's offsets), restarts broker-b from
its store directory, grows broker-a to 8 queues, sends more, lets the query catch up, and runs it
once more from its checkpoint with AvailableNow. The Parquet output must hold every body exactly
once: with offsets keyed by route position, broker-b's queues shifted onto broker-a's new ones.
"""

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.spark.plan import stable_partition

from ..system.procs import Server, start
from .conftest import produce_bulk

pytestmark = pytest.mark.spark

TOPIC = "GroupsMove"
EXPIRY_S = 2
DOWN_S = 2 * EXPIRY_S + 1


def start_broker(root: Path, namesrv: Server, name: str) -> Server:
    return start(
        [
            "broker",
            "--broker-name",
            name,
            "--listen",
            "127.0.0.1:0",
            "--namesrv",
            namesrv.addr,
            "--store-dir",
            str(root / name),
            "--register-name-server-period",
            "250",
            "--broker-timeout-millis",
            str(EXPIRY_S * 1000),
        ],
        root,
        name,
    )


async def routed_queues(servers: str) -> dict[str, int]:
    """Readable queues per broker group in the topic's route now."""
    async with AdminClient(servers) as admin:
        route = await admin.route(TOPIC)
    if route is None:
        return {}
    groups = {b.broker_name for b in route.broker_datas}
    return {q.broker_name: q.read_queue_nums for q in route.queue_datas if q.broker_name in groups}


def wait_route(servers: str, wanted: dict[str, int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (now := asyncio.run(routed_queues(servers))) != wanted:
        assert time.monotonic() < deadline, f"the route stays {now}, not {wanted}"
        time.sleep(0.1)


def committed(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def committed_end(checkpoint: Path) -> Any:
    """The source offsets the last committed micro-batch ended at (None before the first)."""
    done = committed(checkpoint)
    if not done:
        return None
    return json.loads((checkpoint / "offsets" / str(done - 1)).read_text().splitlines()[2])


async def topic_end(servers: str) -> dict[str, dict[str, dict[str, int]]]:
    """Every routed queue's max offset, as checkpoint offsets JSON."""
    async with PullConsumer(servers, "groups-check") as consumer:
        end: dict[str, dict[str, int]] = {}
        for queue in await consumer.queues(TOPIC):
            offset = await consumer.max_offset(queue)
            end.setdefault(queue.broker_name, {})[str(queue.queue_id)] = offset
    return {TOPIC: end}


def wait_caught_up(query: Any, checkpoint: Path, servers: str, timeout: float = 90.0) -> None:
    """Until the query committed what the route holds (it must keep running)."""
    deadline = time.monotonic() + timeout
    end = asyncio.run(topic_end(servers))
    while (done := committed_end(checkpoint)) is None or any(
        done[TOPIC].get(broker, {}).get(queue) != offset
        for broker, queues in end[TOPIC].items()
        for queue, offset in queues.items()
    ):
        assert query.isActive, str(query.exception())[-3000:]
        assert time.monotonic() < deadline, f"the query stays at {done}, not {end}"
        time.sleep(0.1)


def start_query(spark: Any, servers: str, out: Path, checkpoint: Path, **trigger: Any) -> Any:
    return (
        spark.readStream.format("ferrymq")
        .option("servers", servers)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "400")
        .option("failoverTimeoutMs", "3000")
        .option("includeFerryColumns", "true")
        .load()
        .selectExpr("value", "partition", "offset", "brokerName", "queueId")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def check_alive_or_retryable(query: Any) -> bool:
    """Whether the query still runs; a stopped one must have failed retryably."""
    if query.isActive:
        return True
    error = query.exception()
    assert error is not None, "the query stopped without an error"
    assert "RetryableQueryError" in str(error), str(error)[-3000:]
    return False


@pytest.mark.timeout(240)
def test_a_group_leaving_and_returning_and_a_group_growing_lose_and_repeat_nothing(
    spark: Any, tmp_path: Path
) -> None:
    namesrv = start(
        ["namesrv", "--listen", "127.0.0.1:0", "--broker-timeout", str(EXPIRY_S)],
        tmp_path,
        "namesrv",
    )
    servers = namesrv.addr
    brokers = {name: start_broker(tmp_path, namesrv, name) for name in ("broker-a", "broker-b")}
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query: Any = None
    try:

        async def create() -> None:
            async with AdminClient(servers) as admin:
                await admin.create_topic(TOPIC, queues=4)

        asyncio.run(create())
        wait_route(servers, {"broker-a": 4, "broker-b": 4})
        produced = asyncio.run(produce_bulk(servers, TOPIC, "first", 2_000))

        query = start_query(spark, servers, out, checkpoint, processingTime="250 milliseconds")
        wait_caught_up(query, checkpoint, servers)
        before = committed_end(checkpoint)

        # broker-b, all of its replicas, gone for longer than the route expiry, while the query
        # plans micro-batches of broker-a's new messages without it
        brokers["broker-b"].kill()
        killed_at = time.monotonic()
        wait_route(servers, {"broker-a": 4})
        produced += asyncio.run(produce_bulk(servers, TOPIC, "alone", 1_200))
        wait_caught_up(query, checkpoint, servers)
        while time.monotonic() - killed_at < DOWN_S:
            assert query.isActive, str(query.exception())[-3000:]
            time.sleep(0.1)
        assert asyncio.run(routed_queues(servers)) == {"broker-a": 4}
        kept = committed_end(checkpoint)
        assert kept[TOPIC]["broker-b"] == before[TOPIC]["broker-b"], "broker-b's offsets moved"
        assert kept[TOPIC]["broker-a"] != before[TOPIC]["broker-a"]

        # broker-b back from its store; broker-a grows to 8 queues
        brokers["broker-b"] = start_broker(tmp_path, namesrv, "broker-b")
        wait_route(servers, {"broker-a": 4, "broker-b": 4})

        async def grow() -> None:
            async with AdminClient(servers) as admin:
                await admin.create_topic(TOPIC, queues=8, broker_name="broker-a")

        asyncio.run(grow())
        wait_route(servers, {"broker-a": 8, "broker-b": 4})
        produced += asyncio.run(produce_bulk(servers, TOPIC, "grown", 2_400))
        wait_caught_up(query, checkpoint, servers)
        query.stop()

        # and once more from the checkpoint, as AvailableNow (again if it failed retryably)
        for _ in range(3):
            query = start_query(spark, servers, out, checkpoint, availableNow=True)
            assert query.awaitTermination(120), "the AvailableNow run did not finish"
            if query.exception() is None:
                break
            check_alive_or_retryable(query)
        assert query.exception() is None, str(query.exception())[-3000:]

        rows = spark.read.parquet(str(out)).collect()
        values = [r["value"] for r in rows]
        assert len(values) == len(set(values)), "a body was read twice"
        assert sorted(values) == sorted(produced), "the sink is not every produced body"
        queues = {(r["brokerName"], r["queueId"]) for r in rows}
        assert queues == {("broker-a", i) for i in range(8)} | {("broker-b", i) for i in range(4)}
        assert all(r["partition"] == stable_partition(r["brokerName"], r["queueId"]) for r in rows)
        assert len({(r["partition"], r["offset"]) for r in rows}) == len(rows)
    finally:
        if query is not None and query.isActive:
            query.stop()
        for broker in brokers.values():
            broker.stop()
        namesrv.stop()
