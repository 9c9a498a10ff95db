"""schemathesis against a Connect worker's own OpenAPI spec (`/openapi.json`).

One in-process worker (the leader) on a LocalCluster, tasks on the real runtime (a generated
create or resume starts a Spark query; a PostgreSQL plugin's task fails to start, its server
unreachable), with connectors created PAUSED and STOPPED. Every operation of the spec gets
generated requests that fit the spec (positive) and that break it (negative), once with free
path parameters and once aimed at each existing connector; the fixtures are put back before each
operation. Every answer must:

- never be a 5xx (the worker's 504 needs a leader lost in mid-call, which cannot happen here);
- have a status, content type and (for JSON) body the spec documents (schemathesis'
  status_code_conformance, content_type_conformance, response_schema_conformance);
- reject a request that breaks the spec with a 4xx (negative_data_rejection): bad bodies, names,
  parameters and config values get a 400 with a message, never FastAPI's 422;
- carry Kafka's error body, `{"error_code": <the status>, "message": <text>}`, when it is an
  error (GET /health answers `{status, message}` instead, as in KIP-1017).

Deterministic: Hypothesis derandomized, no example database. `minOffset` is clamped to what the
worker has read, so a read does not wait out the request timeout for an offset nobody writes.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from ferrymq.connect.plugin import ConfigKey, Plugins
from ferrymq.connect.worker import Worker
from ferrymq.testing import LocalCluster

from .connect_workers import TaskSpark, call, leader_of, replicator, task_spark, workers


@pytest.fixture(scope="module")
def spark() -> Iterator[TaskSpark]:
    """The module's SparkSession for its workers' tasks (started by the first task)."""
    with task_spark() as shared:
        yield shared


pytestmark = pytest.mark.spark
log = logging.getLogger(__name__)

FIXTURES: dict[str, tuple[dict[str, str], str]] = {
    "paused-a": (replicator("src,more", **{"tasks.max": "2"}), "PAUSED"),
    "stopped-b": (replicator(), "STOPPED"),
}
"""The connectors every operation starts from: name -> (config, target state)."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
FREE_EXAMPLES = 15
"""Per operation and mode, with free path parameters."""
AIMED_EXAMPLES = 5
"""Per operation, mode and fixture connector."""
CONFIG_EXAMPLES = 60
"""Per route that takes a connector config."""
VALID: dict[str, dict[str, str]] = {
    "FerrymqReplicator": {"topics": "src", "target.topic.format": "${topic}-copy"},
    "PostgresSink": {
        "topics": "src",
        "connection.url": "postgresql://u@127.0.0.1:1/db",
        "fields": "id bigint not null, v text",
    },
    "PostgresSource": {
        "connection.url": "postgresql://u@127.0.0.1:1/db",
        "mode": "incrementing",
        "incrementing.column.name": "id",
        "table.whitelist": "t",
        "topic.prefix": "pg-",
    },
}
"""The plugins whose config values are fuzzed (their validation and task split are pure), with a
valid config each that the fuzzer changes a few keys of."""
FUZZED_PLUGINS = tuple(VALID)
PLAUSIBLE = (
    "", " ", "0", "1", "-1", "true", "none", "all", "earliest", "latest", "src", "src,more",
    "${topic}-copy", "${topic}", "bad topic", "9" * 25, "1e3", "1.5", "\x00",
    "127.0.0.1:9876", "postgresql://u@127.0.0.1:1/db", "jdbc:postgresql://h/db",
    "id bigint not null, v text", "id numeric(99,2)", "id", "record_value", "upsert",
    "incrementing", "SELECT 1",
)  # fmt: skip
"""Values a config key may plausibly get, right or wrong, besides random text."""


def config_values(key: ConfigKey) -> st.SearchStrategy[str]:
    """Values for one key: plausible ones, its choices and default, random text.

    `tasks.max` stays small: PostgresSink makes one task config per `tasks.max` whatever its
    work, so a huge one would take the worker's memory (reported, not fixed here).
    """
    if key.name == "tasks.max":
        return st.one_of(
            st.integers(-2, 64).map(str), st.sampled_from(["", "x", "1.5", "0x10", " 2"])
        )
    known = [v for v in (*PLAUSIBLE, *key.choices, key.default) if v is not None]
    return st.one_of(st.sampled_from(known), st.text(max_size=40))


