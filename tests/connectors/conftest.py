"""Fixtures of the connector tests: a PostgreSQL server, a ferrymq cluster and a SparkSession.

All three are session-wide (each costs seconds to start); every test makes its own database
(`database`) and its own topics. The servers are real processes started and stopped by PID:
PostgreSQL from Debian's package (`postgres.py`), `ferry namesrv` and `ferry broker`
(tests/spark/conftest.py's `start_ferry`).
"""

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer

from ..spark.conftest import Ferry, spark_env, start_ferry
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
    from ferrymq.spark.session import local_session

    session = local_session("ferrymq-connector-tests")
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
    servers: str, topic: str, documents: list[dict[str, Any]], batch: int = 200
) -> None:
    """Send JSON bodies in batches, round robin over the topic's queues."""
    async with Producer(servers, "connector-tests") as producer:
        queues = (await producer.routes.get(topic)).write_queues
        for turn, first in enumerate(range(0, len(documents), batch)):
            bodies = [json.dumps(d).encode() for d in documents[first : first + batch]]
            await producer.send_batch(topic, bodies, queue=queues[turn % len(queues)])


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
