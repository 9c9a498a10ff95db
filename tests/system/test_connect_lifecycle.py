"""Connector lifecycle and bad input through real workers (issue 19's must-shows).

One ferrymq cluster (`ferry up`'s processes, classic mode, one broker), a `ferry connect
worker` process running the tasks as Spark queries in its one session (one JVM: what moves
between workers is covered by the kill tests), and one PostgreSQL started as the `postgres`
user: shared by the module's tests, each with its own database, topics and connectors. Every
step goes over REST (httpx) as a user's would.

- pause: no new row within two triggers; resume: nothing lost, nothing repeated; stop, rewind
  1,000 messages with PATCH .../offsets, resume: exactly those 1,000 rows written again (an
  upsert table whose trigger counts each row's writes); offsets edits refused unless STOPPED;
  GET .../offsets is the sink's stored offsets;
- a malformed message goes to the dead-letter topic with its reason (errors.tolerance=all) or
  fails the task (none); a wrong password, an unreachable database or a missing table is a
  FAILED task with a clear trace that stays FAILED (no crash loop); after the fix,
  `restart?onlyFailed=true&includeTasks=true` restarts only the failed task, and it runs;
  POST .../tasks/0/restart restarts task 0's query only (a new query run id), task 1 keeps its
  run, and both go on exactly (each row written once);
- one SparkSession per worker, started lazily: w1 has no Java process below it until its first
  task, and one while it runs several tasks (/proc).
"""

import asyncio
import contextlib
import json
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.spark.plan import stable_partition

from ..connectors.postgres import Database, PostgresServer, start_postgres
from ..spark.conftest import descendants, spark_env
from .connect_cluster import FAST, SMALL_LOG, url

pytestmark = [
    pytest.mark.system,
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.timeout(900),
    pytest.mark.asyncio(loop_scope="module"),
]

TRIGGER_MS = 1000
FAST_STATUS = ["--status-republish-ms", "1000"]
"""Tasks' progress (batch id, rows/s, lag) reaches the status topic every second."""
BROKER = "broker-a"


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = start_postgres()
    yield server
    server.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ProcessCluster]:
    spark_env()
    root = tmp_path_factory.mktemp("lifecycle")
    config = UpConfig(data_dir=root, replicas=1, controllers=0, broker_flags=SMALL_LOG)
    running = ProcessCluster(config)
    try:
        await running.start()
        await asyncio.gather(
            *(running.restart_worker(w, extra=[*FAST, *FAST_STATUS]) for w in ("w1",))
        )
        await until("a leader", lambda: _has_leader(url(running, "w1")), 60)
        # the session starts lazily: a worker that holds no task has started no JVM
        assert jvms(running) == [], "w1 started a JVM before its first task"
        yield running
    finally:
        await running.stop()


# ---------------------------------------------------------------- helpers


async def _has_leader(base: str) -> bool:
    try:
        return bool((await call(base, "GET", "/")).json()["leader"]["worker_id"])
    except httpx.HTTPError:
        return False


async def call(base: str, method: str, path: str, body: Any = None, **params: Any) -> Any:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.request(method, base + path, json=body, params=params or None)


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not {what} within {timeout} s"
        await asyncio.sleep(0.3)


async def create_topic(cluster: ProcessCluster, topic: str, queues: int = 1) -> None:
    from ferrymq.client.admin import AdminClient

    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=queues)
        deadline = time.monotonic() + 30
        while (route := await admin.route(topic)) is None or not route.queue_datas:
            assert time.monotonic() < deadline, f"{topic} never reached the NameServer"
            await asyncio.sleep(0.1)


async def send(cluster: ProcessCluster, topic: str, bodies: list[bytes]) -> None:
    """Send bodies to the topic's queue 0, in order, in batches."""
    async with Producer(cluster.namesrv_addr, "lifecycle-tests") as producer:
        queue = (await producer.routes.get(topic)).write_queues[0]
        for first in range(0, len(bodies), 500):
            await producer.send_batch(topic, bodies[first : first + 500], queue=queue)


def rows(ids: range) -> list[bytes]:
    return [json.dumps({"id": i, "v": f"value {i}"}).encode() for i in ids]


async def read_topic(cluster: ProcessCluster, topic: str) -> list[Message]:
    found: list[Message] = []
    async with PullConsumer(cluster.namesrv_addr, "lifecycle-tests") as consumer:
        for queue in await consumer.queues(topic):
            offset, end = await consumer.min_offset(queue), await consumer.max_offset(queue)
            for _ in range(end - offset + 1):
                if offset >= end:
                    break
                result = await consumer.pull(queue, offset, max_messages=256)
                found += result.messages
                offset = result.next_offset
    return found


