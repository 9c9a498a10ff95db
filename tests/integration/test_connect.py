"""Connect workers in this process on a LocalCluster: leadership, REST, forwarding, replay.

The workers are real (`connect.worker.Worker`: uvicorn on port 0, the fenced config log, group
membership on the broker) with short timings. Connectors here are created PAUSED or STOPPED, so
no Spark query starts (the data path is tested with real Spark in tests/spark).
"""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from ferrymq.connect.config import WorkerConfig
from ferrymq.connect.plugin import ConnectorPlugin, Plugins
from ferrymq.connect.records import OffsetEntry
from ferrymq.connect.worker import Worker, WorkerStartError
from ferrymq.connectors.runtime import SparkTaskRunner
from ferrymq.testing import LocalCluster

PAUSED = {"initial_state": "PAUSED"}
STOPPED = {"initial_state": "STOPPED"}


def replicator(topics: str = "src", **extra: str) -> dict[str, str]:
    return {
        "connector.class": "FerrymqReplicator",
        "topics": topics,
        "target.topic.format": "${topic}-copy",
        **extra,
    }


def worker_config(cluster: LocalCluster, root: Path, name: str, **changes: Any) -> WorkerConfig:
    return WorkerConfig(
        namesrv_addr=cluster.namesrv_addr,
        worker_id=name,
        http_port=0,
        store_path_root_dir=root / name,
        heartbeat_interval_ms=100,
        session_timeout_ms=1000,
        leader_failover_grace_ms=200,
        task_reassign_grace_ms=300,
        rest_request_timeout_ms=10_000,
        **changes,
    )


def make_worker(
    cluster: LocalCluster, root: Path, name: str, plugins: Plugins | None = None, **changes: Any
) -> Worker:
    config = worker_config(cluster, root, name, **changes)
    plugins = plugins or Plugins()
    runner = SparkTaskRunner(
        plugins,
        cluster_id=config.connect_cluster_id,
        namesrv_addr=config.namesrv_addr,
        state_dir=config.store_path_root_dir,
    )
    return Worker(config, runner=runner, plugins=plugins)


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
    deadline = time.monotonic() + timeout
    while True:
        leaders = [w for w in group if w._herder is not None and w.herder.is_leader]
        if len(leaders) == 1 and all(
            w.herder.leader()[0] == leaders[0].worker_id for w in group if w._herder is not None
        ):
            return leaders[0]
        assert time.monotonic() < deadline, (
            f"no single leader: {[w.herder.leader() for w in group]}"
        )
        await asyncio.sleep(0.05)


async def call(url: str, method: str, path: str, body: Any = None, **params: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=20) as client:
        return await client.request(method, url + path, json=body, params=params or None)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(tmp_path / "ferry") as local:
        yield local


