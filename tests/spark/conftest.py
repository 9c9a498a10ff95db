"""Shared fixtures of the Spark tests: one local[2] SparkSession and one ferrymq cluster.

Spark's JVM costs seconds to start, so the whole session shares one (`spark`); the servers are
real `ferry namesrv` / `ferry broker` processes (`ferry`), and every test writes its own topics.
A crash test runs its query in a subprocess driver (`driver.py`) and kills that whole process
tree by PID.
"""

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient

from ..system.procs import Server, start


def spark_env() -> None:
    """What Spark's processes need: the venv's Python for workers, loopback only."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"


@dataclass
class Ferry:
    """A running NameServer and broker."""

    namesrv: Server
    broker: Server
    root: Path

    @property
    def servers(self) -> str:
        return self.namesrv.addr

    def stop(self) -> None:
        self.broker.stop()
        self.namesrv.stop()


def start_ferry(root: Path, *broker_flags: str) -> Ferry:
    root.mkdir(parents=True, exist_ok=True)
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0"], root, "namesrv")
    try:
        broker = start(
            [
                "broker",
                "--listen",
                "127.0.0.1:0",
                "--namesrv",
                namesrv.addr,
                "--store-dir",
                str(root / "store"),
                "--register-name-server-period",
                "1000",
                *broker_flags,
            ],
            root,
            "broker",
        )
    except BaseException:
        namesrv.stop()
        raise
    return Ferry(namesrv, broker, root)


async def create_topic(servers: str, topic: str, queues: int) -> None:
    async with AdminClient(servers) as admin:
        await admin.create_topic(topic, queues=queues)
        deadline = time.monotonic() + 20
        while True:
            route = await admin.route(topic)
            if route is not None and sum(q.read_queue_nums for q in route.queue_datas) == queues:
                return
            assert time.monotonic() < deadline, f"{topic} never reached the NameServer"
            await asyncio.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (children first found, then theirs)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything below it, each by PID (a crash of the whole driver)."""
    for target in [pid, *descendants(pid)]:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            continue


@pytest.fixture(scope="session")
def ferry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ferry]:
    cluster = start_ferry(tmp_path_factory.mktemp("ferry"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """ferrymq's local session (`local_session`), as `ferry demo` and the bench start it."""
    spark_env()
    from ferrymq.spark.session import local_session

    session = local_session("ferrymq-tests")
    if session.sparkContext.master != "local[2]":
        # getOrCreate handed back a session another directory's fixture left running (in one
        # pytest run, tests/connectors' local[N,4], whose failed tasks are retried): these tests
        # expect their own, where a task's first failure fails its query
        session.stop()
        session = local_session("ferrymq-tests")
    assert session.sparkContext.master == "local[2]"
    yield session
    session.stop()


async def produce_bulk(servers: str, topic: str, prefix: str, count: int) -> list[bytes]:
    """Send `count` distinct bodies, in batches of 200 spread over the topic's queues."""
    from ferrymq.client.producer import Producer

    bodies = [f"{prefix}-{i:07d}".encode() for i in range(count)]
    async with Producer(servers, "spark-tests") as producer:
        queues = (await producer.routes.get(topic)).write_queues
        for turn, first in enumerate(range(0, count, 200)):
            await producer.send_batch(
                topic, bodies[first : first + 200], queue=queues[turn % len(queues)]
            )
    return bodies
