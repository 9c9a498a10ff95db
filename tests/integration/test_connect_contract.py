"""The Connect REST contract on in-process workers: Kafka Connect's JSON shapes (golden key sets and
types from Kafka's source), RocketMQ Connect's alias paths (real HTTP codes, the `{status, body}`
wrapper, `Deprecation` on GET mutations, also through a follower), and `ferry connect` (the CLI)
against the workers, tables and --json.

Tasks run on the real runtime (connect_workers.py): a connector that runs is a Spark streaming
query copying a topic of the LocalCluster, and its task's state is its query's.
"""

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ferrymq.cli.connect import connect_group
from ferrymq.testing import LocalCluster

from .connect_workers import (
    MESSAGES,
    PAUSED,
    STOPPED,
    TaskSpark,
    call,
    copied,
    leader_of,
    replicator,
    task_spark,
    task_states,
    workers,
)


@pytest.fixture(scope="module")
def spark() -> Iterator[TaskSpark]:
    """The module's SparkSession for its workers' tasks (started by the first task)."""
    with task_spark() as shared:
        yield shared


GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent / "golden" / "kafka_connect_shapes.json").read_text()
)
_KINDS: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "null": (type(None),),
}


def _is(value: Any, kind: str) -> bool:
    if kind == "integer" and isinstance(value, bool):
        return False
    return isinstance(value, _KINDS[kind])


def shape_problems(
    value: Any, shape: Any, where: str = "$", extensions: frozenset[str] = frozenset()
) -> list[str]:
    """How `value` differs from a golden shape (key sets and types); [] when it matches.

    `extensions` names ferrymq's documented additions by path (`$.tasks[*].ferrymq`).
    """
    if isinstance(shape, str):
        if any(_is(value, kind) for kind in shape.split("|")):
            return []
        return [f"{where}: {type(value).__name__} {value!r:.60}, Kafka has {shape}"]
    if isinstance(shape, list):
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, Kafka has an array"]
        return [
            problem
            for i, item in enumerate(value)
            for problem in shape_problems(item, shape[0], f"{where}[{i}]", extensions)
        ]
    if "$ref" in shape:
        return shape_problems(value, GOLDEN[shape["$ref"]], where, extensions)
    if not isinstance(value, dict):
        return [f"{where}: {type(value).__name__}, Kafka has an object"]
    if set(shape) == {"*"}:
        return [
            problem
            for key, item in value.items()
            for problem in shape_problems(item, shape["*"], f"{where}.{key}", extensions)
        ]
    keys = {key.removesuffix("?"): sub for key, sub in shape.items()}
    required = {key for key in shape if not key.endswith("?")}
    pattern = re.sub(r"\[\d+\]", "[*]", where)
    extra = {k for k in value if k not in keys and f"{pattern}.{k}" not in extensions}
    problems = [f"{where}: no {key!r}" for key in sorted(required - value.keys())]
    problems += [f"{where}: {key!r} is not Kafka's" for key in sorted(extra)]
    for key, sub in keys.items():
        if key in value:
            problems += shape_problems(value[key], sub, f"{where}.{key}", extensions)
    return problems


def assert_shape(value: Any, name: str, *extensions: str) -> None:
    problems = shape_problems(value, GOLDEN[name], "$", frozenset(extensions))
    assert not problems, f"{name}: " + "; ".join(problems)


TASK_EXTRA = "$.tasks[*].ferrymq"
"""ferrymq's documented addition to a task's status (docs/connect.md): generation, run id, ..."""