async def test_workers_started_together_elect_one_leader_with_one_claim_per_epoch(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    async with workers(cluster, tmp_path, 3) as group:
        leader = await leader_of(group)
        for worker in group:
            health = await call(worker.url, "GET", "/health")
            deadline = time.monotonic() + 10
            while health.status_code != 200:
                assert time.monotonic() < deadline, health.text
                await asyncio.sleep(0.05)
                health = await call(worker.url, "GET", "/health")
        log = (await call(leader.url, "GET", "/log")).json()
        claims = [r for r in log if r["kind"] == "Claim"]
        epochs = [c["record"]["epoch"] for c in claims]
        assert epochs == sorted(set(epochs))  # exactly one claim per epoch, in order
        assert claims[-1]["writer"] == leader.worker_id
        root = (await call(group[0].url, "GET", "/")).json()
        assert root["leader"]["worker_id"] == leader.worker_id
        assert root["kafka_cluster_id"] == "DefaultConnectCluster"


async def test_follower_writes_pass_the_leader_s_status_and_body_through(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    async with workers(cluster, tmp_path, 3) as group:
        leader = await leader_of(group)
        follower = next(w for w in group if w is not leader)
        url = follower.url
        created = await call(
            url, "POST", "/connectors", {"name": "a", "config": replicator(), **PAUSED}
        )
        assert created.status_code == 201, created.text
        assert created.headers["Location"] == "/connectors/a"
        assert created.json()["name"] == "a"
        assert created.json()["type"] == "source"
        assert created.headers["X-Ferry-Leader"] == leader.url
        offset = int(created.headers["X-Ferry-Config-Offset"])
        again = await call(
            url, "POST", "/connectors", {"name": "a", "config": replicator(), **PAUSED}
        )
        assert again.status_code == 409
        assert again.json() == {"error_code": 409, "message": "Connector a already exists"}
        bad = await call(
            url, "POST", "/connectors", {"name": "b", "config": {"connector.class": "Nope"}}
        )
        assert bad.status_code == 400
        assert "Nope" in bad.json()["message"]
        missing = await call(url, "PUT", "/connectors/ghost/pause")
        assert missing.status_code == 404
        assert missing.json()["error_code"] == 404
        put = await call(url, "PUT", "/connectors/a/config", replicator(topics="src,other"))
        assert put.status_code == 200
        assert len(put.json()["tasks"]) == 1
        put_new = await call(url, "PUT", "/connectors/c/config", replicator())
        assert put_new.status_code == 201  # created: it will run, so stop it at once
        assert (await call(url, "PUT", "/connectors/c/stop")).status_code == 204
        patched = await call(url, "PATCH", "/connectors/a/config", {"tasks.max": "2", "x": None})
        assert patched.status_code == 200
        assert len(patched.json()["tasks"]) == 2
        assert (await call(url, "PUT", "/connectors/a/pause")).status_code == 202
        assert (await call(url, "PUT", "/connectors/a/stop")).status_code == 204
        partition = {"topic": "src", "broker": "broker-a", "queue": 0}
        offsets = {"offsets": [{"partition": partition, "offset": {"offset": 5}}]}
        assert (await call(url, "PATCH", "/connectors/a/offsets", offsets)).status_code == 200
        # the plugin's check_offsets: 400 with its reason, nothing written
        malformed = {"offsets": [{"partition": {"topic": "src"}, "offset": {"offset": 5}}]}
        refused = await call(url, "PATCH", "/connectors/a/offsets", malformed)
        assert refused.status_code == 400
        assert "a partition is" in refused.json()["message"]
        assert (await call(url, "DELETE", "/connectors/a/offsets")).status_code == 200
        assert (await call(url, "PUT", "/connectors/a/pause")).status_code == 202
        not_stopped = await call(url, "DELETE", "/connectors/a/offsets")
        assert not_stopped.status_code == 400
        assert (await call(url, "POST", "/connectors/a/restart")).status_code == 204
        restarted = await call(url, "POST", "/connectors/a/restart", includeTasks="true")
        assert restarted.status_code == 202
        assert {t["state"] for t in restarted.json()["tasks"]} == {"RESTARTING"}
        assert (await call(url, "POST", "/connectors/a/tasks/1/restart")).status_code == 204
        assert (await call(url, "POST", "/connectors/a/tasks/9/restart")).status_code == 404
        assert (await call(url, "DELETE", "/connectors/a")).status_code == 204
        assert (await call(url, "DELETE", "/connectors/a")).status_code == 404
        # read-your-writes on the third worker
        other = next(w for w in group if w is not leader and w is not follower)
        latest = int((await call(url, "DELETE", "/connectors/c")).headers["X-Ferry-Config-Offset"])
        assert latest > offset
        names = await call(other.url, "GET", "/connectors", minOffset=latest)
        assert names.json() == []


async def test_redirect_mode_answers_307_and_308_to_the_leader(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    async with workers(cluster, tmp_path, 2, rest_follower_mode="redirect") as group:
        leader = await leader_of(group)
        follower = next(w for w in group if w is not leader)
        body = {"name": "r", "config": replicator(), **PAUSED}
        async with httpx.AsyncClient() as client:
            redirect = await client.post(follower.url + "/connectors", json=body)
            assert redirect.status_code == 307
            assert redirect.headers["Location"] == leader.url + "/connectors"
            followed = await client.post(
                follower.url + "/connectors", json=body, follow_redirects=True
            )
            assert followed.status_code == 201
            put = await client.put(follower.url + "/connectors/r/stop")
            assert put.status_code == 308


async def test_bad_bodies_names_and_values_get_400_and_the_worker_stays(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    async with workers(cluster, tmp_path, 1) as group:
        url = (await leader_of(group)).url
        cases: list[tuple[str, str, Any]] = [
            ("POST", "/connectors", None),
            ("POST", "/connectors", []),
            ("POST", "/connectors", {"name": "", "config": replicator()}),
            ("POST", "/connectors", {"name": "a/b", "config": replicator()}),
            ("POST", "/connectors", {"name": "x\x01", "config": replicator()}),
            (
                "POST",
                "/connectors",
                {"name": "x", "config": {"connector.class": "FerrymqReplicator"}},
            ),
            ("POST", "/connectors", {"name": "x", "config": replicator(**{"tasks.max": "zero"})}),
            ("POST", "/connectors", {"name": "x", "config": {**replicator(), "name": "y"}}),
            (
                "POST",
                "/connectors",
                {"name": "x", "config": replicator(), "initial_state": "DANCING"},
            ),
            ("POST", "/connectors", {"name": "x", "config": {"a": {"nested": 1}}}),
            ("PUT", "/connectors/x/config", "text"),
            ("PATCH", "/connectors/x/offsets", {"offsets": "none"}),
            (
                "PUT",
                "/connector-plugins/FerrymqReplicator/config/validate",
                {"connector.class": "Other"},
            ),
        ]
        for method, path, body in cases:
            async with httpx.AsyncClient() as client:
                content = b"{not json" if body is None else None
                answer = await client.request(
                    method, url + path, json=None if body is None else body, content=content
                )
            assert answer.status_code == 400 or (
                path.endswith("offsets") and answer.status_code == 404
            ), (
                method,
                path,
                answer.status_code,
                answer.text,
            )
            assert answer.json()["error_code"] == answer.status_code
        assert (await call(url, "GET", "/health")).status_code == 200


async def test_a_config_survives_every_worker_and_a_recreated_connector_is_new(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    async with workers(cluster, tmp_path, 2) as group:
        url = (await leader_of(group)).url
        for name in ("a", "b", "c"):
            answer = await call(
                url, "POST", "/connectors", {"name": name, "config": replicator(), **PAUSED}
            )
            assert answer.status_code == 201
        assert (
            await call(url, "PATCH", "/connectors/a/config", {"tasks.max": "3"})
        ).status_code == 200
        assert (await call(url, "PUT", "/connectors/b/stop")).status_code == 204
        assert (await call(url, "DELETE", "/connectors/c")).status_code == 204
        recreate = {"name": "c", "config": replicator("other"), **STOPPED}
        assert (await call(url, "POST", "/connectors", recreate)).status_code == 201
        before = (await call(url, "GET", "/connectors", expand=["info"])).json()
        incarnation = group[0].herder.state.connectors["c"].incarnation
    async with workers(cluster, tmp_path, 1) as group:  # another number of workers
        url = (await leader_of(group)).url
        after = (await call(url, "GET", "/connectors", expand=["info"])).json()
        assert after == before
        assert group[0].herder.state.connectors["c"].incarnation == incarnation
        assert group[0].herder.state.epoch >= 2  # the new worker claimed a later epoch


async def test_a_worker_with_a_wrong_advertised_url_does_not_start(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    worker = make_worker(cluster, tmp_path, "lost", advertised_url="http://127.0.0.1:9")
    wrong = r"advertisedUrl http://127\.0\.0\.1:9 does not reach"
    with pytest.raises(WorkerStartError, match=wrong):
        await worker.start()


async def test_a_body_over_the_limit_is_refused_413_before_it_is_read(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Only the headers and a first chunk are sent: the 413 must come without the rest.

    A client that pushes the whole 2 MiB body at a server that will not read it depends on
    socket buffers and flow control (uvicorn stops reading an unread body past 64 KiB), so the
    request is written as a client sending its headers first would, and read back with a bound.
    """
    async with workers(cluster, tmp_path, 1) as group:
        url = (await leader_of(group)).url
        host, port = url.removeprefix("http://").rsplit(":", 1)
        declared = 2 << 20
        async with asyncio.timeout(20):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(
                    f"POST /connectors HTTP/1.1\r\nHost: {host}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
                    '{"name": "big", "config": {"pad": "'.encode()
                )
                await writer.drain()
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                assert head.startswith("http/1.1 413"), head
                length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
                body = json.loads(await reader.readexactly(length))
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        assert body["error_code"] == 413
        assert str(declared) in body["message"]
        assert (await call(url, "GET", "/connectors")).json() == []


class Brittle(ConnectorPlugin):
    """A plugin whose offsets check raises (a plugin bug) instead of returning its problems."""

    type = "sink"

    def check_offsets(self, config: Mapping[str, str], entries: Sequence[OffsetEntry]) -> list[str]:
        raise KeyError("lsn")

    def task_configs(self, config: Mapping[str, str], max_tasks: int) -> list[dict[str, str]]:
        return [dict(config)]


async def test_a_plugin_that_raises_or_is_not_installed_is_named_in_a_kafka_error(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    brittle = make_worker(cluster, tmp_path, "w1", Plugins({"Brittle": Brittle}))
    await brittle.start()
    try:
        url = (await leader_of([brittle])).url
        body = {"name": "b", "config": {"connector.class": "Brittle"}, **STOPPED}
        assert (await call(url, "POST", "/connectors", body)).status_code == 201
        offsets = {"offsets": [{"partition": {"q": 0}, "offset": {"offset": 5}}]}
        refused = await call(url, "PATCH", "/connectors/b/offsets", offsets)
        assert refused.status_code == 400, refused.text
        message = f"{Brittle.__module__}.Brittle failed to check them: KeyError: 'lsn'"
        assert refused.json() == {
            "error_code": 400,
            "message": f"Invalid offsets for b: the plugin {message}",
        }
    finally:
        await brittle.close()
    # a worker without the plugin reads the connector from the config log
    async with workers(cluster, tmp_path, 1) as group:
        url = (await leader_of(group)).url
        missing = await call(url, "GET", "/connectors/b/offsets")
        assert missing.status_code == 500, missing.text
        assert missing.json()["error_code"] == 500
        assert missing.json()["message"].startswith(
            "Failed to find any class that implements Connector and which name matches Brittle"
        )