def sink(database: Database, topic: str, table: str, **extra: str) -> dict[str, str]:
    return {
        "connector.class": "PostgresSink",
        "topics": topic,
        **database.config,
        "table.name.format": table,
        "fields": "id bigint not null, v text",
        "insert.mode": "upsert",
        "pk.mode": "record_value",
        "pk.fields": "id",
        "auto.create": "true",
        "trigger.interval.ms": str(TRIGGER_MS),
        **extra,
    }


async def status(base: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = (await call(base, "GET", f"/connectors/{name}/status")).json()
    return found


def task_states(view: dict[str, Any]) -> list[str]:
    return [t["state"] for t in sorted(view["tasks"], key=lambda t: t["id"])]


async def wait_states(base: str, name: str, states: list[str], timeout: float = 300) -> None:
    async def reached() -> bool:
        return task_states(await status(base, name)) == states

    await until(f"{name}'s tasks {states}", reached, timeout)


def count(database: Database, table: str) -> int:
    """The table's rows (0 while it does not exist: auto.create makes it at the task's start)."""
    if not _exists(database, table):
        return 0
    return int(str(database.query(f"SELECT count(*) FROM {table}")[0][0]))


def counted_table(database: Database, table: str) -> None:
    """An upsert table whose `writes` column counts every write of a row (a trigger)."""
    database.query(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, v text, writes int NOT NULL DEFAULT 1)"
    )
    database.query(
        "CREATE OR REPLACE FUNCTION count_writes() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN NEW.writes := OLD.writes + 1; RETURN NEW; END $$"
    )
    database.query(
        f"CREATE TRIGGER counted BEFORE UPDATE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION count_writes()"
    )


def writes(database: Database, table: str) -> dict[int, list[int]]:
    """write count -> the ids written that many times."""
    found: dict[int, list[int]] = {}
    for row_id, written in database.query(f"SELECT id, writes FROM {table} ORDER BY id"):
        found.setdefault(int(str(written)), []).append(int(str(row_id)))
    return found


def jvms(cluster: ProcessCluster) -> list[int]:
    """The Java processes below w1's Python process (its Spark driver, once started)."""
    found = []
    for pid in descendants(cluster.workers["w1"].pid):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/comm") as comm:
            if comm.read().strip() == "java":
                found.append(pid)
    return found


def name() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------- tests


async def test_pause_resume_and_a_rewind_through_the_offsets_api(
    cluster: ProcessCluster, postgres: PostgresServer
) -> None:
    base = url(cluster, "w1")
    database = postgres.create_database(f"t_{uuid.uuid4().hex[:12]}")
    topic, connector = name(), name()
    await create_topic(cluster, topic)
    counted_table(database, "orders")
    await send(cluster, topic, rows(range(1000)))
    created = await call(
        base, "POST", "/connectors", {"name": connector, "config": sink(database, topic, "orders")}
    )
    assert created.status_code == 201, created.text

    async def has(n: int) -> bool:
        return count(database, "orders") == n

    await until("the first 1,000 rows", lambda: has(1000))

    async def progress() -> bool:  # the query's own figures, as its worker last reported them
        task = (await status(base, connector))["tasks"][0]["ferrymq"]
        return bool(task.get("lag") == 0 and task.get("num_input_rows", 0) > 0)

    await until("the query's progress in /status", progress, 30)
    running = (await status(base, connector))["tasks"][0]["ferrymq"]
    assert running["batch_id"] >= 0, running
    assert running["processed_rows_per_second"] > 0, running
    assert running["query_status"], running

    # offsets edits are refused unless STOPPED (Kafka's 400 and message); GET is the stored truth
    rewind = {
        "offsets": [
            {
                "partition": {"topic": topic, "broker": BROKER, "queue": 0},
                "offset": {"offset": 2000},
            }
        ]
    }
    refused = await call(base, "PATCH", f"/connectors/{connector}/offsets", rewind)
    assert refused.status_code == 400
    assert refused.json()["message"].startswith("Connectors must be in the STOPPED state")
    assert (await call(base, "DELETE", f"/connectors/{connector}/offsets")).status_code == 400

    # pause: the query stops; messages sent meanwhile are not written within two triggers
    assert (await call(base, "PUT", f"/connectors/{connector}/pause")).status_code == 202
    await wait_states(base, connector, ["PAUSED"])
    await send(cluster, topic, rows(range(1000, 3000)))
    await asyncio.sleep(2 * TRIGGER_MS / 1000 + 0.5)
    assert count(database, "orders") == 1000

    # resume: from the checkpoint, nothing lost or repeated
    assert (await call(base, "PUT", f"/connectors/{connector}/resume")).status_code == 202
    await until("all 3,000 rows", lambda: has(3000))
    assert writes(database, "orders") == {1: list(range(3000))}

    async def shown(next_offset: int) -> bool:
        answer = await call(base, "GET", f"/connectors/{connector}/offsets")
        return bool(answer.status_code == 200) and answer.json() == {
            "offsets": [
                {
                    "partition": {"topic": topic, "broker": BROKER, "queue": 0},
                    "offset": {"offset": next_offset},
                }
            ]
        }

    await until("the stored offset 3000", lambda: shown(3000), 30)

    # stop + rewind 1,000 + resume: exactly those 1,000 rows again
    assert (await call(base, "PUT", f"/connectors/{connector}/stop")).status_code == 204
    await wait_states(base, connector, [])
    bad = {"offsets": [{"partition": {"topic": topic}, "offset": {"offset": 1}}]}
    invalid = await call(base, "PATCH", f"/connectors/{connector}/offsets", bad)
    assert invalid.status_code == 400
    assert "partition" in invalid.json()["message"]
    patched = await call(base, "PATCH", f"/connectors/{connector}/offsets", rewind)
    assert patched.status_code == 200, patched.text
    assert (await call(base, "PUT", f"/connectors/{connector}/resume")).status_code == 202

    async def rewritten() -> bool:
        return len(writes(database, "orders").get(2, [])) == 1000

    await until("the 1,000 rewound rows written again", rewritten)
    await until("the stored offset back at 3000", lambda: shown(3000), 30)
    await asyncio.sleep(2 * TRIGGER_MS / 1000)  # nothing more comes
    assert writes(database, "orders") == {1: list(range(2000)), 2: list(range(2000, 3000))}
    assert (await call(base, "DELETE", f"/connectors/{connector}")).status_code == 204


