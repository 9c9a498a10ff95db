"""A real Connect cluster for system tests: `ferry up`'s processes plus `ferry connect worker`s.

Controller mode with 3 replicas (sync replication: a 2xx config write is on every SyncStateSet
member), workers started with short timings so failovers take seconds. Everything is stopped by
PID. REST calls go through httpx; `raw_log` reads the config log as stored (`GET /log`).
"""

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from ferrymq.cmd.local import Child
from ferrymq.cmd.up import ProcessCluster, UpConfig

FAST = [
    "--heartbeat-interval-ms",
    "200",
    "--session-timeout-ms",
    "2000",
    "--leader-failover-grace-ms",
    "500",
    "--task-reassign-grace-ms",
    "1000",
    "--rest-request-timeout-ms",
    "15000",
]
GRACE_S = 0.5
SMALL_LOG = ("--mapped-file-size-commit-log", str(16 * 1024 * 1024))
"""Commit-log segments of 16 MiB instead of 1 GiB: each broker preallocates less (a failed run
keeps its directory), and a killed broker's recovery reads less (1 GiB took 24 s once)."""


def paused(topics: str = "src", **extra: str) -> dict[str, Any]:
    """A replicator config whose connector is created PAUSED (tasks assigned, no Spark query)."""
    return {
        "connector.class": "FerrymqReplicator",
        "topics": topics,
        "target.topic.format": "${topic}-copy",
        **extra,
    }


@asynccontextmanager
async def connect_cluster(
    root: Path,
    workers: int,
    *,
    env: dict[str, str] | None = None,
    broker_flags: tuple[str, ...] = SMALL_LOG,
    replicas: int = 3,
    controllers: int = 3,
    extra: tuple[str, ...] = (),
) -> AsyncIterator[ProcessCluster]:
    """`ferry up`'s servers (controller mode with 3 replicas unless told otherwise; `replicas=1,
    controllers=0` is one classic broker; 16 MiB commit-log segments unless `broker_flags` say
    otherwise) and `workers` workers w1..wN with the FAST timings (`extra` flags override them)."""
    cluster = ProcessCluster(
        UpConfig(
            data_dir=root, replicas=replicas, controllers=controllers, broker_flags=broker_flags
        )
    )
    try:
        await cluster.start()
        await asyncio.gather(
            *(start_worker(cluster, f"w{i}", env=env, extra=extra) for i in range(1, workers + 1))
        )
        yield cluster
    finally:
        await cluster.stop()


async def start_worker(
    cluster: ProcessCluster,
    worker_id: str,
    *,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> Child:
    return await cluster.restart_worker(worker_id, env=env, extra=[*FAST, *extra])


def url(cluster: ProcessCluster, worker_id: str) -> str:
    return str(cluster.workers[worker_id].info["url"])


async def rest(
    base: str, method: str, path: str, body: Any = None, *, timeout: float = 20.0, **params: Any
) -> httpx.Response:
    async with httpx.AsyncClient(timeout=timeout) as client:
        return await client.request(method, base + path, json=body, params=params or None)


async def cluster_view(cluster: ProcessCluster, worker_id: str) -> dict[str, Any]:
    answer = await rest(url(cluster, worker_id), "GET", "/cluster", timeout=5)
    view: dict[str, Any] = answer.json()
    return view


async def leader(cluster: ProcessCluster, timeout: float = 30.0, *, ask: str | None = None) -> str:
    """The worker id every running worker (or `ask`) names as the leader."""
    deadline = time.monotonic() + timeout
    while True:
        askers = [ask] if ask else [w for w, c in cluster.workers.items() if c.running]
        try:
            named = {(await cluster_view(cluster, w))["leader"]["worker_id"] for w in askers}
        except httpx.HTTPError:
            named = set()
        if len(named) == 1 and "" not in named:
            return str(named.pop())
        assert time.monotonic() < deadline, f"no single leader: {named}"
        await asyncio.sleep(0.05)


async def raw_log(base: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    start = 0
    while True:
        page = (await rest(base, "GET", "/log", **{"from": start, "limit": 1000})).json()
        records += page
        if len(page) < 1000:
            return records
        start = page[-1]["offset"] + 1


def check_epochs(records: list[dict[str, Any]]) -> None:
    """One claim per epoch, in order, and no record of an older epoch after a newer claim."""
    claims = [r["record"]["epoch"] for r in records if r["kind"] == "Claim"]
    assert claims == list(range(claims[0], claims[0] + len(claims))), claims
    newest = 0
    for record in records:
        if record["logical_offset"] != record["offset"]:
            continue  # a broker's copy-forward of older records
        assert record["epoch"] is not None, record
        if record["kind"] == "Claim":
            newest = max(newest, record["epoch"])
        else:
            assert record["epoch"] == newest, (record["offset"], record["epoch"], newest)


async def converged(cluster: ProcessCluster, timeout: float = 20.0) -> dict[str, Any]:
    """Wait until every running worker has read the log to the same offset; returns their
    connectors (expand=info) as they all see them."""
    deadline = time.monotonic() + timeout
    while True:
        running = [w for w, c in cluster.workers.items() if c.running]
        roots = [(await rest(url(cluster, w), "GET", "/")).json() for w in running]
        offsets = {r["config_offset"] for r in roots}
        if len(offsets) == 1:
            views = [
                (await rest(url(cluster, w), "GET", "/connectors", expand=["info"])).json()
                for w in running
            ]
            if all(v == views[0] for v in views):
                found: dict[str, Any] = views[0]
                return found
        assert time.monotonic() < deadline, f"workers never converged: {offsets}"
        await asyncio.sleep(0.1)
