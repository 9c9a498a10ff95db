"""`ferry connect`: the Connect REST API from the command line (RocketMQ's connectAdmin).

`ferry connect --url URL[,URL...] list|create|get|config|status|tasks|pause|resume|stop|restart|
delete|offsets|plugins|cluster|log`, a table or `--json`. Any worker answers (followers send
writes to the leader); the CLI tries the next URL only when a worker cannot be reached at all
(nothing was sent), never after a request left, so a write is never sent twice. RocketMQ
connectAdmin's command names work as aliases (`createConnector -c NAME -p FILE`, `stopConnector`
(deletes, as in RocketMQ), `queryConnectorConfig`, `queryConnectorStatus`, `stopAll`,
`getClusterInfo`, `getAllocatedInfo`, `getAllocatedConnectors`, `getAllocatedTasks`).

Errors print the worker's message with its HTTP status and exit 1; bad usage exits 2.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click
import httpx

from ferrymq.cli.output import emit_json, emit_table
from ferrymq.config import ConfigError, parse_properties
from ferrymq.security.tls import process_client_tls

__all__ = ["DEFAULT_URL", "connect_group"]

DEFAULT_URL = "http://127.0.0.1:8082"
_TIMEOUT_S = 100.0
"""Longer than a worker's request timeout (90 s), so the worker's own answer arrives."""


class Rest:
    """Calls to the first reachable worker of a list."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = [u.rstrip("/") for u in urls]

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        ok: Sequence[int] = (200, 201, 202, 204),
    ) -> httpx.Response:
        """Send to the first worker that accepts a connection; exit 1 on an error answer."""
        problems: list[str] = []
        for url in self.urls:
            try:
                with httpx.Client(
                    timeout=httpx.Timeout(_TIMEOUT_S, connect=3.0),
                    verify=process_client_tls().context or True,  # ferry --tls-ca
                ) as client:
                    response = client.request(
                        method,
                        url + path,
                        params=params,
                        content=None if body is None else json.dumps(body).encode(),
                        headers={"Content-Type": "application/json"},
                        follow_redirects=True,
                    )
            except httpx.ConnectError as exc:
                problems.append(f"{url}: {exc}")
                continue  # nothing was sent: the next worker
            except httpx.HTTPError as exc:
                _die(f"{method} {url}{path}: {type(exc).__name__}: {exc}; the outcome is unknown")
            if response.status_code not in ok:
                _die(_message(response), response.status_code)
            return response
        return _die("no worker reachable: " + "; ".join(problems))


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text or response.reason_phrase
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return json.dumps(body)


def _die(message: str, status: int | None = None) -> NoReturn:
    suffix = f" (HTTP {status})" if status is not None else ""
    click.echo(f"ferry: error: {message}{suffix}", err=True)
    sys.exit(1)


def _rest(ctx: click.Context) -> Rest:
    return Rest(ctx.obj["urls"])


def _json(ctx: click.Context) -> bool:
    return bool(ctx.obj["json"])


