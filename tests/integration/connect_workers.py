"""In-process Connect workers on a LocalCluster for the REST contract tests, running real tasks.

The workers are real (`connect.worker.Worker`: uvicorn on port 0, the fenced config log, group
membership on the broker) with short timings, and so is their task runtime:
`connectors.runtime.SparkTaskRunner`, each task a Spark streaming query. The SparkSession starts
lazily, on the first task that runs, and is shared by every worker of a test module (a process
has one SparkContext anyway); the module's `spark` fixture stops it at the end, unless it was
the process's session before (another suite's, which that suite stops).

The connectors are FerrymqReplicators copying the LocalCluster's own topics (`src`, `more` and
`other`, created with a few messages by `workers`) into `<topic>-copy`: their queries really run
and their statuses come from them. They are cheap: one micro-batch a minute after the first.
"""

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.connect.config import WorkerConfig
from ferrymq.connect.plugin import Plugins
from ferrymq.connect.worker import Worker
from ferrymq.connectors.runtime import SparkTaskRunner
from ferrymq.errors import FerryError
from ferrymq.testing import LocalCluster

PAUSED = {"initial_state": "PAUSED"}
STOPPED = {"initial_state": "STOPPED"}
SOURCE_TOPICS = ("src", "more", "other")
"""The topics the tests' replicators copy."""
MESSAGES = 10
"""Messages in each source topic."""
TRIGGER_MS = "60000"
"""The replicators' micro-batch interval: the first batch at start, then one a minute."""


class TaskSpark:
    """One SparkSession for the workers' tasks, started by the first task that runs.

    `session` is every runner's `session_factory`; it runs on the runner's Spark thread and makes
    the session that thread's active one (Spark finds a streaming sink's Python data source
    through the calling thread's session).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: Any = None
        self._owned = False

    def session(self, app: str, master: str) -> Any:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        from ferrymq.spark.session import local_session

        with self._lock:
            if self._session is None:
                self._owned = SparkContext._active_spark_context is None
                self._session = local_session("ferrymq-connect-contract", "local[2]")
            spark = self._session
        SparkSession._get_j_spark_session_class(spark._jvm).setActiveSession(spark._jsparkSession)
        return spark

    @property
    def started(self) -> bool:
        """Whether a task started the session."""
        return self._session is not None

    def stop_queries(self) -> list[str]:
        """Stop every query still active; their names (none once the workers are closed)."""
        if self._session is None:
            return []
        left = list(self._session.streams.active)
        for query in left:
            query.stop()
        return [str(query.name) for query in left]

    def stop(self) -> None:
        """Stop the session if this object started it."""
        session, self._session = self._session, None
        if session is not None and self._owned:
            session.stop()


@contextlib.contextmanager
def task_spark() -> Iterator[TaskSpark]:
    """A TaskSpark for a test module (its `spark` fixture), stopped at the module's end."""
    spark = TaskSpark()
    try:
        yield spark
    finally:
        spark.stop()


def replicator(topics: str = "src", **extra: str) -> dict[str, str]:
    """A valid FerrymqReplicator config (one task, a micro-batch a minute)."""
    return {
        "connector.class": "FerrymqReplicator",
        "topics": topics,
        "target.topic.format": "${topic}-copy",
        "trigger.interval.ms": TRIGGER_MS,
        **extra,
    }


def make_worker(
    cluster: LocalCluster, spark: TaskSpark, root: Path, name: str, **changes: Any
) -> Worker:
    settings: dict[str, Any] = {
        "heartbeat_interval_ms": 100,
        "session_timeout_ms": 1000,
        "leader_failover_grace_ms": 200,
        "task_reassign_grace_ms": 300,
        "rest_request_timeout_ms": 10_000,
        **changes,
    }
    config = WorkerConfig(
        namesrv_addr=cluster.namesrv_addr,
        worker_id=name,
        http_port=0,
        store_path_root_dir=root / name,
        **settings,
    )
    plugins = Plugins()
    runner = SparkTaskRunner(
        plugins,
        cluster_id=config.connect_cluster_id,
        namesrv_addr=config.namesrv_addr,
        state_dir=config.store_path_root_dir,
        session_factory=spark.session,
    )
    return Worker(config, runner=runner, plugins=plugins)