def plugin_configs(
    names: list[str], valid: dict[str, str], values: dict[str, st.SearchStrategy[str]]
) -> st.SearchStrategy[dict[str, str]]:
    """A valid config with up to 3 keys changed (3 in 4), or any of the plugin's keys."""
    classes = st.sampled_from(names)
    changed = st.dictionaries(st.sampled_from(sorted(values)), st.nothing(), max_size=3).flatmap(
        lambda keys: st.fixed_dictionaries({k: values[k] for k in keys})
    )
    anything = st.fixed_dictionaries({}, optional=values)

    def config(
        connector_class: str, base: dict[str, str], change: dict[str, str]
    ) -> dict[str, str]:
        return {"connector.class": connector_class, **base, **change}

    return st.one_of(
        st.builds(config, classes, st.just(valid), changed),
        st.builds(config, classes, st.just(valid), changed),
        st.builds(config, classes, st.just(valid), changed),
        st.builds(config, classes, st.just({}), anything),
    )


def connector_configs(plugins: Plugins) -> st.SearchStrategy[dict[str, str]]:
    """Configs of the fuzzed plugins (by short name or class path)."""
    choices = []
    for short, valid in VALID.items():
        path, cls = plugins.resolve(short)
        values = {
            key.name: config_values(key)
            for key in cls.config_keys()
            if key.name not in ("name", "connector.class")
        }
        choices.append(plugin_configs([short, path], valid, values))
    return st.one_of(choices)


def path_safe(value: Any) -> Any:
    """A path parameter schemathesis can send: it leaves `?` and `#` unencoded in the path, so
    the server would see another path (`/connectors/a?b/config` is `/connectors/a`)."""
    return value.replace("?", "_").replace("#", "_") if isinstance(value, str) else value


