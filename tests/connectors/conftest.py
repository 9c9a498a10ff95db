"""Fixtures of the connector tests: a PostgreSQL server, a ferrymq cluster and a SparkSession.

All three are session-wide (each costs seconds to start); every test makes its own database
(`database`) and its own topics. The servers are real processes started and stopped by PID:
PostgreSQL from Debian's package (`postgres.py`), `ferry namesrv` and `ferry broker`
(tests/spark/conftest.py's `start_ferry`).
"""

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer

from ..spark.conftest import Ferry, kill_tree, spark_env, start_ferry
from .postgres import Database, PostgresServer, start_postgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def database(postgres: PostgresServer) -> Database:
    """A fresh database for this test."""
    return postgres.create_database(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture(scope="session")
def ferry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ferry]:
    cluster = start_ferry(tmp_path_factory.mktemp("ferry"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    spark_env()
    from ferrymq.connectors.runtime import SPARK_MASTER
    from ferrymq.spark.session import local_session

    session = local_session("ferrymq-connector-tests", SPARK_MASTER)  # a worker's: tasks retried
    yield session
    session.stop()


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


async def produce_json(
    servers: str,
    topic: str,
    documents: list[dict[str, Any]],
    batch: int = 200,
    queue_of: Callable[[dict[str, Any]], int] | None = None,
) -> None:
    """Send JSON bodies in batches, round robin over the topic's queues (or by `queue_of`)."""
    async with Producer(servers, "connector-tests") as producer:
        queues = (await producer.routes.get(topic)).write_queues
        if queue_of is None:
            for turn, first in enumerate(range(0, len(documents), batch)):
                bodies = [json.dumps(d).encode() for d in documents[first : first + batch]]
                await producer.send_batch(topic, bodies, queue=queues[turn % len(queues)])
            return
        for index, queue in enumerate(queues):
            mine = [json.dumps(d).encode() for d in documents if queue_of(d) == index]
            for first in range(0, len(mine), batch):
                await producer.send_batch(topic, mine[first : first + batch], queue=queue)


async def produce_raw(servers: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer(servers, "connector-tests") as producer:
        for body in bodies:
            await producer.send(topic, body)


async def end_offsets(servers: str, topic: str) -> dict[tuple[str, int], int]:
    """Every queue's max offset: (broker, queue id) -> the next offset to be written."""
    async with PullConsumer(servers, "connector-tests") as consumer:
        queues = await consumer.queues(topic)
        return {(q.broker_name, q.queue_id): await consumer.max_offset(q) for q in queues}


async def read_topic(servers: str, topic: str) -> list[Message]:
    """Every message the topic holds now, queue by queue, in offset order."""
    found: list[Message] = []
    async with PullConsumer(servers, "connector-tests") as consumer:
        for queue in await consumer.queues(topic):
            offset, end = await consumer.min_offset(queue), await consumer.max_offset(queue)
            for _ in range(end - offset + 1):  # a bound: each round reads at least one message
                if offset >= end:
                    break
                result = await consumer.pull(queue, offset, max_messages=256)
                found += result.messages
                offset = result.next_offset
    return found


# ---------------------------------------------------------------- driver processes and queries

DRIVER = Path(__file__).with_name("driver.py")


def start_driver(
    log: Path, env: dict[str, str] | None = None, **args: Any
) -> subprocess.Popen[bytes]:
    """A `driver.py` process running the tasks `args` name (with `env` added)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(DRIVER), json.dumps(args)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )


def stop_driver(driver: subprocess.Popen[bytes]) -> None:
    """kill -9 of the driver's whole process tree, by PID."""
    kill_tree(driver.pid)
    driver.wait(30)


def wait_until(
    what: str,
    check: Callable[[], bool],
    driver: subprocess.Popen[bytes] | None,
    log: Path,
    timeout: float = 180,
) -> None:
    """Poll `check` until it holds; fail if the driver exits first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not check():
        if driver is not None and driver.poll() is not None:
            raise AssertionError(
                f"the driver exited ({driver.returncode}) before {what}: {log.read_text()[-4000:]}"
            )
        assert time.monotonic() < deadline, f"not {what} in {timeout} s: {log.read_text()[-3000:]}"
        time.sleep(0.25)


def run_until(query: Any, what: str, check: Callable[[], bool], timeout: float = 120) -> None:
    """Poll `check` while an in-process query runs; fail if the query ends first."""
    deadline = time.monotonic() + timeout
    while not check():
        if not query.isActive:
            raise AssertionError(f"the query ended before {what}: {query.exception()}")
        assert time.monotonic() < deadline, f"not {what} in {timeout} s"
        time.sleep(0.2)


def ended_with(query: Any, timeout: float = 120) -> str:
    """The message of the exception a query ends with (it must end within `timeout`)."""
    try:
        query.awaitTermination(timeout)
    except Exception as exc:  # noqa: BLE001 - awaitTermination raises the query's error
        return str(exc)
    raise AssertionError(
        "the query ended without an error" if not query.isActive else "the query did not fail"
    )


def count_ids(database: Database, table: str) -> tuple[int, int]:
    """count(*) and count(DISTINCT id) of a table."""
    [(rows, ids)] = database.query(f"SELECT count(*), count(DISTINCT id) FROM {table}")
    return int(str(rows)), int(str(ids))


def stored_offsets(database: Database, connector: str) -> dict[tuple[str, int], int]:
    """ferry_connect_offsets of a connector: (broker, queue) -> next offset."""
    if database.query("SELECT to_regclass('ferry_connect_offsets')") == [(None,)]:
        return {}
    rows = database.query(
        "SELECT broker, queue, next_offset FROM ferry_connect_offsets WHERE connector = %s",
        connector,
    )
    return {(str(b), int(str(q))): int(str(n)) for b, q, n in rows}