def test_the_shape_checker_finds_missing_extra_and_mistyped_keys() -> None:
    good = {"name": "a", "config": {"k": "v"}, "tasks": [{"connector": "a", "task": 0}]}
    assert shape_problems({**good, "type": "sink"}, GOLDEN["ConnectorInfo"]) == []
    assert shape_problems(good, GOLDEN["ConnectorInfo"]) == ["$: no 'type'"]
    bad = {**good, "type": "sink", "extra": 1, "tasks": [{"connector": "a", "task": True}]}
    assert shape_problems(bad, GOLDEN["ConnectorInfo"]) == [
        "$: 'extra' is not Kafka's",
        "$.tasks[0].task: bool True, Kafka has integer",
    ]
    assert shape_problems({"config": {"k": 1}}, {"config": {"*": "string"}}) == [
        "$.config.k: int 1, Kafka has string"
    ]


@pytest.mark.spark
@pytest.mark.timeout(300)  # a first task starts the SparkSession
async def test_json_shapes_are_kafka_connect_s(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    async with workers(cluster, spark, tmp_path / "workers", 1) as group:
        url = (await leader_of(group)).url
        root = (await call(url, "GET", "/")).json()
        assert_shape(root, "ServerInfo", "$.worker_id", "$.leader", "$.config_offset")
        request = {"name": "a", "config": replicator("src,more", **{"tasks.max": "2"}), **PAUSED}
        assert_shape(request, "CreateConnectorRequest")
        created = await call(url, "POST", "/connectors", request)
        assert created.status_code == 201, created.text
        assert_shape(created.json(), "ConnectorInfo")
        assert created.json()["type"] == "source"  # ConnectorType: source, sink or unknown
        stopped = {"name": "b", "config": replicator(), **STOPPED}
        assert (await call(url, "POST", "/connectors", stopped)).status_code == 201
        for method, path, body in (
            ("GET", "/connectors/a", None),
            ("PUT", "/connectors/a/config", replicator("src,more", **{"tasks.max": "2", "x": "1"})),
            ("PATCH", "/connectors/a/config", {"x": None}),
        ):
            answer = await call(url, method, path, body)
            assert answer.status_code == 200, (path, answer.text)
            assert_shape(answer.json(), "ConnectorInfo")
        status = (await call(url, "GET", "/connectors/a/status")).json()
        assert_shape(status, "ConnectorStateInfo", TASK_EXTRA)
        assert len(status["tasks"]) == 2
        assert {t["state"] for t in status["tasks"]} <= {"UNASSIGNED", "PAUSED"}
        task = (await call(url, "GET", "/connectors/a/tasks/1/status")).json()
        assert_shape(task, "TaskState", "$.ferrymq")
        expanded = (await call(url, "GET", "/connectors", expand=["status", "info"])).json()
        assert sorted(expanded) == ["a", "b"]
        for entry in expanded.values():
            assert sorted(entry) == ["info", "status"]
            assert_shape(entry["info"], "ConnectorInfo")
            assert_shape(entry["status"], "ConnectorStateInfo", TASK_EXTRA)
        tasks = (await call(url, "GET", "/connectors/a/tasks")).json()
        assert len(tasks) == 2
        for item in tasks:
            assert_shape(item, "TaskInfo")
        restarted = await call(url, "POST", "/connectors/a/restart", includeTasks="true")
        assert restarted.status_code == 202
        assert_shape(restarted.json(), "ConnectorStateInfo", TASK_EXTRA)

        plugins = (await call(url, "GET", "/connector-plugins")).json()
        assert {p["class"].rsplit(".", 1)[-1] for p in plugins} >= {"FerrymqReplicator"}
        for plugin in plugins:
            assert_shape(plugin, "PluginInfo")
            assert plugin["type"] in ("source", "sink")
        keys = (await call(url, "GET", "/connector-plugins/FerrymqReplicator/config")).json()
        assert {k["name"] for k in keys} >= {"name", "connector.class", "tasks.max", "topics"}
        for key in keys:
            assert_shape(key, "ConfigKeyInfo")
        invalid = replicator(name="v", **{"tasks.max": "zero"})
        infos = await call(
            url, "PUT", "/connector-plugins/FerrymqReplicator/config/validate", invalid
        )
        assert infos.status_code == 200
        assert_shape(infos.json(), "ConfigInfos")
        assert infos.json()["error_count"] == 1
        (bad,) = [c for c in infos.json()["configs"] if c["value"]["errors"]]
        assert bad["value"]["name"] == "tasks.max"

        offsets = (await call(url, "GET", "/connectors/b/offsets")).json()
        assert_shape(offsets, "ConnectorOffsets")
        kafka_offsets = {
            "offsets": [
                {
                    "partition": {"topic": "src", "broker": "broker-a", "queue": 0},
                    "offset": {"offset": 7},
                },
                {"partition": {"topic": "src", "broker": "broker-a", "queue": 1}, "offset": None},
            ]
        }
        altered = await call(url, "PATCH", "/connectors/b/offsets", kafka_offsets)
        assert altered.status_code == 200, altered.text
        assert_shape(altered.json(), "Message")
        reset = await call(url, "DELETE", "/connectors/b/offsets")
        assert reset.status_code == 200
        assert_shape(reset.json(), "Message")

        errors: list[tuple[str, str, Any, int]] = [
            ("GET", "/connectors/nope", None, 404),
            ("POST", "/connectors", request, 409),
            ("PATCH", "/connectors/a/offsets", kafka_offsets, 400),  # not STOPPED
            ("GET", "/connector-plugins/Nope/config", None, 404),
        ]
        for method, path, body, code in errors:
            answer = await call(url, method, path, body)
            assert answer.status_code == code, (path, answer.text)
            assert_shape(answer.json(), "ErrorMessage")
            assert answer.json()["error_code"] == code


def wrapped(answer: Any, status: int) -> Any:
    """The body of RocketMQ Connect's `{status, body}` answer, checked against the HTTP status."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert sorted(body) == ["body", "status"], body
    assert body["status"] == status
    return body["body"]


@pytest.mark.spark
@pytest.mark.timeout(300)  # a first task starts the SparkSession
async def test_rocketmq_aliases_answer_real_http_codes_in_their_wrapper(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    async with workers(cluster, spark, tmp_path / "workers", 2) as group:
        leader = await leader_of(group)
        follower = next(w for w in group if w is not leader)
        for url in (leader.url, follower.url):
            assert wrapped(await call(url, "GET", "/connectors/list"), 200) == []
        # POST /connectors/{c}: a raw config creates (or updates) the connector
        created = await call(follower.url, "POST", "/connectors/r1", replicator())
        assert wrapped(created, 200) == "success"
        assert "Deprecation" not in created.headers  # a POST is no GET mutation
        updated = await call(leader.url, "POST", "/connectors/r1", replicator(topics="other"))
        assert wrapped(updated, 200) == "success"
        offset = int(updated.headers["X-Ferry-Config-Offset"])
        config = await call(follower.url, "GET", "/connectors/r1/config", minOffset=offset)
        assert config.json()["topics"] == "other"
        bad = await call(leader.url, "POST", "/connectors/r2", {"connector.class": "Nope"})
        assert bad.status_code == 400
        assert bad.json()["error_code"] == 400
        assert "Nope" in bad.json()["message"]
        assert (
            await call(
                leader.url, "POST", "/connectors", {"name": "r2", "config": replicator(), **STOPPED}
            )
        ).status_code == 201

        assert wrapped(await call(follower.url, "GET", "/connectors/list"), 200) == ["r1", "r2"]
        for url in (leader.url, follower.url):  # GET mutations: 202 and a Deprecation header
            for verb in ("pause", "resume"):
                answer = await call(url, "GET", f"/connectors/r1/{verb}")
                assert wrapped(answer, 202) == "success"
                assert answer.headers.get("Deprecation") == "true", (url, verb, answer.headers)
        missing = await call(follower.url, "GET", "/connectors/ghost/pause")
        assert missing.status_code == 404
        assert missing.json() == {"error_code": 404, "message": "Connector ghost not found"}

        for url in (leader.url, follower.url):
            info = wrapped(await call(url, "GET", "/getClusterInfo"), 200)
            assert info["leader"]["worker_id"] == leader.worker_id
            assert sorted(m["worker_id"] for m in info["members"]) == ["w1", "w2"]
        deadline = time.monotonic() + 10
        while True:  # r1 runs (one task, assigned by the leader after its creation)
            allocated: list[dict[str, Any]] = []
            configs: dict[str, Any] = {}
            agree = True
            for worker in group:
                tasks = wrapped(await call(worker.url, "GET", "/allocated/tasks"), 200)
                connectors = wrapped(await call(worker.url, "GET", "/allocated/connectors"), 200)
                agree &= sorted(connectors) == sorted({t["connector"] for t in tasks})
                allocated += tasks
                configs.update(connectors)
            if allocated and agree:
                assert configs == {"r1": replicator(topics="other") | {"name": "r1"}}
                break
            assert time.monotonic() < deadline, "r1's task was never assigned"
            await asyncio.sleep(0.05)
        assert [(t["connector"], t["task"]) for t in allocated] == [("r1", 0)]
        # the task is a Spark query: RUNNING by its query's state, and it copies `other`
        status = await task_states(leader.url, "r1", {"RUNNING"})
        assert status["tasks"][0]["ferrymq"]["run_id"]
        assert await copied(cluster, "other-copy", MESSAGES) == MESSAGES

        plugins = wrapped(await call(follower.url, "GET", "/plugin/list"), 200)
        assert plugins == (await call(follower.url, "GET", "/connector-plugins")).json()
        classes = wrapped(await call(follower.url, "GET", "/plugin/list/connectors"), 200)
        assert classes == [p["class"] for p in plugins]
        keys = wrapped(
            await call(follower.url, "GET", "/plugin/config", plugin="FerrymqReplicator"), 200
        )
        assert "topics" in {k["name"] for k in keys}
        assert (await call(follower.url, "GET", "/plugin/config", plugin="Nope")).status_code == 404
        assert (await call(follower.url, "GET", "/plugin/config")).status_code == 400
        infos = wrapped(
            await call(
                follower.url, "PUT", "/plugin/config/validate", replicator(topics="", name="v")
            ),
            200,
        )
        assert infos["error_count"] == 1
        no_class = await call(follower.url, "PUT", "/plugin/config/validate", {"topics": "x"})
        assert no_class.status_code == 400
        assert no_class.json()["message"] == "the config needs connector.class"

        for verb, state in (("pause", "PAUSED"), ("resume", "RUNNING")):
            answer = await call(follower.url, "GET", f"/connectors/{verb}/all")
            assert wrapped(answer, 200) == ["r1", "r2"]
            assert answer.headers.get("Deprecation") == "true"
            offset = int(answer.headers["X-Ferry-Config-Offset"])
            status = await call(follower.url, "GET", "/connectors/r2/status", minOffset=offset)
            assert status.json()["connector"]["state"] == state
        # RocketMQ's stop deletes the connector
        stopped = await call(follower.url, "GET", "/connectors/r1/stop")
        assert wrapped(stopped, 200) == "success"
        assert stopped.headers.get("Deprecation") == "true"
        assert (await call(leader.url, "GET", "/connectors/r1")).status_code == 404
        assert (await call(leader.url, "GET", "/connectors/r1/stop")).status_code == 404
        everything = await call(leader.url, "GET", "/connectors/stop/all")
        assert wrapped(everything, 200) == ["r2"]
        assert everything.headers.get("Deprecation") == "true"
        assert wrapped(await call(leader.url, "GET", "/connectors/list"), 200) == []
        for worker in group:
            assert (await call(worker.url, "GET", "/health")).status_code == 200


async def ferry_connect(url: str, *args: str, code: int = 0) -> Result:
    """`ferry connect --url URL ARGS` in a thread (the workers answer on this loop).

    CliRunner swaps the process-wide sys.stdout; pytest's live logging (--log-cli-level) swaps
    it too, from this loop's thread, and can take the CLI's output: run these without it.
    """
    result = await asyncio.to_thread(
        CliRunner().invoke, connect_group, ["--url", url, *args], catch_exceptions=False
    )
    assert result.exit_code == code, (args, result.output, result.stderr)
    return result


@pytest.mark.spark
@pytest.mark.timeout(300)  # a first task starts the SparkSession
async def test_the_cli_drives_every_command_and_alias(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    async with workers(cluster, spark, tmp_path / "workers", 2) as group:
        leader = await leader_of(group)
        follower = next(w for w in group if w is not leader)
        # an unreachable worker first: the CLI moves on to the next URL
        url = f"http://127.0.0.1:9,{follower.url}"
        config = tmp_path / "mirror.json"
        config.write_text(
            json.dumps({"name": "m", "config": replicator("src,more", **{"tasks.max": "2"})})
        )
        created = await ferry_connect(
            url, "create", "m", "-f", str(config), "--initial-state", "PAUSED"
        )
        assert "m (source, 2 tasks)" in created.output
        properties = tmp_path / "s.properties"
        properties.write_text(
            "connector.class=FerrymqReplicator\ntopics=src\ntarget.topic.format=${topic}-copy\n"
        )
        created = await ferry_connect(
            url, "--json", "create", "s", "-f", str(properties), "--initial-state", "STOPPED"
        )
        assert json.loads(created.output)["config"]["topics"] == "src"
        assert json.loads((await ferry_connect(url, "--json", "list")).output) == ["m", "s"]
        listed = await ferry_connect(url, "list", "--expand", "status", "--expand", "info")
        assert re.search(r"m\s*│\s*source\s*│\s*PAUSED\s*│\s*2", listed.output), listed.output
        assert "STOPPED" in listed.output
        got = await ferry_connect(url, "--json", "get", "m")
        assert json.loads(got.output)["tasks"] == [
            {"connector": "m", "task": 0},
            {"connector": "m", "task": 1},
        ]
        assert "target.topic.format" in (await ferry_connect(url, "get", "m")).output
        patched = await ferry_connect(
            url, "--json", "config", "m", "--set", "x=1", "--set", "tasks.max=1"
        )
        assert json.loads(patched.output)["config"]["x"] == "1"
        assert len(json.loads(patched.output)["tasks"]) == 1
        unset = await ferry_connect(url, "--json", "config", "m", "--unset", "x")
        assert "x" not in json.loads(unset.output)["config"]
        shown = await ferry_connect(url, "config", "m")
        assert "FerrymqReplicator" in shown.output
        status = await ferry_connect(url, "--json", "status", "m")
        assert json.loads(status.output)["connector"]["state"] == "PAUSED"
        assert "task 0" in (await ferry_connect(url, "status", "m")).output
        tasks = await ferry_connect(url, "--json", "tasks", "m")
        assert [t["id"]["task"] for t in json.loads(tasks.output)] == [0]
        assert "m tasks" in (await ferry_connect(url, "tasks", "m")).output
        assert "m: stop requested" in (await ferry_connect(url, "stop", "m")).output
        assert "m: pause requested" in (await ferry_connect(url, "pause", "m")).output
        await ferry_connect(url, "stop", "m")

        offsets = tmp_path / "offsets.json"
        offsets.write_text(
            json.dumps(
                {
                    "offsets": [
                        {
                            "partition": {"topic": "src", "broker": "broker-a", "queue": 0},
                            "offset": {"offset": 3},
                        }
                    ]
                }
            )
        )
        altered = await ferry_connect(url, "offsets", "m", "alter", "-f", str(offsets))
        assert "altered successfully" in altered.output
        assert "reset successfully" in (await ferry_connect(url, "offsets", "m", "reset")).output
        assert json.loads((await ferry_connect(url, "--json", "offsets", "m")).output) == {
            "offsets": []
        }
        assert "m offsets" in (await ferry_connect(url, "offsets", "m")).output
        refused = await ferry_connect(url, "offsets", "m", "alter", code=2)
        assert "needs -f FILE" in refused.output + refused.stderr

        plugins = json.loads((await ferry_connect(url, "--json", "plugins")).output)
        assert "ferrymq.connectors.replicator.FerrymqReplicator" in {p["class"] for p in plugins}
        assert "FerrymqReplicator" in (await ferry_connect(url, "plugins")).output
        keys = await ferry_connect(url, "plugins", "--config", "FerrymqReplicator")
        assert "topics" in keys.output
        validated = await ferry_connect(
            url, "--json", "plugins", "--validate", "FerrymqReplicator", "-f", str(properties)
        )
        assert json.loads(validated.output)["error_count"] == 1  # no name, as in Kafka
        named = tmp_path / "named.properties"
        named.write_text(properties.read_text() + "name=v\n")
        table = await ferry_connect(
            url, "plugins", "--validate", "FerrymqReplicator", "-f", str(named)
        )
        assert re.search(r"FerrymqReplicator: 0\s+error\(s\)", table.output), table.output

        cluster_view = json.loads((await ferry_connect(url, "--json", "cluster")).output)
        assert cluster_view["leader"]["worker_id"] == leader.worker_id
        assert f"{leader.worker_id} (leader)" in (await ferry_connect(url, "cluster")).output
        records = json.loads((await ferry_connect(url, "--json", "log")).output)
        kinds = [r["kind"] for r in records]
        assert kinds[0] == "Claim"
        assert {"ConnectorPut", "TargetPut", "OffsetsPut"} <= set(kinds)
        assert all(r["epoch"] >= 1 and r["writer"] for r in records)
        assert "config log" in (await ferry_connect(url, "log", "--from", "1")).output

        # RocketMQ connectAdmin's names
        config_alias = await ferry_connect(url, "queryConnectorConfig", "-c", "m")
        assert "FerrymqReplicator" in config_alias.output
        assert "STOPPED" in (await ferry_connect(url, "queryConnectorStatus", "-c", "m")).output
        assert "epoch" in (await ferry_connect(url, "getClusterInfo")).output
        allocated = json.loads((await ferry_connect(url, "getAllocatedInfo")).output)
        assert sorted(allocated) == ["connectors", "tasks"]
        json.loads((await ferry_connect(url, "getAllocatedTasks")).output)
        await ferry_connect(url, "createConnector", "-c", "p", "-p", str(properties))
        assert "p: deleted" in (await ferry_connect(url, "stopConnector", "-c", "p")).output
        assert "m: deleted" in (await ferry_connect(url, "delete", "m")).output
        gone = await ferry_connect(url, "get", "m", code=1)
        assert "Connector m not found (HTTP 404)" in gone.stderr
        assert json.loads((await ferry_connect(url, "stopAll")).output) == {
            "status": 200,
            "body": ["s"],
        }
        assert json.loads((await ferry_connect(url, "--json", "list")).output) == []
        nobody = await ferry_connect("http://127.0.0.1:9", "list", code=1)
        assert "no worker reachable" in nobody.stderr


@pytest.mark.spark
@pytest.mark.timeout(300)  # a first task starts the SparkSession
async def test_the_cli_follows_a_follower_s_redirect(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    root = tmp_path / "workers"
    async with workers(cluster, spark, root, 2, rest_follower_mode="redirect") as group:
        leader = await leader_of(group)
        follower = next(w for w in group if w is not leader)
        config = tmp_path / "r.json"
        config.write_text(json.dumps(replicator()))
        created = await ferry_connect(
            follower.url, "--json", "create", "r", "-f", str(config), "--initial-state", "STOPPED"
        )
        assert json.loads(created.output)["name"] == "r"
        await ferry_connect(follower.url, "pause", "r")
        await ferry_connect(follower.url, "delete", "r")
        assert (await call(leader.url, "GET", "/connectors")).json() == []