def _load_config(path: Path) -> dict[str, str]:
    """A connector config from a JSON object ({name, config} or the config itself) or key=value."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise click.BadParameter(f"{path}: {exc.strerror or exc}") from None
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{path}: not JSON ({exc})") from None
        if isinstance(loaded, dict) and isinstance(loaded.get("config"), dict):
            loaded = {**loaded["config"], **({"name": loaded["name"]} if "name" in loaded else {})}
        if not isinstance(loaded, dict):
            raise click.BadParameter(f"{path}: a JSON object of config keys is expected")
        return {str(k): str(v) for k, v in loaded.items()}
    try:
        return parse_properties(text, str(path))
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group("connect")
@click.option(
    "--url",
    envvar="FERRY_CONNECT_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Worker REST URL(s), comma-separated (env FERRY_CONNECT_URL).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def connect_group(ctx: click.Context, url: str, as_json: bool) -> None:
    """Manage Connect connectors (and run a worker: `ferry connect worker`)."""
    ctx.ensure_object(dict)
    ctx.obj["urls"] = [u.strip() for u in url.split(",") if u.strip()]
    ctx.obj["json"] = as_json


_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception)(: |$)")


def _cause(trace: str | None) -> str:
    """The line of a trace that names the root error, else its last line.

    The root error is the last exception line other than Spark's StreamingQueryException wrapper.
    """
    lines = [line.strip() for line in (trace or "").strip().splitlines() if line.strip()]
    causes = [
        line
        for line in lines
        if _EXCEPTION_LINE.match(line) and not line.startswith(("pyspark.errors", "py4j"))
    ]
    return causes[-1] if causes else (lines[-1] if lines else "")


def _print_status(ctx: click.Context, status: dict[str, Any]) -> None:
    if _json(ctx):
        emit_json(status)
        return
    connector = status["connector"]
    rows: list[list[object]] = [
        [
            "connector",
            connector.get("state"),
            connector.get("worker_id"),
            connector.get("trace", ""),
        ]
    ]
    rows += [
        [f"task {task['id']}", task["state"], task["worker_id"], _cause(task.get("trace"))]
        for task in status["tasks"]
    ]
    emit_table(
        f"{status['name']} ({status.get('type', '')})", ["", "state", "worker", "error"], rows
    )


@connect_group.command("list")
@click.option("--expand", type=click.Choice(["status", "info"]), multiple=True)
@click.pass_context
def list_command(ctx: click.Context, expand: tuple[str, ...]) -> None:
    """The connectors (with --expand, their status or info)."""
    params = {"expand": list(expand)} if expand else None
    body = _rest(ctx).call("GET", "/connectors", params=params).json()
    if _json(ctx):
        emit_json(body)
        return
    if isinstance(body, list):
        emit_table("connectors", ["name"], [[n] for n in body])
        return
    rows = []
    for name, entry in body.items():
        status = entry.get("status", {})
        info = entry.get("info", {})
        rows.append(
            [
                name,
                info.get("type", status.get("type", "")),
                status.get("connector", {}).get("state", ""),
                len(info.get("tasks", status.get("tasks", []))),
            ]
        )
    emit_table("connectors", ["name", "type", "state", "tasks"], rows)


@connect_group.command("create")
@click.argument("name")
@click.option(
    "-f", "--file", "path", type=click.Path(dir_okay=False, path_type=Path), required=True
)
@click.option("--initial-state", type=click.Choice(["RUNNING", "PAUSED", "STOPPED"]))
@click.pass_context
def create_command(ctx: click.Context, name: str, path: Path, initial_state: str | None) -> None:
    """Create a connector from a JSON or key=value file."""
    config = _load_config(path)
    config.setdefault("name", name)
    body: dict[str, Any] = {"name": name, "config": config}
    if initial_state:
        body["initial_state"] = initial_state
    info = _rest(ctx).call("POST", "/connectors", body=body).json()
    _emit_info(ctx, info)


def _emit_info(ctx: click.Context, info: dict[str, Any]) -> None:
    if _json(ctx):
        emit_json(info)
        return
    rows = [[k, v] for k, v in sorted(info["config"].items())]
    emit_table(
        f"{info['name']} ({info['type']}, {len(info['tasks'])} tasks)", ["key", "value"], rows
    )


@connect_group.command("get")
@click.argument("name")
@click.pass_context
def get_command(ctx: click.Context, name: str) -> None:
    """A connector's config and tasks."""
    _emit_info(ctx, _rest(ctx).call("GET", f"/connectors/{name}").json())


