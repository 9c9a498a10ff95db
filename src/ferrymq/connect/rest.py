"""The Connect REST API: Kafka Connect's surface, RocketMQ Connect's paths as aliases (FastAPI).

Contract (reference/connect-anchors.md sections 1.1 and 3b):
- paths, verbs, status codes and JSON shapes are Kafka Connect's (ConnectorsResource,
  ConnectorPluginsResource, RootResource; KIPs 745, 875, 980, 1017); errors are
  `{"error_code", "message"}` with the HTTP status equal to `error_code`, bad bodies included
  (400, never FastAPI's 422), and no request can make the worker answer anything but a JSON
  error: an unexpected failure is a 500 for that request only;
- reads are served by any worker from its replayed state; `?minOffset=N` (or the header
  `X-Ferry-Min-Config-Offset`) waits until this worker has read the config log up to N:
  read-your-writes on any worker (409 when it has not within the request timeout);
- writes run on the leader. A follower proxies them (`restFollowerMode=forward`, default: the
  leader's status, body and Location pass through unchanged) or redirects (`redirect`: 307 for
  POST, 308 for the idempotent verbs; never 302, which turns a PUT into a GET). No known leader:
  409 with `Retry-After: 1`. The leader lost in mid-call: 504 with `X-Ferry-Outcome: unknown`.
  A request already forwarded (`?forward=false`) is never forwarded again;
- every response carries `X-Ferry-Worker`, `X-Ferry-Leader`, `X-Ferry-Epoch` and
  `X-Ferry-Config-Offset` (a write's: the offset after its record);
- `GET /cluster` (leader, epoch, members, assignment) and `GET /log` (the raw config log with each
  record's epoch and writer) are ferrymq's own.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Final, Protocol
from urllib.parse import quote, urlencode

import httpx
import msgspec
from fastapi import FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from ferrymq import __version__
from ferrymq.connect import decide
from ferrymq.connect.configlog import LoggedRecord
from ferrymq.connect.errors import (
    BadRequestError,
    ConflictError,
    ConnectRestError,
    NotFoundError,
    NotLeaderError,
    NotWrittenError,
    UnavailableError,
)
from ferrymq.connect.herder import Herder, WriteResult
from ferrymq.connect.plugin import OffsetsScope, PluginError, config_infos, task_checkpoint_dir
from ferrymq.connect.records import OffsetEntry, Record, TargetState
from ferrymq.connect.state import ConfigState
from ferrymq.connect.status import TaskState

__all__ = ["WorkerHandle", "build_app"]

log = logging.getLogger(__name__)

MAX_BODY_BYTES: Final = 1 << 20
"""The largest request body a worker reads (a config is a few KiB; the log record is <= 1 MiB)."""
_FORWARD_TIMEOUT_S: Final = 5.0
"""Connect timeout of a forwarded request (the whole call takes up to the request timeout)."""


class WorkerHandle(Protocol):
    """What the REST layer needs of the worker."""

    @property
    def herder(self) -> Herder:
        """The worker's core."""

    instance: str
    """A random id of this process (the advertised-URL self-check compares it)."""
    http: httpx.AsyncClient

    async def raw_log(self, start: int, limit: int) -> list[LoggedRecord]:
        """The config log's records from queue offset `start`."""


def _location(name: str) -> str:
    """A connector's path for `Location`, percent-encoded (a header holds Latin-1 at most)."""
    return "/connectors/" + quote(name, safe="")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error_code": status, "message": message}, status, headers=headers)


def _json_body(raw: bytes) -> Any:
    if not raw.strip():
        raise BadRequestError("the request body is empty; a JSON object is expected")
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise BadRequestError(f"the request body is not JSON: {exc}") from None


def _string_map(value: Any, what: str, *, nulls: bool = False) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequestError(f"{what} must be a JSON object of strings")
    result: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, bool) or not (
            isinstance(item, str | int | float) or (nulls and item is None)
        ):
            raise BadRequestError(f"{what}: the value of {key!r} must be a string")
        result[key] = item if item is None or isinstance(item, str) else str(item)
    return result


def _target(text: str | None) -> TargetState:
    if text is None:
        return TargetState.RUNNING
    try:
        return TargetState(text.upper())
    except ValueError:
        raise BadRequestError(
            f"initial_state must be one of RUNNING, PAUSED, STOPPED; not {text!r}"
        ) from None