async def source_topics(cluster: LocalCluster) -> None:
    """The replicators' source topics, 2 queues each, with a few messages."""
    async with AdminClient(cluster.namesrv_addr) as admin:
        for topic in SOURCE_TOPICS:
            await admin.create_topic(topic, queues=2)
    async with Producer(cluster.namesrv_addr, "contract-tests") as producer:
        for topic in SOURCE_TOPICS:
            await producer.send_batch(topic, [f"{topic}-{i}".encode() for i in range(MESSAGES)])


BODY_S = 240.0
"""A bound on a test's time with its workers (the loop's own timer: pytest-timeout's signal does
not interrupt a uvloop waiting in epoll), so a hang fails with the await it hung on."""
CLOSE_S = 120.0


@contextlib.asynccontextmanager
async def workers(
    cluster: LocalCluster,
    spark: TaskSpark,
    root: Path,
    count: int,
    *,
    budget_s: float = BODY_S,
    **changes: Any,
) -> AsyncIterator[list[Worker]]:
    """`count` started workers; closed (with every query of theirs) at the end."""
    await source_topics(cluster)
    started = [make_worker(cluster, spark, root, f"w{i}", **changes) for i in range(1, count + 1)]
    try:
        async with asyncio.timeout(budget_s):
            await asyncio.gather(*(w.start() for w in started))
            yield started
    finally:
        async with asyncio.timeout(CLOSE_S):
            for worker in started:
                await worker.close()
            for worker in started:
                assert isinstance(worker.runner, SparkTaskRunner)
                await worker.runner.close()
            left = await asyncio.to_thread(spark.stop_queries)
    # the runtime stops every query of a closed worker, one whose start was cut short too
    assert left == [], f"queries still running after the workers closed: {left}"


async def leader_of(group: list[Worker], timeout: float = 15.0) -> Worker:
    """The one leader every worker of `group` names, once all of them are healthy."""
    deadline = time.monotonic() + timeout
    while True:
        leaders = [w for w in group if w.herder.is_leader]
        if len(leaders) == 1 and all(w.herder.leader()[0] == leaders[0].worker_id for w in group):
            healthy = [(await call(w.url, "GET", "/health")).status_code for w in group]
            if healthy == [200] * len(group):
                return leaders[0]
        assert time.monotonic() < deadline, (
            f"no single leader: {[w.herder.leader() for w in group]}"
        )
        await asyncio.sleep(0.05)


async def task_states(url: str, connector: str, want: set[str], timeout: float = 120.0) -> Any:
    """The connector's `/status` once every task's state is in `want` (its query's state)."""
    deadline = time.monotonic() + timeout
    while True:
        status = (await call(url, "GET", f"/connectors/{connector}/status")).json()
        tasks = status.get("tasks") or []
        if tasks and {t["state"] for t in tasks} <= want:
            return status
        assert time.monotonic() < deadline, f"{connector}'s tasks never reached {want}: {status}"
        await asyncio.sleep(0.2)


async def copied(cluster: LocalCluster, topic: str, want: int, timeout: float = 120.0) -> int:
    """Messages in `topic` (a replicator's target) once it holds `want` (0 after `timeout`)."""
    deadline = time.monotonic() + timeout
    async with PullConsumer(cluster.namesrv_addr, "contract-tests") as consumer:
        while True:
            with contextlib.suppress(FerryError):  # no route until the task created the topic
                held = sum([await consumer.max_offset(q) for q in await consumer.queues(topic)])
                if held >= want:
                    return held
            if time.monotonic() > deadline:
                return 0
            await asyncio.sleep(0.2)


async def call(url: str, method: str, path: str, body: Any = None, **params: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as client:
        return await client.request(method, url + path, json=body, params=params or None)
