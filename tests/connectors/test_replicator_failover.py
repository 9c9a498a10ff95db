"""FerrymqReplicator between two clusters through a master failover and a driver kill.

Two clusters of real processes, each with its own NameServer: the source in controller mode
(one group of three replicas, the controller embedded in the NameServer), the target a classic
single broker. A producer keeps sending to each source queue in turn while a replicator task runs
in its own driver process (generation 1). The test kills -9 the source group's master (the
controller elects another; the task's reads ride out the failover, or its query fails
retryably), then, once copies flow again, kills -9 the whole driver, JVM included, and starts
the task again in another process (generation 2) on a new checkpoint, as when a task moves to a
worker without the old one's disk. The target topic then holds each message of the source once,
in the source's order, queue by queue.
"""

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.connect.plugin import TaskContext
from ferrymq.connectors.replicator import FerrymqReplicator
from ferrymq.errors import FerryError, SendOutcomeUnknownError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

from .conftest import start_driver, stop_driver

pytestmark = pytest.mark.spark

log = logging.getLogger(__name__)

TOPIC = "Mirrored"
QUEUES = 4


async def master(admin: AdminClient, *, not_addr: str = "", timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        route = await admin.route(TOPIC)
        for broker in route.broker_datas if route is not None else []:
            address = broker.broker_addrs.get(0)
            if address and address != not_addr:
                return address
        assert time.monotonic() < deadline, "no master in the route"
        await asyncio.sleep(0.1)


async def in_sync(admin: AdminClient, replicas: int) -> str:
    """The master once every replica is in its SyncStateSet."""
    address = await master(admin)
    deadline = time.monotonic() + 30
    async with RpcClient() as client:
        while True:
            request = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO)
            response = await client.call(address, request, 3)
            members = decode_body(response.body, KVTable).table.get("syncStateSet", "")
            if members.count(",") >= replicas - 1:
                return address
            assert time.monotonic() < deadline, f"the SyncStateSet stays {members}"
            await asyncio.sleep(0.1)


async def by_queue(servers: str) -> dict[tuple[str, int], list[bytes]]:
    """Each queue's bodies, in offset order (none for a topic not routed yet)."""
    async with PullConsumer(servers, "mirror-check") as consumer:
        try:
            queues = await consumer.queues(TOPIC)
        except FerryError:
            return {}
        found: dict[tuple[str, int], list[bytes]] = {}
        for queue in queues:
            end = await consumer.max_offset(queue)
            messages = await consumer.fetch_range(queue, 0, end)
            assert [m.queue_offset for m in messages] == list(range(end)), queue
            found[(queue.broker_name, queue.queue_id)] = [m.body for m in messages]
        return found


async def copies(servers: str) -> int:
    try:
        return sum(len(q) for q in (await by_queue(servers)).values())
    except FerryError:  # the target's broker is busy or the route is moving: count later
        return -1