def build_app(worker: WorkerHandle) -> FastAPI:
    """The worker's REST application."""
    herder = worker.herder
    config = herder.config
    app = FastAPI(
        title="ferrymq Connect",
        version=__version__,
        description="Kafka Connect's REST API on a ferrymq Connect worker.",
    )
    timeout_s = config.rest_request_timeout_ms / 1000

    # ------------------------------------------------------------------ plumbing

    def headers(config_offset: int | None = None) -> dict[str, str]:
        _leader_id, leader_url = herder.leader()
        return {
            "X-Ferry-Worker": herder.worker_id,
            "X-Ferry-Leader": leader_url,
            "X-Ferry-Epoch": str(herder.state.epoch),
            "X-Ferry-Config-Offset": str(
                herder.log.config_offset if config_offset is None else config_offset
            ),
        }

    @app.middleware("http")
    async def add_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        length = request.headers.get("content-length", "")
        response: Response
        try:
            if length.isdigit() and int(length) > MAX_BODY_BYTES:
                response = _error(
                    413, f"the request body is {length} bytes, over the limit of {MAX_BODY_BYTES}"
                )
            else:
                response = await call_next(request)
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.url.path)
            response = _error(500, f"{type(exc).__name__}: {exc}")
        response.headers["X-Ferry-Instance"] = worker.instance
        for name, value in headers().items():
            response.headers.setdefault(name, value)
        return response

    @app.exception_handler(ConnectRestError)
    async def rest_error(request: Request, exc: ConnectRestError) -> Response:
        extra = {"Retry-After": "1"} if isinstance(exc, NotLeaderError | NotWrittenError) else None
        if exc.status == 504:
            extra = {"X-Ferry-Outcome": "unknown"}
        return _error(exc.status, exc.message, extra)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return _error(400, f"bad request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return _error(exc.status_code, f"HTTP {exc.status_code} {exc.detail}")

    async def at_least(request: Request, min_offset: int | None) -> None:
        wanted = min_offset
        header = request.headers.get("X-Ferry-Min-Config-Offset")
        if wanted is None and header is not None:
            if not header.isdigit():
                raise BadRequestError("X-Ferry-Min-Config-Offset must be a non-negative integer")
            wanted = int(header)
        if wanted is not None and not await herder.log.wait_for(wanted, timeout_s):
            raise ConflictError(
                f"this worker has read the config log up to {herder.log.config_offset}, not "
                f"yet {wanted}; retry"
            )

    def connector_or_404(name: str) -> Any:
        connector = herder.state.connectors.get(name)
        if connector is None:
            raise NotFoundError(f"Connector {name} not found")
        return connector

    def plugin_type(connector_class: str) -> str:
        try:
            return herder.plugins.resolve(connector_class)[1].type
        except PluginError:
            return "unknown"

    def info(name: str) -> dict[str, Any]:
        connector = connector_or_404(name)
        return {
            "name": name,
            "config": dict(connector.config),
            "tasks": [{"connector": name, "task": i} for i in range(len(connector.tasks))],
            "type": plugin_type(connector.config.get("connector.class", "")),
        }

    def task_state(name: str, index: int) -> dict[str, Any]:
        connector = connector_or_404(name)
        key = (name, connector.incarnation, index)
        owner = herder.state.owner_of(key)
        report = herder.status.table.get(key)
        state, worker_id, trace = TaskState.UNASSIGNED.value, "", None
        extra: dict[str, Any] = {}
        if owner is not None:
            worker_id = owner.worker_id
            extra["generation"] = owner.since
        if (
            report is not None
            and owner is not None
            and report.worker_id == owner.worker_id
            and report.generation == owner.since
        ):
            state, trace = report.state.value, report.trace
            extra.update(
                run_id=report.run_id,
                starts=report.starts,
                updated_ms=report.updated_ms,
                **report.metrics,
            )
        elif report is not None and owner is None:
            worker_id = report.worker_id
        entry: dict[str, Any] = {"id": index, "state": state, "worker_id": worker_id}
        if trace:
            entry["trace"] = trace
        entry["ferrymq"] = extra
        return entry

    def status(name: str) -> dict[str, Any]:
        connector = connector_or_404(name)
        leader_id, _ = herder.leader()
        return {
            "name": name,
            "connector": {"state": herder.connector_state(name), "worker_id": leader_id},
            "tasks": [task_state(name, i) for i in range(len(connector.tasks))],
            "type": plugin_type(connector.config.get("connector.class", "")),
        }

    # ------------------------------------------------------------------ writes

    async def forward(request: Request, leader_url: str) -> Response:
        url = leader_url.rstrip("/") + quote(request.scope["path"])  # decoded: encode it again
        params: list[tuple[str, str | int | float | bool | None]] = [
            (k, v) for k, v in request.query_params.multi_items() if k != "forward"
        ]
        if config.rest_follower_mode == "redirect":
            query = urlencode(params)
            location = url + (f"?{query}" if query else "")
            status_code = 307 if request.method == "POST" else 308
            return Response(status_code=status_code, headers={"Location": location})
        params.append(("forward", "false"))
        body = await request.body()
        try:
            answer = await worker.http.request(
                request.method,
                url,
                params=params,
                content=body,
                headers={"Content-Type": request.headers.get("content-type", "application/json")},
                timeout=httpx.Timeout(timeout_s + 5, connect=_FORWARD_TIMEOUT_S),
            )
        except httpx.ConnectError as exc:  # never reached the leader: nothing was written
            return _error(
                409,
                f"no leader reachable: {leader_url} refused the connection ({exc}); retry",
                {"Retry-After": "1"},
            )
        except (httpx.HTTPError, AttributeError) as exc:
            # AttributeError: httpcore/anyio read the peer of a socket the dying leader's close
            # already took ('NoneType' object has no attribute 'getpeername'; seen in a CI run
            # at a kill -9 of the leader): a library race, answered as the unknown outcome it is
            return _error(
                504,
                f"forwarded to {leader_url}; outcome unknown ({type(exc).__name__}: {exc}) — "
                "GET to check",
                {"X-Ferry-Outcome": "unknown"},
            )
        passed = {
            k: v
            for k, v in answer.headers.items()
            if k.lower() in ("content-type", "location", "retry-after", "deprecation")
            or k.lower().startswith("x-ferry-")
        }
        return Response(answer.content, answer.status_code, headers=passed)

    async def write(
        request: Request,
        forward_flag: bool,
        decision: Callable[[ConfigState], Record | None],
        answer: Callable[[WriteResult | None], Response],
    ) -> Response:
        """Run a write on the leader, or send it there."""
        leader_id, leader_url = herder.leader()
        if not herder.is_leader:
            if not forward_flag:
                raise NotLeaderError(leader_id, leader_url)
            if not leader_url:
                raise NotLeaderError("", "", "election in progress")
            return await forward(request, leader_url)
        try:
            result = await herder.write(decision, hooked=True)
        except NotLeaderError as exc:
            # fenced in mid-write (nothing stored): send it on to the new leader
            if forward_flag and exc.leader_url and exc.leader_url != herder.url:
                return await forward(request, exc.leader_url)
            raise
        response = answer(result)
        if result is not None:
            response.headers["X-Ferry-Config-Offset"] = str(result.config_offset)
        response.background = BackgroundTask(herder.after_write)  # once the answer is sent
        return response

    def forwarded(flag: str | None) -> bool:
        """Whether this request may still be forwarded (`forward` is not `false`)."""
        return (flag or "true").lower() != "false"

    # ------------------------------------------------------------------ root, health, cluster

    @app.get("/")
    async def root() -> dict[str, Any]:
        leader_id, leader_url = herder.leader()
        return {
            "version": __version__,
            "commit": "ferrymq",
            "kafka_cluster_id": config.connect_cluster_id,
            "worker_id": herder.worker_id,
            "leader": {"worker_id": leader_id, "url": leader_url, "epoch": herder.state.epoch},
            "config_offset": herder.log.config_offset,
        }

    @app.get("/health")
    async def health() -> Response:
        unreachable = herder.broker_unreachable_since
        if unreachable is not None and (
            herder.now() - unreachable > config.session_timeout_ms / 1000
        ):
            return JSONResponse(
                {"status": "unhealthy", "message": "the config topic's broker is unreachable"},
                500,
            )
        leader_id, _ = herder.leader()
        if not herder.log.replayed or not leader_id:
            message = "reading the config log" if not herder.log.replayed else "no leader known yet"
            return JSONResponse({"status": "starting", "message": message}, 503)
        return JSONResponse({"status": "healthy", "message": "Worker has completed startup"})

    @app.get("/cluster")
    async def cluster() -> dict[str, Any]:
        leader_id, leader_url = herder.leader()
        workers: dict[str, list[str]] = {}
        for task in herder.state.assignment.tasks:
            workers.setdefault(task.worker_id, []).append(f"{task.connector}-{task.task}")
        return {
            "cluster_id": config.connect_cluster_id,
            "leader": {"worker_id": leader_id, "url": leader_url},
            "epoch": herder.state.epoch,
            "config_offset": herder.log.config_offset,
            "members": [
                {
                    "worker_id": worker_id,
                    "url": data.url,
                    "config_offset": data.offset,
                    "generation": data.gen,
                    "run": data.run,
                }
                for worker_id, data in sorted(herder.view.members.items())
            ],
            "assignment": {
                "generation": herder.state.assignment.generation,
                "workers": workers,
                "revoking": [f"{t.connector}-{t.task}" for t in herder.state.assignment.revoking],
            },
        }

    @app.get("/log")
    async def raw_log(
        start: int = Query(0, alias="from", ge=0), limit: int = Query(1000, ge=1, le=10000)
    ) -> list[dict[str, Any]]:
        records = await worker.raw_log(start, limit)
        return [
            {
                "offset": r.queue_offset,
                "logical_offset": r.logical_offset,
                "op": r.op,
                "epoch": r.epoch,
                "writer": r.writer,
                "stored_ms": r.store_timestamp_ms,
                "record": msgspec.to_builtins(r.record) if r.record is not None else None,
                "kind": type(r.record).__name__ if r.record is not None else "unreadable",
                "problem": r.problem,
            }
            for r in records
        ]

    # ------------------------------------------------------------------ connectors: reads

    def wrapped(body: Any, status_code: int = 200, deprecated: bool = False) -> JSONResponse:
        """RocketMQ Connect's `{status, body}` answer, with the real HTTP status."""
        extra = {"Deprecation": "true"} if deprecated else None
        return JSONResponse({"status": status_code, "body": body}, status_code, headers=extra)

    @app.get("/connectors/list")  # before /connectors/{name}: a RocketMQ path, not a connector
    async def rocketmq_list() -> JSONResponse:
        return wrapped(sorted(herder.state.connectors))

    @app.get("/connectors")
    async def list_connectors(
        request: Request,
        expand: Annotated[list[str] | None, Query()] = None,
        min_offset: int | None = Query(None, alias="minOffset", ge=0),
    ) -> Any:
        await at_least(request, min_offset)
        names = sorted(herder.state.connectors)
        expand = expand or []
        unknown = [e for e in expand if e not in ("status", "info")]
        if unknown:
            raise BadRequestError(f"expand takes status and info, not {', '.join(unknown)}")
        if not expand:
            return names
        result: dict[str, Any] = {}
        for name in names:
            entry: dict[str, Any] = {}
            if "status" in expand:
                entry["status"] = status(name)
            if "info" in expand:
                entry["info"] = info(name)
            result[name] = entry
        return result

    @app.get("/connectors/{name}")
    async def get_connector(
        name: str, request: Request, min_offset: int | None = Query(None, alias="minOffset", ge=0)
    ) -> dict[str, Any]:
        await at_least(request, min_offset)
        return info(name)

    @app.get("/connectors/{name}/config")
    async def get_config(
        name: str, request: Request, min_offset: int | None = Query(None, alias="minOffset", ge=0)
    ) -> dict[str, str]:
        await at_least(request, min_offset)
        return dict(connector_or_404(name).config)

    @app.get("/connectors/{name}/status")
    async def get_status(
        name: str, request: Request, min_offset: int | None = Query(None, alias="minOffset", ge=0)
    ) -> dict[str, Any]:
        await at_least(request, min_offset)
        return status(name)

    @app.get("/connectors/{name}/tasks")
    async def get_tasks(
        name: str, request: Request, min_offset: int | None = Query(None, alias="minOffset", ge=0)
    ) -> list[dict[str, Any]]:
        await at_least(request, min_offset)
        connector = connector_or_404(name)
        return [
            {"id": {"connector": name, "task": i}, "config": dict(task)}
            for i, task in enumerate(connector.tasks)
        ]

    @app.get("/connectors/{name}/tasks/{task}/status")
    async def get_task_status(name: str, task: int) -> dict[str, Any]:
        connector = connector_or_404(name)
        if not 0 <= task < len(connector.tasks):
            raise NotFoundError(f"Task {name}-{task} not found")
        return task_state(name, task)

    @app.get("/connectors/{name}/offsets")
    async def get_offsets(name: str) -> dict[str, Any]:
        connector = connector_or_404(name)
        try:
            _, cls = herder.plugins.resolve(connector.config.get("connector.class", ""))
        except PluginError as exc:  # Kafka: a ConnectException, answered 500
            raise ConnectRestError(str(exc)) from None
        scope = OffsetsScope(
            connector=name,
            incarnation=connector.incarnation,
            namesrv_addr=config.namesrv_addr,
            checkpoint_dirs=_checkpoints(
                task_checkpoint_dir(
                    config.store_path_root_dir,
                    config.connect_cluster_id,
                    name,
                    connector.incarnation,
                    0,
                ).parent,
                len(connector.tasks),
            ),
        )
        try:  # the plugin's own truth (a database, checkpoints): blocking I/O, off the loop
            shown = await asyncio.to_thread(cls().connector_offsets, dict(connector.config), scope)
        except Exception as exc:  # noqa: BLE001 - any store's failure is this request's only
            raise UnavailableError(
                f"the offsets of {name} cannot be read now: {' '.join(str(exc).split())}"
            ) from None
        if shown is None:  # the plugin keeps none here: what its tasks last reported
            shown = []
            for key in connector.task_keys():
                report = herder.status.table.get(key)
                if report is not None:
                    shown += list(report.metrics.get("offsets", []))
        return {"offsets": shown}

    # ------------------------------------------------------------------ connectors: writes

    def created_or_updated(name: str) -> Callable[[WriteResult | None], Response]:
        def answer(result: WriteResult | None) -> Response:
            created = result is not None and herder.created(result)
            body = msgspec.json.encode(info(name))
            headers_ = {"Location": _location(name)} if created else {}
            return Response(body, 201 if created else 200, headers_, "application/json")

        return answer

    @app.post("/connectors")
    async def create_connector(request: Request, forward: str | None = Query(None)) -> Response:
        body = _json_body(await request.body())
        if not isinstance(body, dict):
            raise BadRequestError('the body must be {"name": ..., "config": {...}}')
        name = body.get("name")
        raw_config = body.get("config")
        if not isinstance(name, str):
            raise BadRequestError("the body needs a name (a string)")
        if raw_config is None:
            raise BadRequestError("the body needs a config object")
        connector_config = _string_map(raw_config, "config")
        initial = _target(body.get("initial_state"))
        decide.check_name(name)

        def decision(state: ConfigState) -> Record:
            return decide.create(state, herder.plugins, name, connector_config, initial)

        def answer(result: WriteResult | None) -> Response:
            return Response(
                msgspec.json.encode(info(name)),
                201,
                {"Location": _location(name)},
                "application/json",
            )

        return await write(request, forwarded(forward), decision, answer)

    @app.put("/connectors/{name}/config")
    async def put_config(
        name: str, request: Request, forward: str | None = Query(None)
    ) -> Response:
        connector_config = _string_map(_json_body(await request.body()), "config")

        def decision(state: ConfigState) -> Record:
            return decide.put_config(state, herder.plugins, name, connector_config)

        return await write(request, forwarded(forward), decision, created_or_updated(name))

    @app.patch("/connectors/{name}/config")
    async def patch_config(
        name: str, request: Request, forward: str | None = Query(None)
    ) -> Response:
        patch = _string_map(_json_body(await request.body()), "config", nulls=True)

        def decision(state: ConfigState) -> Record:
            return decide.patch_config(state, herder.plugins, name, patch)

        return await write(request, forwarded(forward), decision, created_or_updated(name))

    def target_route(target: TargetState, status_code: int) -> Callable[..., Awaitable[Response]]:
        async def handler(
            name: str, request: Request, forward: str | None = Query(None)
        ) -> Response:
            def decision(state: ConfigState) -> Record | None:
                return decide.set_target(state, herder.plugins, name, target)

            return await write(
                request, forwarded(forward), decision, lambda _: Response(status_code=status_code)
            )

        return handler

    app.put("/connectors/{name}/pause", status_code=202)(target_route(TargetState.PAUSED, 202))
    app.put("/connectors/{name}/resume", status_code=202)(target_route(TargetState.RUNNING, 202))
    app.put("/connectors/{name}/stop", status_code=204)(target_route(TargetState.STOPPED, 204))

    @app.post("/connectors/{name}/restart")
    async def restart_connector(
        name: str,
        request: Request,
        include_tasks: bool = Query(False, alias="includeTasks"),
        only_failed: bool = Query(False, alias="onlyFailed"),
        forward: str | None = Query(None),
    ) -> Response:
        failed, connector_failed = herder.failed_tasks(name)

        def decision(state: ConfigState) -> Record | None:
            return decide.restart(
                state,
                herder.plugins,
                name,
                include_tasks=include_tasks,
                only_failed=only_failed,
                failed_tasks=failed,
                connector_failed=connector_failed,
            )

        def answer(result: WriteResult | None) -> Response:
            if not include_tasks and not only_failed:
                return Response(status_code=204)
            body = status(name)
            restarted = set(getattr(result.record, "tasks", [])) if result is not None else set()
            for entry in body["tasks"]:
                if entry["id"] in restarted:
                    entry["state"] = "RESTARTING"
            if result is not None and getattr(result.record, "connector", False):
                body["connector"]["state"] = "RESTARTING"
            return Response(msgspec.json.encode(body), 202, media_type="application/json")

        return await write(request, forwarded(forward), decision, answer)

    @app.post("/connectors/{name}/tasks/{task}/restart", status_code=204)
    async def restart_task(
        name: str, task: int, request: Request, forward: str | None = Query(None)
    ) -> Response:
        def decision(state: ConfigState) -> Record:
            return decide.restart_task(state, name, task)

        return await write(
            request, forwarded(forward), decision, lambda _: Response(status_code=204)
        )

    @app.delete("/connectors/{name}", status_code=204)
    async def delete_connector(
        name: str, request: Request, forward: str | None = Query(None)
    ) -> Response:
        def decision(state: ConfigState) -> Record:
            return decide.delete(state, name)

        return await write(
            request, forwarded(forward), decision, lambda _: Response(status_code=204)
        )

    @app.patch("/connectors/{name}/offsets")
    async def alter_offsets(
        name: str, request: Request, forward: str | None = Query(None)
    ) -> Response:
        body = _json_body(await request.body())
        if not isinstance(body, dict) or not isinstance(body.get("offsets"), list):
            raise BadRequestError(
                'the body must be {"offsets": [{"partition": ..., "offset": ...}]}'
            )
        try:
            entries = msgspec.convert(body["offsets"], list[OffsetEntry])
        except msgspec.ValidationError as exc:
            raise BadRequestError(f"bad offsets: {exc}") from None

        def decision(state: ConfigState) -> Record:
            return decide.alter_offsets(state, herder.plugins, name, entries)

        message = {"message": "The offsets for this connector have been altered successfully"}
        return await write(
            request, forwarded(forward), decision, lambda _: JSONResponse(message, 200)
        )

    @app.delete("/connectors/{name}/offsets")
    async def reset_offsets(
        name: str, request: Request, forward: str | None = Query(None)
    ) -> Response:
        def decision(state: ConfigState) -> Record:
            return decide.reset_offsets(state, name)

        message = {"message": "The offsets for this connector have been reset successfully"}
        return await write(
            request, forwarded(forward), decision, lambda _: JSONResponse(message, 200)
        )

    # ------------------------------------------------------------------ plugins

    @app.get("/connector-plugins")
    async def plugins(connectors_only: bool = Query(True, alias="connectorsOnly")) -> Any:
        return herder.plugins.listing()

    def plugin_or_404(plugin: str) -> tuple[str, Any]:
        try:
            return herder.plugins.resolve(plugin)
        except PluginError as exc:
            raise NotFoundError(str(exc)) from None

    @app.get("/connector-plugins/{plugin}/config")
    async def plugin_config(plugin: str) -> list[dict[str, Any]]:
        _, cls = plugin_or_404(plugin)
        return [key.info(i + 1) for i, key in enumerate(cls.config_keys())]

    @app.put("/connector-plugins/{plugin}/config/validate")
    async def validate(plugin: str, request: Request) -> dict[str, Any]:
        path, cls = plugin_or_404(plugin)
        connector_config = _string_map(_json_body(await request.body()), "config")
        given = connector_config.get("connector.class")
        if given is not None:
            try:
                given_path, _ = herder.plugins.resolve(given)
            except PluginError:
                given_path = given
            if given_path != path:
                raise BadRequestError(
                    "Included connector type " + given + " does not match request type " + plugin
                )
        connector_config.setdefault("connector.class", path)
        return config_infos(path, cls(), connector_config)

    # ------------------------------------------------------------------ RocketMQ aliases

    @app.get("/getClusterInfo")
    async def rocketmq_cluster() -> JSONResponse:
        return wrapped(await cluster())

    @app.get("/allocated/connectors")
    async def rocketmq_allocated_connectors() -> JSONResponse:
        mine = sorted({t.connector for t in herder.state.tasks_of(herder.worker_id)})
        return wrapped(
            {
                name: dict(herder.state.connectors[name].config)
                for name in mine
                if name in herder.state.connectors
            }
        )

    @app.get("/allocated/tasks")
    async def rocketmq_allocated_tasks() -> JSONResponse:
        return wrapped(
            [
                {"connector": t.connector, "task": t.task, "generation": t.since}
                for t in herder.state.tasks_of(herder.worker_id)
            ]
        )

    @app.get("/plugin/list")
    async def rocketmq_plugins() -> JSONResponse:
        return wrapped(herder.plugins.listing())

    @app.get("/plugin/list/connectors")
    async def rocketmq_plugin_connectors() -> JSONResponse:
        return wrapped([p["class"] for p in herder.plugins.listing()])

    @app.get("/plugin/config")
    async def rocketmq_plugin_config(plugin: str = Query(...)) -> JSONResponse:
        return wrapped(await plugin_config(plugin))

    @app.put("/plugin/config/validate")
    async def rocketmq_validate(request: Request) -> JSONResponse:
        connector_config = _string_map(_json_body(await request.body()), "config")
        plugin = connector_config.get("connector.class", "")
        if not plugin:
            raise BadRequestError("the config needs connector.class")
        path, cls = plugin_or_404(plugin)
        return wrapped(config_infos(path, cls(), connector_config))

    async def alias_write(
        request: Request,
        forward: str | None,
        decision: Callable[[ConfigState], Record | None],
        status_code: int = 200,
    ) -> Response:
        return await write(
            request,
            forwarded(forward),
            decision,
            lambda _: wrapped("success", status_code, deprecated=request.method == "GET"),
        )

    @app.get("/connectors/{name}/pause")
    async def rocketmq_pause(
        name: str, request: Request, forward: str | None = Query(None)
    ) -> Response:
        return await alias_write(
            request,
            forward,
            lambda state: decide.set_target(state, herder.plugins, name, TargetState.PAUSED),
            202,
        )

    @app.get("/connectors/{name}/resume")
    async def rocketmq_resume(
        name: str, request: Request, forward: str | None = Query(None)
    ) -> Response:
        return await alias_write(
            request,
            forward,
            lambda state: decide.set_target(state, herder.plugins, name, TargetState.RUNNING),
            202,
        )

    @app.get("/connectors/{name}/stop")
    async def rocketmq_stop(
        name: str, request: Request, forward: str | None = Query(None)
    ) -> Response:
        # RocketMQ Connect's stop deletes the connector (its config is removed)
        return await alias_write(request, forward, lambda state: decide.delete(state, name))

    @app.post("/connectors/{name}")
    async def rocketmq_create(
        name: str, request: Request, forward: str | None = Query(None)
    ) -> Response:
        connector_config = _string_map(_json_body(await request.body()), "config")
        return await alias_write(
            request,
            forward,
            lambda state: decide.put_config(state, herder.plugins, name, connector_config),
        )

    for path, target in (
        ("/connectors/pause/all", TargetState.PAUSED),
        ("/connectors/resume/all", TargetState.RUNNING),
    ):
        app.get(path)(_all_route(herder, write, forwarded, wrapped, target))
    app.get("/connectors/stop/all")(_all_route(herder, write, forwarded, wrapped, None))

    generate = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's spec, completed (`_document`) the first time it is asked for."""
        if app.openapi_schema is None:
            _document(generate())  # FastAPI keeps it in app.openapi_schema
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's way to extend the spec
    return app


_STRINGS: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": {"type": ["string", "number"]},
}
_OFFSET_MAP: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": {"type": ["string", "integer"]},
}
_BODIES: Final[dict[tuple[str, str], dict[str, Any]]] = {
    ("post", "/connectors"): {
        "type": "object",
        "required": ["name", "config"],
        "properties": {
            "name": {"type": "string"},
            "config": _STRINGS,
            "initial_state": {"type": "string", "enum": ["RUNNING", "PAUSED", "STOPPED"]},
        },
    },
    ("put", "/connectors/{name}/config"): _STRINGS,
    ("patch", "/connectors/{name}/config"): {
        "type": "object",
        "additionalProperties": {"type": ["string", "number", "null"]},
    },
    ("post", "/connectors/{name}"): _STRINGS,
    ("patch", "/connectors/{name}/offsets"): {
        "type": "object",
        "required": ["offsets"],
        "properties": {
            "offsets": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["partition", "offset"],
                    "properties": {
                        "partition": _OFFSET_MAP,
                        "offset": {**_OFFSET_MAP, "type": ["object", "null"]},
                    },
                },
            }
        },
    },
    ("put", "/connector-plugins/{plugin}/config/validate"): _STRINGS,
    ("put", "/plugin/config/validate"): _STRINGS,
}
"""The JSON bodies of the routes that read their body themselves (to answer 400, never 422)."""
_SUCCESS: Final[dict[tuple[str, str], dict[str, bool]]] = {
    ("post", "/connectors"): {"201": True},
    ("put", "/connectors/{name}/config"): {"200": True, "201": True},
    ("post", "/connectors/{name}/restart"): {"202": True, "204": False},
    ("put", "/connectors/{name}/pause"): {"202": False},
    ("put", "/connectors/{name}/resume"): {"202": False},
    ("get", "/connectors/{name}/pause"): {"202": True},
    ("get", "/connectors/{name}/resume"): {"202": True},
}
"""Success statuses (with a JSON body or none) where the route answers with its own Response."""
_WRITES: Final = frozenset(
    {"/connectors/{name}/pause", "/connectors/{name}/resume", "/connectors/{name}/stop"}
    | {"/connectors/pause/all", "/connectors/resume/all", "/connectors/stop/all"}
)
"""RocketMQ's GET paths that write."""
_ERRORS: Final[dict[str, str]] = {
    "307": "A follower in restFollowerMode=redirect: the leader's URL is in Location (POST).",
    "308": "A follower in restFollowerMode=redirect: the leader's URL is in Location.",
    "400": "A bad body, name, parameter or config value, or a state the request does not fit.",
    "404": "No such connector, task or plugin.",
    "409": "The connector exists; or no leader is known, or the broker refused the record before "
    "storing it (Retry-After: 1); or this worker has not read the config log up to minOffset "
    "within the request timeout.",
    "500": "The config topic's broker is unreachable.",
    "503": "Reading the config log, or no leader known yet.",
    "504": "The leader was lost in mid-call: the outcome is unknown (X-Ferry-Outcome: unknown).",
}


