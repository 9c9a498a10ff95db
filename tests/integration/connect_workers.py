"""In-process Connect workers on a LocalCluster for the REST contract tests.

The workers are real (`connect.worker.Worker`: uvicorn on port 0, the fenced config log, group
membership on the broker) with short timings, but their task runtime is `NullRunner`: a task
that would run is only recorded, so a request that resumes a connector (schemathesis generates
them) never starts Spark.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from ferrymq.connect.config import WorkerConfig
from ferrymq.connect.plugin import Plugins
from ferrymq.connect.state import TaskKey
from ferrymq.connect.tasks import TaskSpec
from ferrymq.connect.worker import Worker
from ferrymq.testing import LocalCluster

PAUSED = {"initial_state": "PAUSED"}
STOPPED = {"initial_state": "STOPPED"}


class NullRunner:
    """A task runtime that runs nothing (`TaskRunner`): starts and stops are only counted."""

    def __init__(self) -> None:
        self.started: list[TaskKey] = []
        self.stopped: list[TaskKey] = []

    async def start(self, spec: TaskSpec) -> str:
        self.started.append(spec.key)
        return f"null-{len(self.started)}"

    async def stop(self, key: TaskKey) -> None:
        self.stopped.append(key)

    async def refresh(self) -> None:
        return None

    def failure(self, key: TaskKey) -> str | None:
        return None

    def metrics(self, key: TaskKey) -> dict[str, Any]:
        return {}


def replicator(topics: str = "src", **extra: str) -> dict[str, str]:
    """A valid FerrymqReplicator config."""
    return {
        "connector.class": "FerrymqReplicator",
        "topics": topics,
        "target.topic.format": "${topic}-copy",
        **extra,
    }


def make_worker(cluster: LocalCluster, root: Path, name: str, **changes: Any) -> Worker:
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
    return Worker(config, runner=NullRunner(), plugins=Plugins())


@contextlib.asynccontextmanager
async def workers(
    cluster: LocalCluster, root: Path, count: int, **changes: Any
) -> AsyncIterator[list[Worker]]:
    started = [make_worker(cluster, root, f"w{i}", **changes) for i in range(1, count + 1)]
    try:
        await asyncio.gather(*(w.start() for w in started))
        yield started
    finally:
        for worker in started:
            await worker.close()


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


async def call(url: str, method: str, path: str, body: Any = None, **params: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as client:
        return await client.request(method, url + path, json=body, params=params or None)