def read_up_to(query: Any) -> Any:
    """The source offsets the query's last completed micro-batch ended at."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return None
    end = progress["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else end


@pytest.mark.timeout(300)
def test_the_replica_holds_every_message_once_in_order_through_failover_and_a_driver_kill(
    spark: Any, tmp_path: Path
) -> None:
    source_cluster = ProcessCluster(
        UpConfig(data_dir=tmp_path / "dc1", replicas=3, controllers=1, embedded_controller=True)
    )
    target_cluster = ProcessCluster(UpConfig(data_dir=tmp_path / "dc2", replicas=1, controllers=0))
    runner = asyncio.Runner()
    driver = None
    query: Any = None
    acked: list[bytes] = []
    at_kill: list[int] = []
    started = time.monotonic()
    try:
        runner.run(source_cluster.start())
        runner.run(target_cluster.start())
        source, target = source_cluster.namesrv_addr, target_cluster.namesrv_addr

        async def prepare() -> str:
            async with AdminClient(source) as admin:
                await admin.create_topic(TOPIC, queues=QUEUES)
                return await in_sync(admin, 3)

        old_master = runner.run(prepare())
        config = {
            "name": "dc1 to dc2",
            "connector.class": "FerrymqReplicator",
            "topics": TOPIC,
            "source.servers": source,
            "target.servers": target,
            "trigger.interval.ms": "300",
        }

        async def scenario() -> None:
            nonlocal driver
            stop = asyncio.Event()

            async def keep_sending() -> None:
                async with Producer(source, "mirror-tests", send_timeout=2.0) as producer:
                    queues = sorted((await producer.routes.get(TOPIC)).write_queues)
                    turn = 0
                    while not stop.is_set():
                        body = f"m-{turn:06d}".encode()
                        try:
                            await producer.send(
                                TOPIC,
                                body,
                                keys=[f"k{turn}"],
                                tags=f"t{turn % 2}",
                                properties={"seq": str(turn)},
                                queue=queues[turn % QUEUES],
                            )
                        except SendOutcomeUnknownError:
                            pass
                        except FerryError:
                            await asyncio.sleep(0.05)
                        else:
                            acked.append(body)
                        turn += 1
                        await asyncio.sleep(0.002)

            sending = asyncio.create_task(keep_sending())
            driver = start_driver(
                tmp_path / "driver.log",
                plugin="FerrymqReplicator",
                config=config,
                servers=target,
                connector="dc1 to dc2",
                incarnation="inc-1",
                tasks=[{"task": 0, "generation": 1, "checkpoint": str(tmp_path / "worker-1")}],
            )
            deadline = time.monotonic() + 150
            while await copies(target) < 300:
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-4000:]
                assert time.monotonic() < deadline, "the replicator copied nothing"
                await asyncio.sleep(0.2)
            victim = next(c for c in source_cluster.brokers.values() if c.addr == old_master)
            victim.kill()
            async with AdminClient(source) as admin:
                await master(admin, not_addr=old_master, timeout=60)
            at_failover = await copies(target)
            # copies flow again (unless the query failed retryably, which ends the driver)
            while driver.poll() is None and await copies(target) < at_failover + 300:
                assert time.monotonic() < deadline, "the replicator stopped after the failover"
                await asyncio.sleep(0.2)
            log.warning(
                "after the failover: %d copies, the driver %s",
                await copies(target),
                "running" if driver.poll() is None else f"exited {driver.returncode}",
            )
            stop_driver(driver)  # kill -9 of the whole driver, JVM included, mid-stream
            at_kill.append(await copies(target))
            sent = len(acked)
            while len(acked) < sent + 400:  # a backlog for the next owner
                assert time.monotonic() < deadline, "the source took no more messages"
                await asyncio.sleep(0.1)
            stop.set()
            await sending

        runner.run(scenario())
        source_queues = runner.run(by_queue(source))
        # generation 2, on a worker without the first one's checkpoint
        context = TaskContext(
            "dc1 to dc2", "inc-1", 0, 2, "tests", target, str(tmp_path / "worker-2")
        )
        query = FerrymqReplicator().build(spark, config, context)
        total = sum(len(q) for q in source_queues.values())
        ends: dict[str, dict[str, dict[str, int]]] = {TOPIC: {}}
        for (broker, queue_id), bodies in source_queues.items():
            ends[TOPIC].setdefault(broker, {})[str(queue_id)] = len(bodies)
        deadline = time.monotonic() + 120
        while read_up_to(query) != ends:  # the query has read and committed the whole source
            assert query.isActive, str(query.exception())[-4000:]
            assert time.monotonic() < deadline, f"{runner.run(copies(target))} of {total} copied"
            time.sleep(0.3)
        target_queues = runner.run(by_queue(target))
        assert not set(acked) - {b for q in source_queues.values() for b in q}, "acked but lost"
        assert len(acked) >= 600
        # the same shape (broker-a, 4 queues): each queue the same messages in the same order
        assert sorted(target_queues) == sorted(source_queues)
        for queue, bodies in source_queues.items():
            assert target_queues[queue] == bodies, queue
        log.warning(
            "%d messages mirrored exactly once in %.0f s (%d by generation 2)",
            total,
            time.monotonic() - started,
            total - at_kill[0],
        )
    finally:
        if query is not None and query.isActive:
            query.stop()
        if driver is not None and driver.poll() is None:
            stop_driver(driver)
        runner.run(target_cluster.stop())
        runner.run(source_cluster.stop())
        runner.close()