async def test_a_malformed_message_goes_to_the_dead_letter_topic_or_fails_the_task(
    cluster: ProcessCluster, postgres: PostgresServer
) -> None:
    base = url(cluster, "w1")
    database = postgres.create_database(f"t_{uuid.uuid4().hex[:12]}")
    topic, dlq, tolerant, strict = name(), name(), name(), name()
    await create_topic(cluster, topic)
    bodies = rows(range(10))
    bodies[3] = b'{"id": "three", "v": "x"}'  # id is bigint
    bodies[6] = b"not json"
    await send(cluster, topic, bodies)
    config = sink(
        database,
        topic,
        "tolerant",
        **{"errors.tolerance": "all", "errors.deadletterqueue.topic.name": dlq},
    )
    assert (
        await call(base, "POST", "/connectors", {"name": tolerant, "config": config})
    ).is_success
    config = sink(database, topic, "strict")
    assert (await call(base, "POST", "/connectors", {"name": strict, "config": config})).is_success

    await until("the good rows", lambda: _is(count(database, "tolerant") == 8))
    ids = [int(str(r[0])) for r in database.query("SELECT id FROM tolerant ORDER BY id")]
    assert ids == [0, 1, 2, 4, 5, 7, 8, 9]

    async def dead_letters() -> bool:
        return len(await read_topic(cluster, dlq)) == 2

    await until("2 dead letters", dead_letters)
    dead = sorted(
        await read_topic(cluster, dlq), key=lambda m: int(m.properties["__connect.errors.offset"])
    )
    assert [m.body for m in dead] == [bodies[3], bodies[6]]
    for message, offset in zip(dead, (3, 6), strict=True):
        assert message.properties["__connect.errors.topic"] == topic
        assert message.properties["__connect.errors.offset"] == str(offset)
        assert message.properties["__connect.errors.connector.name"] == tolerant
        assert message.properties["__connect.errors.exception.message"]

    # errors.tolerance=none: the task fails with the reason, and nothing of that batch is written
    await wait_states(base, strict, ["FAILED"])
    trace = (await status(base, strict))["tasks"][0]["trace"]
    assert f"malformed message at {topic}" in trace, trace
    assert _exists(database, "strict")
    assert count(database, "strict") == 0


