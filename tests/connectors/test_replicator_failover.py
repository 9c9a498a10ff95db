"""FerrymqReplicator through real Connect workers across a source master failover and a kill -9.

Two clusters as `ferry up` starts them (`ProcessCluster`), each with its own NameServer: the
source in controller mode (one group of three replicas, the controller embedded in the
NameServer), the target a classic single broker with two `ferry connect worker` processes (each
with its own store directory: a task that moves finds no checkpoint, as on a worker without the
old one's disk). The replicator is created over REST with only `source.servers` set (the target
is the workers' own cluster) and two topics, so two tasks, one per worker: the mirrored topic's
and a small side topic's, which keeps the other worker's Spark session up (a task that moves
then waits for no JVM start, as in a cluster whose workers all run tasks).

While a producer sends to each source queue in turn, the test kills -9 the source group's
master (the controller elects another; the task's reads ride it out), then the whole process
tree of the worker running the mirrored topic's task (Python, Spark's JVM and its Python
workers). The task runs on the other worker under a higher generation, from the positions
decided at the target. The target topic then holds each message of the source once, in the
source's order, queue by queue, and the task is RUNNING on the other worker.
"""

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FerryError, SendOutcomeUnknownError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

from ..spark.conftest import kill_tree, spark_env
from ..system.connect_cluster import SMALL_LOG, cluster_view, leader, rest, start_worker, url

pytestmark = [pytest.mark.system, pytest.mark.spark]

log = logging.getLogger(__name__)

TOPIC = "Mirrored"
QUEUES = 4
SIDE = "Side"
"""A second topic, so a second task: it keeps the other worker's Spark session up."""
NAME = "mirror"
MIRROR, SIDE_TASK = 0, 1
"""Task ids: the replicator deals its topics in name order over `tasks.max` tasks."""


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


async def by_queue(servers: str, topic: str = TOPIC) -> dict[tuple[str, int], list[bytes]]:
    """Each queue's bodies, in offset order."""
    async with PullConsumer(servers, "mirror-check") as consumer:
        found: dict[tuple[str, int], list[bytes]] = {}
        for queue in await consumer.queues(topic):
            end = await consumer.max_offset(queue)
            messages = await consumer.fetch_range(queue, 0, end)
            assert [m.queue_offset for m in messages] == list(range(end)), queue
            found[(queue.broker_name, queue.queue_id)] = [m.body for m in messages]
        return found


async def sizes(servers: str) -> dict[tuple[str, int], int]:
    """Each queue's end offset; none while the topic is not routed or a broker is busy."""
    try:
        async with PullConsumer(servers, "mirror-check") as consumer:
            queues = await consumer.queues(TOPIC)
            return {(q.broker_name, q.queue_id): await consumer.max_offset(q) for q in queues}
    except FerryError:
        return {}


async def task_status(target: ProcessCluster, task_id: int = MIRROR) -> dict[str, Any]:
    """A task's entry of GET /connectors/mirror/status, asked of a running worker (no task may
    have failed)."""
    base = next(url(target, w) for w, c in target.workers.items() if c.running)
    answer = await rest(base, "GET", f"/connectors/{NAME}/status", timeout=5)
    assert answer.status_code == 200, answer.text
    tasks: list[dict[str, Any]] = answer.json()["tasks"]
    for task in tasks:
        assert task["state"] != "FAILED", task.get("trace")
    return next(task for task in tasks if task["id"] == task_id)


async def running_on(target: ProcessCluster, task_id: int, after: int = 0) -> tuple[str, int]:
    """Wait until a task is RUNNING with a generation above `after`: (worker, generation)."""
    deadline = time.monotonic() + 150
    while True:
        task = await task_status(target, task_id)
        generation = int(task["ferrymq"].get("generation", 0))
        if task["state"] == "RUNNING" and generation > after:
            return str(task["worker_id"]), generation
        assert time.monotonic() < deadline, f"not running past generation {after}: {task}"
        await asyncio.sleep(0.25)


async def copied(target: ProcessCluster, at_least: int, what: str, timeout: float = 120) -> int:
    """Wait until the target topic holds `at_least` messages (the task must not fail)."""
    deadline = time.monotonic() + timeout
    while (count := sum((await sizes(target.namesrv_addr)).values())) < at_least:
        assert time.monotonic() < deadline, f"{what}: {count} of {at_least} copied"
        await task_status(target)
        await asyncio.sleep(0.25)
    return count


