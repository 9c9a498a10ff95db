"""Regressions found by the schemathesis run (test_connect_schemathesis.py): connector names that
need percent-encoding, and an empty `tasks.max`.

- A name outside Latin-1 made the 201's `Location` header unencodable: a 500 for a creation that
  had been committed. `Location` is now percent-encoded, as a URI is.
- A follower forwarded (or redirected to) the decoded path, so `?`, `#` or `%XX` inside a name
  changed the request the leader got (`a%20b` became `a b`; `a?b` lost its tail and got a 405).
- `tasks.max` set to "" passed validation (empty means not given) and then failed `int("")`: a
  500. It now means the default, 1.
"""

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from ferrymq.testing import LocalCluster

from .connect_workers import (
    PAUSED,
    STOPPED,
    TaskSpark,
    call,
    leader_of,
    replicator,
    task_spark,
    workers,
)


@pytest.fixture(scope="module")
def spark() -> Iterator[TaskSpark]:
    """The module's SparkSession for its workers' tasks (started by the first task)."""
    with task_spark() as shared:
        yield shared


pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]  # a first task starts Spark

NAMES = ["ñame-\U000108a5", "a%20b", "a?b#c", "100%"]


async def test_names_needing_encoding_work_on_the_leader_and_through_a_follower(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    async with workers(cluster, spark, tmp_path / "workers", 2) as group:
        leader = await leader_of(group)
        follower = next(w for w in group if w is not leader)
        async with httpx.AsyncClient(timeout=20) as client:
            for name in NAMES:
                body = {"name": name, "config": replicator(), **STOPPED}
                created = await client.post(leader.url + "/connectors", json=body)
                assert created.status_code == 201, (name, created.text)
                location = created.headers["Location"]
                assert location == "/connectors/" + quote(name, safe="")
                assert location.isascii()
                got = await client.get(leader.url + location)
                assert got.status_code == 200, (name, got.text)
                assert got.json()["name"] == name
                path = "/connectors/" + quote(name, safe="")
                # through the follower: PUT (update), pause, then PUT creating another one
                updated = await client.put(
                    follower.url + path + "/config", json=replicator(topics="other")
                )
                assert updated.status_code == 200, (name, updated.text)
                assert updated.json()["name"] == name
                paused = await client.put(follower.url + path + "/pause")
                assert paused.status_code == 202, (name, paused.text)
                again = quote(name + "-2", safe="")
                created = await client.put(
                    follower.url + f"/connectors/{again}/config", json=replicator()
                )
                assert created.status_code == 201, (name, created.text)
                assert created.headers["Location"] == f"/connectors/{again}"
            names = (await call(leader.url, "GET", "/connectors")).json()
            assert sorted(names) == sorted([*NAMES, *(n + "-2" for n in NAMES)])
            for name in NAMES:
                status = await client.get(
                    leader.url + "/connectors/" + quote(name, safe="") + "/status"
                )
                assert status.json()["connector"]["state"] == "PAUSED", name


async def test_a_follower_s_redirect_names_the_same_connector(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    root = tmp_path / "workers"
    async with workers(cluster, spark, root, 2, rest_follower_mode="redirect") as group:
        leader = await leader_of(group)
        follower = next(w for w in group if w is not leader)
        async with httpx.AsyncClient(timeout=20) as client:
            for name in NAMES:
                path = "/connectors/" + quote(name, safe="")
                put = await client.put(follower.url + path + "/config", json=replicator())
                assert put.status_code == 308, (name, put.text)
                assert put.headers["Location"] == leader.url + path + "/config"
                followed = await client.put(
                    follower.url + path + "/config", json=replicator(), follow_redirects=True
                )
                assert followed.status_code == 201, (name, followed.text)
                assert followed.json()["name"] == name
                restart = await client.post(
                    follower.url + path + "/restart", params={"includeTasks": "true", "x": "a&b"}
                )
                assert restart.status_code == 307
                assert restart.headers["Location"] == (
                    leader.url + path + "/restart?includeTasks=true&x=a%26b"
                )


async def test_an_empty_tasks_max_means_the_default(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    async with workers(cluster, spark, tmp_path / "workers", 1) as group:
        url = (await leader_of(group)).url
        body = {"name": "e", "config": replicator("src,more", **{"tasks.max": ""}), **PAUSED}
        created = await call(url, "POST", "/connectors", body)
        assert created.status_code == 201, created.text
        assert len(created.json()["tasks"]) == 1
        patched = await call(url, "PATCH", "/connectors/e/config", {"tasks.max": "2"})
        assert len(patched.json()["tasks"]) == 2
        patched = await call(url, "PATCH", "/connectors/e/config", {"tasks.max": ""})
        assert patched.status_code == 200, patched.text
        assert len(patched.json()["tasks"]) == 1
        assert (await call(url, "GET", "/health")).status_code == 200
