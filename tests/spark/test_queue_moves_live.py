"""Issue 20 section 4 with real processes and real Spark: a streaming query reads a topic
exactly once while one of its queues moves to another broker group.

A `ferry controller`, a `ferry namesrv` and two `ferry broker` groups in controller mode hold a
topic of 2 queues per group. A streaming query (checkpointed) reads it into Parquet; broker-a's
queue 1 moves to broker-b between micro-batches (the query keeps running), more is sent, and
the query catches up. The output holds every body once, each row under the queue's own name
(broker-a, 1) with its stable partition, offsets contiguous per queue across the move.
"""

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.cmd.measure import free_port
from ferrymq.spark.plan import stable_partition
from ferrymq.wire.queuemap import decode_queue_map
from ferrymq.wire.topics import ControllerReassignRequestHeader

from ..system.procs import Server, start
from .conftest import produce_bulk
from .test_route_changes_live import committed_end, start_query, wait_caught_up

pytestmark = pytest.mark.spark

TOPIC = "GroupsMove"  # start_query and wait_caught_up read this topic


def _cluster(root: Path) -> list[Server]:
    servers: list[Server] = []
    try:
        namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], root, "namesrv")
        servers.append(namesrv)
        controller_addr = f"127.0.0.1:{free_port()}"
        servers.append(
            start(
                [
                    "controller",
                    "--id",
                    "n1",
                    "--peers",
                    f"n1={controller_addr}",
                    "--listen",
                    controller_addr,
                    "--data-dir",
                    str(root / "controller"),
                ],
                root,
                "controller",
            )
        )
        for name in ("broker-a", "broker-b"):
            servers.append(  # noqa: PERF401 - each started before the next
                start(
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
                        "--controller-mode",
                        "--controller",
                        controller_addr,
                    ],
                    root,
                    name,
                )
            )
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


async def _move(servers: str) -> int:
    async with AdminClient(servers) as admin:
        body = await admin.reassign(
            ControllerReassignRequestHeader(
                action="move",
                topic=TOPIC,
                broker_name="broker-a",
                queue_id=1,
                to_broker_name="broker-b",
            )
        )
        deadline = time.monotonic() + 30
        while (progress := (await admin.move_progress(body.moves))[0]).state != "done":
            assert time.monotonic() < deadline, "the move did not finish"
            await asyncio.sleep(0.1)
        assert progress.end_offset is not None
        # and until routes show it (producers then write to the queue again)
        while True:
            route = await admin.route(TOPIC)
            text = route.ferry_queue_map if route is not None else None
            queue = decode_queue_map(text).logical("broker-a", 1) if text else None
            if queue is not None and queue.moving is None and len(queue.segments) == 2:
                return progress.end_offset
            assert time.monotonic() < deadline, "the routes do not show the move"
            await asyncio.sleep(0.1)


@pytest.mark.timeout(240)
def test_a_stream_reads_a_moving_queue_exactly_once(spark: Any, tmp_path: Path) -> None:
    processes = _cluster(tmp_path)
    servers = processes[0].addr
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    query: Any = None
    try:

        async def create() -> None:
            async with AdminClient(servers) as admin:
                await admin.create_topic(TOPIC, queues=2)

        asyncio.run(create())
        produced = asyncio.run(produce_bulk(servers, TOPIC, "before", 1_600))
        query = start_query(spark, servers, out, checkpoint, processingTime="250 milliseconds")
        wait_caught_up(query, checkpoint, servers)
        before = committed_end(checkpoint)

        end = asyncio.run(_move(servers))
        assert end == before[TOPIC]["broker-a"]["1"]  # what the query had read of it
        produced += asyncio.run(produce_bulk(servers, TOPIC, "after", 1_600))
        wait_caught_up(query, checkpoint, servers)
        assert query.isActive, str(query.exception())[-3000:]
        after = committed_end(checkpoint)
        assert after[TOPIC]["broker-a"]["1"] > end  # read on in broker-b's new queue
        query.stop()

        rows = spark.read.parquet(str(out)).collect()
        values = [r["value"] for r in rows]
        assert len(values) == len(set(values)), "a body was read twice"
        assert sorted(values) == sorted(produced), "the sink is not every produced body"
        queues = {(r["brokerName"], r["queueId"]) for r in rows}
        assert queues == {("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)}
        assert all(r["partition"] == stable_partition(r["brokerName"], r["queueId"]) for r in rows)
        moved = sorted(
            r["offset"] for r in rows if (r["brokerName"], r["queueId"]) == ("broker-a", 1)
        )
        assert moved == list(range(len(moved)))
    finally:
        if query is not None and query.isActive:
            query.stop()
        for process in reversed(processes):
            process.stop()