@pytest.mark.timeout(420)
async def test_the_replica_holds_every_message_once_in_order_through_failover_and_a_worker_kill(
    tmp_path: Path,
) -> None:
    spark_env()  # the workers' Spark processes run this Python and bind loopback only
    source_cluster = ProcessCluster(
        UpConfig(
            data_dir=tmp_path / "dc1",
            replicas=3,
            controllers=1,
            embedded_controller=True,
            broker_flags=SMALL_LOG,  # the killed master's recovery reads 16 MiB, not 1 GiB
        )
    )
    target = ProcessCluster(
        UpConfig(data_dir=tmp_path / "dc2", replicas=1, controllers=0, broker_flags=SMALL_LOG)
    )
    acked: list[bytes] = []
    stop = asyncio.Event()
    started = time.monotonic()

    async def keep_sending() -> None:
        async with Producer(source, "mirror-tests", send_timeout=2.0) as producer:
            queues = sorted((await producer.routes.get(TOPIC)).write_queues)
            for turn in range(100_000):  # bounded; stopped long before
                if stop.is_set():
                    return
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
                await asyncio.sleep(0.002)

    sending: asyncio.Task[None] | None = None
    try:
        async with asyncio.timeout(400):  # a hang fails naming the await
            await asyncio.gather(source_cluster.start(), target.start())
            await asyncio.gather(
                *(
                    start_worker(
                        target, w, extra=("--store-path-root-dir", str(tmp_path / f"store-{w}"))
                    )
                    for w in ("w1", "w2")
                )
            )
            source = source_cluster.namesrv_addr
            async with AdminClient(source) as admin:
                await admin.create_topic(TOPIC, queues=QUEUES)
                await admin.create_topic(SIDE, queues=1)
                old_master = await in_sync(admin, 3)
            async with Producer(source, "mirror-tests") as producer:
                for turn in range(5):
                    await producer.send(SIDE, f"side-{turn}".encode())
            sending = asyncio.create_task(keep_sending())
            config = {
                "connector.class": "FerrymqReplicator",
                "topics": f"{TOPIC},{SIDE}",
                "tasks.max": "2",
                "source.servers": source,
                "trigger.interval.ms": "300",
            }
            # both workers in the group first: the two new tasks go one to each
            base = url(target, await leader(target))
            deadline = time.monotonic() + 30
            while len((await rest(base, "GET", "/cluster")).json()["members"]) < 2:
                assert time.monotonic() < deadline, await cluster_view(target, "w1")
                await asyncio.sleep(0.1)
            answer = await rest(base, "POST", "/connectors", {"name": NAME, "config": config})
            assert answer.status_code == 201, answer.text
            while len(tasks := (await rest(base, "GET", f"/connectors/{NAME}/tasks")).json()) < 2:
                assert time.monotonic() < deadline, tasks
                await asyncio.sleep(0.1)
            dealt = {t["id"]["task"]: t["config"]["topics"] for t in tasks}
            assert dealt == {MIRROR: TOPIC, SIDE_TASK: SIDE}, dealt
            owner, generation = await running_on(target, MIRROR)
            other = (await running_on(target, SIDE_TASK))[0]
            assert other != owner, "both tasks on one worker"
            await copied(target, 300, "before the failover")
            log.warning("copying on %s: %.1f s", owner, time.monotonic() - started)

            # kill -9 of the source group's master mid-stream
            next(c for c in source_cluster.brokers.values() if c.addr == old_master).kill()
            async with AdminClient(source) as admin:
                await master(admin, not_addr=old_master, timeout=60)
            at_failover = sum((await sizes(target.namesrv_addr)).values())
            await copied(target, at_failover + 300, "after the failover")
            log.warning("source failover done: %.1f s", time.monotonic() - started)

            # kill -9 of the owner's whole process tree (Python, JVM, Spark's Python workers)
            kill_tree(target.workers[owner].pid)
            await target.workers[owner].process.wait()
            at_kill = sum((await sizes(target.namesrv_addr)).values())
            killed = owner
            owner, generation = await running_on(target, MIRROR, generation)
            assert owner == other != killed
            log.warning("task moved to %s: %.1f s", owner, time.monotonic() - started)
            await copied(target, at_kill + 300, "after the worker kill")
            stop.set()
            await sending
            assert len(acked) >= 600

            source_queues = await by_queue(source)
            ends = {queue: len(bodies) for queue, bodies in source_queues.items()}
            deadline = time.monotonic() + 90
            while (now := await sizes(target.namesrv_addr)) != ends:
                assert all(now.get(q, 0) <= n for q, n in ends.items()), f"{now} beyond {ends}"
                assert time.monotonic() < deadline, f"{now} of {ends} copied"
                await asyncio.sleep(0.25)
            await asyncio.sleep(1)  # more than two triggers: a repeat would land now
            target_queues = await by_queue(target.namesrv_addr)
            assert not set(acked) - {b for q in source_queues.values() for b in q}, "acked, lost"
            # the same shape (broker-a, 4 queues): each queue the same messages in the same order
            assert sorted(target_queues) == sorted(source_queues)
            for queue, bodies in source_queues.items():
                assert target_queues[queue] == bodies, queue
            assert await by_queue(target.namesrv_addr, SIDE) == await by_queue(source, SIDE)
            task = await task_status(target)
            assert (task["state"], task["worker_id"]) == ("RUNNING", owner), task
            assert int(task["ferrymq"]["generation"]) == generation
            log.warning(
                "%d messages mirrored exactly once in %.1f s (%d after the worker kill, on %s)",
                sum(ends.values()),
                time.monotonic() - started,
                sum(ends.values()) - at_kill,
                owner,
            )
    finally:
        stop.set()
        if sending is not None and not sending.done():
            sending.cancel()
        await target.stop()
        await source_cluster.stop()