class Fuzzer:
    """Runs the generated requests of one spec against one worker (in a thread of its own)."""

    def __init__(self, spec: dict[str, Any], worker: Worker) -> None:
        self.schema = schemathesis.openapi.from_dict(spec)
        self.worker = worker
        self.url = worker.url
        self.session = requests.Session()
        self.failures: dict[tuple[str, int, str], str] = {}
        self.requests = 0
        self.statuses: dict[int, int] = {}

    def operations(self) -> Iterator[Any]:
        """Every operation (an APIOperation) of the spec."""
        for result in self.schema.get_all_operations():
            yield result.ok()  # type: ignore[union-attr]

    def restore(self) -> None:
        """Put the fixture connectors back as they were (an operation may delete or stop them)."""
        url = self.url
        view = self.session.get(
            f"{url}/connectors", params={"expand": ["info", "status"]}, timeout=10
        ).json()
        for name, (config, target) in FIXTURES.items():
            if name not in view:
                body: dict[str, Any] = {"name": name, "config": config, "initial_state": target}
                created = self.session.post(f"{url}/connectors", json=body, timeout=10)
                assert created.status_code == 201, created.text
                continue
            if view[name]["status"]["connector"]["state"] != target:
                verb = {"PAUSED": "pause", "STOPPED": "stop"}[target]
                changed = self.session.put(f"{url}/connectors/{name}/{verb}", timeout=10)
                assert changed.status_code in (202, 204), changed.text
            if view[name]["info"]["config"] != {**config, "name": name}:
                put = self.session.put(f"{url}/connectors/{name}/config", json=config, timeout=10)
                assert put.status_code == 200, put.text

    def clamp(self, case: Any) -> Any:
        """`minOffset` at most what the worker has read; path parameters without `?` or `#`."""
        query = case.query
        if isinstance(query, dict):
            wanted = query.get("minOffset")
            if isinstance(wanted, int) and not isinstance(wanted, bool):
                query["minOffset"] = min(wanted, self.worker.herder.log.config_offset)
        if isinstance(case.path_parameters, dict):
            for key, value in case.path_parameters.items():
                case.path_parameters[key] = path_safe(value)
        return case

    def check(self, case: Any) -> None:
        self.requests += 1
        try:
            response = case.call(base_url=self.url, session=self.session, timeout=5)
        except requests.RequestException as exc:  # no answer: the worst finding of all
            key = (f"{case.method} {case.path}", 0, type(exc).__name__)
            self.failures.setdefault(key, f"{case.as_curl_command()}\n  no answer: {exc!r}")
            return
        status = response.status_code
        self.statuses[status] = self.statuses.get(status, 0) + 1
        problems: list[str] = []
        try:
            case.validate_response(response, checks=CHECKS)
        except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - reported at the end
            problems.append(" ".join(str(exc).split())[:600])
        if status >= 400 and case.path != "/health":
            try:
                body = response.json()
            except ValueError:
                body = None
            if not (
                isinstance(body, dict)
                and set(body) == {"error_code", "message"}
                and body["error_code"] == status
                and isinstance(body["message"], str)
                and body["message"]
            ):
                problems.append(f"not Kafka's error body: {response.text[:200]!r}")
        if problems:
            key = (f"{case.method} {case.path}", status, problems[0][:80])
            self.failures.setdefault(key, f"{case.as_curl_command()}\n  " + "\n  ".join(problems))

    def run(self, operation: Any, mode: GenerationMode, **aimed: str) -> None:
        try:
            strategy = operation.as_strategy(generation_mode=mode, path_parameters=aimed or None)
        except Exception:  # noqa: BLE001 - nothing in this operation can break the spec
            return

        @hypothesis.settings(
            max_examples=AIMED_EXAMPLES if aimed else FREE_EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis.given(case=strategy.map(self.clamp))
        def generated(case: Any) -> None:
            self.check(case)

        with contextlib.suppress(hypothesis.errors.Unsatisfiable):
            generated()

    def run_configs(self, operation: Any, bodies: st.SearchStrategy[tuple[str, Any]]) -> None:
        """Requests whose bodies carry fuzzed connector configs (path parameter, body)."""

        @hypothesis.settings(
            max_examples=CONFIG_EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @hypothesis.given(aimed=bodies)
        def generated(aimed: tuple[str, Any]) -> None:
            parameter, body = aimed
            parameters = {
                "plugin" if "{plugin}" in operation.path else "name": path_safe(parameter)
            }
            self.check(
                self.schema.make_case(
                    operation=operation,
                    path_parameters=parameters if "{" in operation.path else None,
                    body=body,
                    media_type="application/json",
                )
            )

        generated()

    def run_config_values(self) -> None:
        """Fuzzed connector configs on every route that takes one."""
        configs = connector_configs(self.worker.plugins)
        names = st.one_of(st.sampled_from([*FIXTURES, "fz"]), st.text(min_size=1, max_size=12))
        initial = st.sampled_from(["RUNNING", "PAUSED", "STOPPED"])
        created = st.builds(
            lambda name, config, state: ("", {"name": name, "config": config, **state}),
            names,
            configs,
            st.one_of(st.just({}), initial.map(lambda s: {"initial_state": s})),
        )
        patches = st.dictionaries(
            st.sampled_from(["topics", "tasks.max", "target.topic.format", "fields", "x"]),
            st.one_of(st.none(), st.sampled_from(PLAUSIBLE), st.text(max_size=20)),
        )
        plugin_names = st.sampled_from([*FUZZED_PLUGINS, "Nope"])
        aimed: dict[tuple[str, str], st.SearchStrategy[tuple[str, Any]]] = {
            ("POST", "/connectors"): created,
            ("PUT", "/connectors/{name}/config"): st.tuples(names, configs),
            ("POST", "/connectors/{name}"): st.tuples(names, configs),
            ("PATCH", "/connectors/{name}/config"): st.tuples(
                st.sampled_from(list(FIXTURES)), patches
            ),
            ("PUT", "/connector-plugins/{plugin}/config/validate"): st.tuples(
                plugin_names, configs
            ),
            ("PUT", "/plugin/config/validate"): st.tuples(st.just(""), configs),
        }
        for operation in self.operations():
            bodies = aimed.get((operation.method.upper(), operation.path))
            if bodies is not None:
                self.restore()
                self.run_configs(operation, bodies)

    def run_all(self) -> None:
        for operation in self.operations():
            names = ["name"] if "{name}" in operation.path else []
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                self.restore()
                self.run(operation, mode)
                for connector in FIXTURES if names else ():
                    self.restore()
                    self.run(operation, mode, name=connector)


async def in_thread(function: Callable[[], None]) -> None:
    await asyncio.to_thread(function)


@pytest.mark.timeout(400)  # ~1,600 requests beside a JVM's start: 96 s at load 9
async def test_generated_requests_never_get_a_5xx_and_match_the_spec(
    cluster: LocalCluster, spark: TaskSpark, tmp_path: Path
) -> None:
    root = tmp_path / "workers"
    async with workers(
        cluster, spark, root, 1, budget_s=380, rest_request_timeout_ms=3000
    ) as group:
        leader = await leader_of(group)
        spec = (await call(leader.url, "GET", "/openapi.json")).json()
        fuzzer = Fuzzer(spec, leader)
        started = time.monotonic()
        try:
            await in_thread(fuzzer.restore)
            await in_thread(fuzzer.run_all)
            await in_thread(fuzzer.run_config_values)
        finally:
            fuzzer.session.close()
        log.info(
            "%d requests in %.1f s, statuses %s",
            fuzzer.requests,
            time.monotonic() - started,
            sorted(fuzzer.statuses.items()),
        )
        assert not fuzzer.failures, f"{len(fuzzer.failures)} failure(s):\n" + "\n".join(
            fuzzer.failures.values()
        )
        assert fuzzer.requests > 1000
        assert not [s for s in fuzzer.statuses if s >= 500]
        # the worker is alive, healthy and still the leader
        assert (await call(leader.url, "GET", "/health")).status_code == 200
        root = (await call(leader.url, "GET", "/")).json()
        assert root["leader"]["worker_id"] == leader.worker_id
        assert leader.herder.is_leader