async def test_database_failures_are_failed_tasks_and_restart_only_failed_runs_them(
    cluster: ProcessCluster, postgres: PostgresServer
) -> None:
    base = url(cluster, "w1")
    database = postgres.create_database(f"t_{uuid.uuid4().hex[:12]}")
    # two topics of one queue each, read by different tasks of one connector (tasks.max=2)
    first = name()
    second = next(t for t in (name() for _ in range(100)) if _task_of(t) != _task_of(first))
    topics = {_task_of(first): first, _task_of(second): second}
    for topic in topics.values():
        await create_topic(cluster, topic)
        await send(cluster, topic, rows(range(100)))
    missing = topics[1]  # task 1's table does not exist
    counted_table(database, topics[0])
    wrong, unreachable, split = name(), name(), name()
    configs = {
        wrong: sink(database, topics[0], "${topic}", **{"connection.password": "wrong"}),
        unreachable: sink(
            database, topics[0], "${topic}", **{"connection.url": _unreachable(database)}
        ),
        split: sink(
            database,
            ",".join(topics.values()),
            "${topic}",
            **{"auto.create": "false", "tasks.max": "2"},
        ),
    }
    for connector, config in configs.items():
        created = await call(base, "POST", "/connectors", {"name": connector, "config": config})
        assert created.status_code == 201, created.text
    await wait_states(base, wrong, ["FAILED"])
    await wait_states(base, unreachable, ["FAILED"])
    await wait_states(base, split, ["RUNNING", "FAILED"])
    traces = {c: (await status(base, c))["tasks"] for c in configs}
    assert "password authentication failed" in traces[wrong][0]["trace"]
    assert (
        "cannot connect to PostgreSQL at postgresql://postgres@127.0.0.1:"
        in (traces[unreachable][0]["trace"])
    )
    assert missing in traces[split][1]["trace"]
    assert "does not exist" in traces[split][1]["trace"]
    for connector in configs:
        assert "ferry-secret" not in json.dumps(traces[connector])
    # not a crash loop: still FAILED, started once, a few seconds later
    await asyncio.sleep(3)
    for connector in (wrong, unreachable):
        [task] = (await status(base, connector))["tasks"]
        assert (task["state"], task["ferrymq"]["starts"]) == ("FAILED", 1), task
    # task 0 of the split connector runs (RUNNING: its query started; a first batch may take longer)
    await until("task 0's 100 rows", lambda: _is(count(database, topics[0]) == 100))

    # the fix: the table exists; only the failed task restarts, and it runs
    counted_table(database, missing)
    before = (await status(base, split))["tasks"][0]["ferrymq"]
    restarted = await call(
        base, "POST", f"/connectors/{split}/restart", onlyFailed="true", includeTasks="true"
    )
    assert restarted.status_code == 202, restarted.text
    assert task_states(restarted.json()) == ["RUNNING", "RESTARTING"]
    await wait_states(base, split, ["RUNNING", "RUNNING"])
    await until("task 1's rows", lambda: _is(count(database, missing) == 100))
    after = (await status(base, split))["tasks"][0]["ferrymq"]
    assert (after["run_id"], after["starts"]) == (before["run_id"], before["starts"])
    # every task of the worker (these two and the other connectors') runs in its one JVM
    assert len(jvms(cluster)) == 1, jvms(cluster)

    # restart of one task restarts its query only: task 1 keeps its run (query run id, starts)
    held = {t["id"]: t["ferrymq"] for t in (await status(base, split))["tasks"]}
    restarted = await call(base, "POST", f"/connectors/{split}/tasks/0/restart")
    assert restarted.status_code == 204, restarted.text

    async def restarted_0() -> bool:
        view = await status(base, split)
        task = view["tasks"][0]
        return bool(task["state"] == "RUNNING" and task["ferrymq"]["run_id"] != held[0]["run_id"])

    await until("task 0 running a new query", restarted_0, 60)
    tasks = {t["id"]: t["ferrymq"] for t in (await status(base, split))["tasks"]}
    assert tasks[0]["starts"] == held[0]["starts"] + 1, (held, tasks)
    assert (tasks[1]["run_id"], tasks[1]["starts"]) == (held[1]["run_id"], held[1]["starts"])
    for topic in topics.values():  # both queries go on from their checkpoints, exactly
        await send(cluster, topic, rows(range(100, 150)))
    for topic in topics.values():

        async def all_150(table: str = topic) -> bool:
            return count(database, table) == 150

        await until(f"{topic}'s 150 rows", all_150, 60)
    await asyncio.sleep(2 * TRIGGER_MS / 1000)  # a repeat would land now
    for topic in topics.values():
        assert writes(database, topic) == {1: list(range(150))}, topic
    after = (await status(base, split))["tasks"][1]["ferrymq"]
    assert after["run_id"] == held[1]["run_id"]

    # the fixed password: the config change restarts the task, and it runs
    fixed = await call(
        base, "PUT", f"/connectors/{wrong}/config", sink(database, topics[0], "${topic}")
    )
    assert fixed.status_code == 200, fixed.text
    await wait_states(base, wrong, ["RUNNING"])
    for connector in configs:
        assert (await call(base, "DELETE", f"/connectors/{connector}")).status_code == 204


async def _is(value: bool) -> bool:
    return value


def _exists(database: Database, table: str) -> bool:
    return database.query("SELECT to_regclass(%s)", table) != [(None,)]


def _task_of(topic: str) -> int:
    """Which of 2 PostgresSink tasks reads the topic's one queue (postgres_sink.task_owner)."""
    return (zlib.crc32(topic.encode()) + stable_partition(BROKER, 0)) % 2


def _unreachable(database: Database) -> str:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/{database.name}"