@connect_group.command("config")
@click.argument("name")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Change a key.")
@click.option("--unset", "unsets", multiple=True, metavar="KEY", help="Remove a key.")
@click.option("-f", "--file", "path", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def config_command(
    ctx: click.Context, name: str, sets: tuple[str, ...], unsets: tuple[str, ...], path: Path | None
) -> None:
    """Show a connector's config; --set/--unset patch it, -f replaces it (or creates it)."""
    rest = _rest(ctx)
    if path is not None:
        config = _load_config(path)
        _emit_info(ctx, rest.call("PUT", f"/connectors/{name}/config", body=config).json())
        return
    if sets or unsets:
        patch: dict[str, str | None] = dict.fromkeys(unsets)
        for item in sets:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--set")
            patch[key] = value
        _emit_info(ctx, rest.call("PATCH", f"/connectors/{name}/config", body=patch).json())
        return
    config = rest.call("GET", f"/connectors/{name}/config").json()
    if _json(ctx):
        emit_json(config)
    else:
        emit_table(name, ["key", "value"], [[k, v] for k, v in sorted(config.items())])


@connect_group.command("status")
@click.argument("name")
@click.pass_context
def status_command(ctx: click.Context, name: str) -> None:
    """A connector's and its tasks' states."""
    _print_status(ctx, _rest(ctx).call("GET", f"/connectors/{name}/status").json())


@connect_group.command("tasks")
@click.argument("name")
@click.pass_context
def tasks_command(ctx: click.Context, name: str) -> None:
    """A connector's task configs."""
    tasks = _rest(ctx).call("GET", f"/connectors/{name}/tasks").json()
    if _json(ctx):
        emit_json(tasks)
        return
    emit_table(
        f"{name} tasks",
        ["task", "config"],
        [[t["id"]["task"], json.dumps(t["config"], sort_keys=True)] for t in tasks],
    )


def _target_command(verb: str, summary: str) -> click.Command:
    @click.command(verb, help=summary)
    @click.argument("name")
    @click.pass_context
    def command(ctx: click.Context, name: str) -> None:
        _rest(ctx).call("PUT", f"/connectors/{name}/{verb}")
        if _json(ctx):
            emit_json({"name": name, "requested": verb})
        else:
            click.echo(f"{name}: {verb} requested")

    return command


connect_group.add_command(_target_command("pause", "Pause a connector (its checkpoints stay)."))
connect_group.add_command(_target_command("resume", "Resume a paused or stopped connector."))
connect_group.add_command(
    _target_command("stop", "Stop a connector: its tasks end and its offsets become editable.")
)


@connect_group.command("restart")
@click.argument("name")
@click.option("--include-tasks", is_flag=True, help="Restart its tasks too.")
@click.option("--only-failed", is_flag=True, help="Only what failed.")
@click.option("--task", type=int, help="Restart only this task.")
@click.pass_context
def restart_command(
    ctx: click.Context, name: str, include_tasks: bool, only_failed: bool, task: int | None
) -> None:
    """Restart a connector, its tasks, or one task."""
    rest = _rest(ctx)
    if task is not None:
        rest.call("POST", f"/connectors/{name}/tasks/{task}/restart")
        click.echo(f"{name} task {task}: restart requested")
        return
    params = {"includeTasks": str(include_tasks).lower(), "onlyFailed": str(only_failed).lower()}
    response = rest.call("POST", f"/connectors/{name}/restart", params=params)
    if response.status_code == 202:
        _print_status(ctx, response.json())
    else:
        click.echo(f"{name}: restart requested")


@connect_group.command("delete")
@click.argument("name")
@click.pass_context
def delete_command(ctx: click.Context, name: str) -> None:
    """Delete a connector."""
    _rest(ctx).call("DELETE", f"/connectors/{name}")
    click.echo(f"{name}: deleted")


@connect_group.command("offsets")
@click.argument("name")
@click.argument("action", type=click.Choice(["get", "alter", "reset"]), default="get")
@click.option(
    "-f",
    "--file",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    help='alter: JSON {"offsets": [{"partition": {...}, "offset": {...}}]}.',
)
@click.pass_context
def offsets_command(ctx: click.Context, name: str, action: str, path: Path | None) -> None:
    """Show, alter (-f) or reset a STOPPED connector's offsets."""
    rest = _rest(ctx)
    if action == "get":
        body = rest.call("GET", f"/connectors/{name}/offsets").json()
        if _json(ctx):
            emit_json(body)
        else:
            rows = [
                [
                    json.dumps(o["partition"], sort_keys=True),
                    json.dumps(o["offset"], sort_keys=True),
                ]
                for o in body["offsets"]
            ]
            emit_table(f"{name} offsets", ["partition", "offset"], rows)
        return
    if action == "alter":
        if path is None:
            raise click.UsageError("offsets alter needs -f FILE")
        try:
            offsets = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise click.BadParameter(f"{path}: {exc}") from None
        answer = rest.call("PATCH", f"/connectors/{name}/offsets", body=offsets).json()
    else:
        answer = rest.call("DELETE", f"/connectors/{name}/offsets").json()
    click.echo(answer.get("message", ""))


@connect_group.command("plugins")
@click.option("--config", "config_of", metavar="PLUGIN", help="The keys a plugin takes.")
@click.option("--validate", metavar="PLUGIN", help="Validate a config (-f) against a plugin.")
@click.option("-f", "--file", "path", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def plugins_command(
    ctx: click.Context, config_of: str | None, validate: str | None, path: Path | None
) -> None:
    """The installed connector plugins; --config and --validate look at one."""
    rest = _rest(ctx)
    if validate is not None:
        if path is None:
            raise click.UsageError("--validate needs -f FILE")
        infos = rest.call(
            "PUT", f"/connector-plugins/{validate}/config/validate", body=_load_config(path)
        ).json()
        if _json(ctx):
            emit_json(infos)
            return
        rows = [
            [c["value"]["name"], c["value"]["value"], "; ".join(c["value"]["errors"])]
            for c in infos["configs"]
        ]
        emit_table(
            f"{infos['name']}: {infos['error_count']} error(s)", ["key", "value", "errors"], rows
        )
        return
    if config_of is not None:
        keys = rest.call("GET", f"/connector-plugins/{config_of}/config").json()
        if _json(ctx):
            emit_json(keys)
            return
        rows = [
            [k["name"], k["type"], k["required"], k["default_value"], k["documentation"]]
            for k in keys
        ]
        emit_table(config_of, ["key", "type", "required", "default", "documentation"], rows)
        return
    plugins = rest.call("GET", "/connector-plugins").json()
    if _json(ctx):
        emit_json(plugins)
    else:
        emit_table(
            "plugins",
            ["class", "type", "version"],
            [[p["class"], p["type"], p["version"]] for p in plugins],
        )


@connect_group.command("cluster")
@click.pass_context
def cluster_command(ctx: click.Context) -> None:
    """The leader, its epoch, the members and the assignment."""
    cluster = _rest(ctx).call("GET", "/cluster").json()
    if _json(ctx):
        emit_json(cluster)
        return
    assigned = cluster["assignment"]["workers"]
    rows = [
        [
            m["worker_id"]
            + (" (leader)" if m["worker_id"] == cluster["leader"]["worker_id"] else ""),
            m["url"],
            m["config_offset"],
            ", ".join(assigned.get(m["worker_id"], [])),
        ]
        for m in cluster["members"]
    ]
    emit_table(
        f"cluster {cluster['cluster_id']}: epoch {cluster['epoch']}, assignment generation "
        f"{cluster['assignment']['generation']}",
        ["worker", "url", "config offset", "tasks"],
        rows,
    )


@connect_group.command("log")
@click.option("--from", "start", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--limit", type=click.IntRange(1, 10000), default=1000, show_default=True)
@click.pass_context
def log_command(ctx: click.Context, start: int, limit: int) -> None:
    """The raw config log: every record with its epoch and writer."""
    records = _rest(ctx).call("GET", "/log", params={"from": start, "limit": limit}).json()
    if _json(ctx):
        emit_json(records)
        return
    rows = []
    for r in records:
        record = r.get("record") or {}
        what = record.get("name") or record.get("worker_id") or ""
        if r["kind"] == "Assignment":
            what = f"generation {record.get('generation')}"
        copy = f" (copy of {r['logical_offset']})" if r["logical_offset"] != r["offset"] else ""
        rows.append([f"{r['offset']}{copy}", r["op"], r["epoch"], r["writer"], r["kind"], what])
    emit_table("config log", ["offset", "op", "epoch", "writer", "kind", "about"], rows)


# ---------------------------------------------------------------------- RocketMQ connectAdmin names


@connect_group.command("createConnector")
@click.option("-c", "--connector-name", "name", required=True)
@click.option(
    "-p", "--path", "path", type=click.Path(dir_okay=False, path_type=Path), required=True
)
@click.pass_context
def create_connector_alias(ctx: click.Context, name: str, path: Path) -> None:
    """RocketMQ connectAdmin: create a connector (= create)."""
    ctx.invoke(create_command, name=name, path=path, initial_state=None)


@connect_group.command("stopConnector")
@click.option("-c", "--connector-name", "name", required=True)
@click.pass_context
def stop_connector_alias(ctx: click.Context, name: str) -> None:
    """RocketMQ connectAdmin: stop a connector, which deletes it there (= delete)."""
    ctx.invoke(delete_command, name=name)


@connect_group.command("queryConnectorConfig")
@click.option("-c", "--connector-name", "name", required=True)
@click.pass_context
def query_config_alias(ctx: click.Context, name: str) -> None:
    """RocketMQ connectAdmin: a connector's config (= config)."""
    ctx.invoke(config_command, name=name, sets=(), unsets=(), path=None)


@connect_group.command("queryConnectorStatus")
@click.option("-c", "--connector-name", "name", required=True)
@click.pass_context
def query_status_alias(ctx: click.Context, name: str) -> None:
    """RocketMQ connectAdmin: a connector's status (= status)."""
    ctx.invoke(status_command, name=name)


@connect_group.command("stopAll")
@click.pass_context
def stop_all_alias(ctx: click.Context) -> None:
    """RocketMQ connectAdmin: stop (delete) every connector."""
    done = _rest(ctx).call("GET", "/connectors/stop/all").json()
    click.echo(json.dumps(done))


@connect_group.command("getClusterInfo")
@click.pass_context
def cluster_alias(ctx: click.Context) -> None:
    """RocketMQ connectAdmin: the cluster (= cluster)."""
    ctx.invoke(cluster_command)


def _allocated(ctx: click.Context, what: str) -> None:
    body = _rest(ctx).call("GET", f"/allocated/{what}").json()
    emit_json(body["body"])


@connect_group.command("getAllocatedConnectors")
@click.pass_context
def allocated_connectors_alias(ctx: click.Context) -> None:
    """RocketMQ connectAdmin: the connectors whose tasks run on the worker asked."""
    _allocated(ctx, "connectors")


@connect_group.command("getAllocatedTasks")
@click.pass_context
def allocated_tasks_alias(ctx: click.Context) -> None:
    """RocketMQ connectAdmin: the tasks that run on the worker asked."""
    _allocated(ctx, "tasks")


@connect_group.command("getAllocatedInfo")
@click.pass_context
def allocated_info_alias(ctx: click.Context) -> None:
    """RocketMQ connectAdmin: the connectors and tasks of the worker asked."""
    rest = _rest(ctx)
    emit_json(
        {
            "connectors": rest.call("GET", "/allocated/connectors").json()["body"],
            "tasks": rest.call("GET", "/allocated/tasks").json()["body"],
        }
    )