def _checkpoints(incarnation_dir: Path, tasks: int) -> tuple[str, ...]:
    """Each task's checkpoint directory: the current tasks', and those a stop left on disk."""
    indexes = set(range(tasks))
    if incarnation_dir.is_dir():
        indexes |= {int(p.name) for p in incarnation_dir.iterdir() if p.name.isdecimal()}
    return tuple(str(incarnation_dir / str(i)) for i in sorted(indexes))


def _document(spec: dict[str, Any]) -> None:
    """Complete FastAPI's spec: the bodies, the real success codes, and the errors as they are.

    Every error is Kafka's `{"error_code", "message"}` with a 400 for anything malformed, so
    FastAPI's 422 and its validation schemas go.
    """
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorMessage"] = {
        "type": "object",
        "required": ["error_code", "message"],
        "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"}},
    }
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            error: dict[str, Any] = {"$ref": "#/components/schemas/ErrorMessage"}
            responses: dict[str, Any] = operation["responses"]
            responses.pop("422", None)
            success = _SUCCESS.get((method, path))
            if success is not None:
                generated = [responses.pop(c) for c in list(responses) if c.startswith("2")]
                template = generated[0] if generated else {"description": "Successful Response"}
                for code, with_body in success.items():
                    responses[code] = {
                        k: v for k, v in template.items() if with_body or k != "content"
                    }
            body = _BODIES.get((method, path))
            if body is not None:
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": body}},
                }
            names = {p["name"] for p in operation.get("parameters", [])}
            codes = ["400"] if names or body is not None else []
            if "{" in path or path.startswith("/plugin/config"):
                codes.append("404")
            write = method != "get" or path in _WRITES
            if write and "validate" not in path:
                codes += ["307", "308", "409", "504"]
            elif "minOffset" in names:
                codes.append("409")
            if path == "/health":
                codes, error = ["500", "503"], {"type": "object"}  # {status, message}
            if path == "/log" or (method, path) == ("get", "/connectors/{name}/offsets"):
                codes.append("503")
            if (method, path) == ("get", "/connectors/{name}/offsets"):
                codes.append("500")
            for code in codes:
                answer: dict[str, Any] = {"description": _ERRORS[code]}
                if path == "/log" and code == "503":
                    answer["description"] = "The config log's broker kept answering 'retry'."
                elif code == "503" and path.endswith("/offsets"):
                    answer["description"] = "The plugin's offsets store cannot be read now."
                elif code == "500" and path.endswith("/offsets"):
                    answer["description"] = "The connector's plugin is not installed here."
                if not code.startswith("3"):
                    answer["content"] = {"application/json": {"schema": error}}
                responses.setdefault(code, answer)


def _all_route(
    herder: Herder,
    write: Callable[..., Awaitable[Response]],
    forwarded: Callable[[str | None], bool],
    wrapped: Callable[..., JSONResponse],
    target: TargetState | None,
) -> Callable[..., Awaitable[Response]]:
    """RocketMQ's `/connectors/{pause,resume,stop}/all`: one write per connector, in order."""

    async def handler(request: Request, forward: str | None = Query(None)) -> Response:
        names = sorted(herder.state.connectors)
        if not herder.is_leader:
            return await write(request, forwarded(forward), lambda _: None, lambda _: wrapped([]))
        done: list[str] = []
        for name in names:

            def decision(state: ConfigState, name: str = name) -> Record | None:
                if name not in state.connectors:
                    return None
                if target is None:
                    return decide.delete(state, name)
                return decide.set_target(state, herder.plugins, name, target)

            await herder.write(decision)
            done.append(name)
        response = wrapped(done, deprecated=True)
        response.background = BackgroundTask(herder.after_write)
        return response

    return handler
