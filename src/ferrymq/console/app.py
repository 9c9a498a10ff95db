"""The console's HTTP application: the pages and the JSON API they read.

Pages (one HTML shell, drawn by `static/console.js` from the API): `/cluster` (broker groups and
SyncStateSets), `/topics`, `/groups`, `/controller`, `/messages`, `/connectors`.

API (JSON; errors are `{"error": kind, "message": ...}` with 400, 404, 409 or 503, see `reader`):

- GET `/api/cluster`, `/api/controller` (nodes and the elections observed), `/api/topics`,
  `/api/topics/{topic}`, `/api/groups`, `/api/groups/{group}`, `/api/connectors`,
  `/api/messages?id=` or `?topic=&key=`, `/api/history` (the charts' samples).
- POST `/api/actions/create-topic`, `/api/actions/reset-offsets`, `/api/actions/elect-master`
  (the pages ask for a confirmation first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ferrymq import __version__
from ferrymq.console.reader import ConsoleError, ConsoleReader
from ferrymq.console.sampler import Sampler
from ferrymq.console.views import SeriesHistory

__all__ = ["PAGES", "build_app"]

STATIC: Final = Path(__file__).parent / "static"
PAGES: Final = ("cluster", "topics", "groups", "controller", "messages", "connectors")


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateTopic(_Action):
    """POST /api/actions/create-topic."""

    topic: str = Field(min_length=1)
    queues: int = Field(8, ge=1, le=1024)
    cluster: str | None = None


class ResetOffsets(_Action):
    """POST /api/actions/reset-offsets."""

    group: str = Field(min_length=1)
    topic: str = Field(min_length=1)
    to: Literal["earliest", "latest", "timestamp"]
    timestamp_ms: int | None = Field(None, ge=0)


class ElectMaster(_Action):
    """POST /api/actions/elect-master (`broker_id`: designate it; none: the controller picks)."""

    broker_name: str = Field(min_length=1)
    broker_id: int | None = Field(None, ge=0)


def _error(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": kind, "message": message}, status)


def _history(history: SeriesHistory) -> dict[str, Any]:
    return {"wall_ms": history.wall_ms, "values": history.values}


def build_app(reader: ConsoleReader, sampler: Sampler) -> FastAPI:
    """The console application over `reader`, with the charts' samples from `sampler`."""
    app = FastAPI(  # no Swagger UI: it loads its script from a CDN
        title="ferrymq console",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )

    @app.middleware("http")
    async def note_viewed(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path.startswith("/api/"):
            sampler.viewed()
        return await call_next(request)

    @app.exception_handler(ConsoleError)
    async def console_error(request: Request, exc: ConsoleError) -> Response:
        return _error(exc.status, exc.kind, exc.message)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> Response:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return _error(400, "bad_request", f"bad request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found" if exc.status_code == 404 else "bad_request"
        return _error(exc.status_code, kind, f"{request.url.path}: {exc.detail}")

    # ------------------------------------------------------------------ reads

    @app.get("/api/cluster")
    async def cluster() -> dict[str, Any]:
        return await reader.cluster()

    @app.get("/api/controller")
    async def controller() -> dict[str, Any]:
        state = await reader.controller()
        state["elections"] = [dataclasses.asdict(e) for e in sampler.elections.elections]
        return state

    @app.get("/api/topics")
    async def topics(system: bool = False) -> dict[str, Any]:
        rates = sampler.topic_rates.rates
        rows: list[dict[str, Any]] = []
        for name in await reader.topic_names(system=system):
            try:
                topic = await reader.topic(name)
            except ConsoleError as exc:
                rows.append({"topic": name, "error": exc.message})
                continue
            rows.append(
                {
                    "topic": name,
                    "queues": len(topic["queues"]),
                    "messages": sum(q["messages"] for q in topic["queues"]),
                    "max_offset_total": topic["max_offset_total"],
                    "rate": rates.get(name),
                }
            )
        return {"topics": rows}

    @app.get("/api/topics/{topic}")
    async def topic(topic: str) -> dict[str, Any]:
        found = await reader.topic(topic)
        found["rate"] = sampler.topic_rates.rates.get(topic)
        return found

    @app.get("/api/groups")
    async def groups() -> dict[str, Any]:
        rates = sampler.group_rates.rates
        rows: list[dict[str, Any]] = []
        for name in await reader.group_names():
            try:
                progress = await reader.group(name)
            except ConsoleError as exc:
                rows.append({"group": name, "error": exc.message})
                continue
            rows.append(
                {
                    "group": name,
                    "queues": len(progress["queues"]),
                    "lag": progress["lag"],
                    "consumed_total": progress["consumed_total"],
                    "rate": rates.get(name),
                }
            )
        return {"groups": rows}

    @app.get("/api/groups/{group}")
    async def group(group: str, topic: str | None = None) -> dict[str, Any]:
        found = await reader.group(group, topic)
        found["rate"] = sampler.group_rates.rates.get(group)
        return found

    @app.get("/api/messages")
    async def messages(
        msg_id: Annotated[str | None, Query(alias="id")] = None,
        topic: str | None = None,
        key: str | None = None,
    ) -> dict[str, Any]:
        return {"messages": await reader.messages(msg_id=msg_id, topic=topic, key=key)}

    @app.get("/api/connectors")
    async def connectors() -> dict[str, Any]:
        return await reader.connectors()

    @app.get("/api/history")
    async def history() -> dict[str, Any]:
        return {
            "interval_s": sampler.interval,
            "topic_rates": _history(sampler.topic_rates.history()),
            "group_rates": _history(sampler.group_rates.history()),
            "group_lag": _history(sampler.group_lag.history()),
        }

    # ------------------------------------------------------------------ actions

    @app.post("/api/actions/create-topic")
    async def create_topic(action: CreateTopic) -> dict[str, Any]:
        return await reader.create_topic(action.topic, action.queues, action.cluster)

    @app.post("/api/actions/reset-offsets")
    async def reset_offsets(action: ResetOffsets) -> dict[str, Any]:
        if action.to == "timestamp" and action.timestamp_ms is None:
            raise ConsoleError(400, "bad_request", "to=timestamp needs timestamp_ms")
        return await reader.reset_offsets(
            action.group, action.topic, action.to, action.timestamp_ms
        )

    @app.post("/api/actions/elect-master")
    async def elect_master(action: ElectMaster) -> dict[str, Any]:
        return await reader.elect_master(action.broker_name, action.broker_id)

    @app.api_route(
        "/api/{rest:path}",
        methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
        include_in_schema=False,
    )
    async def no_such_api(rest: str) -> Response:
        return _error(404, "not_found", f"no API /api/{rest}")

    # ------------------------------------------------------------------ pages

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/")
    async def home() -> Response:
        return RedirectResponse("/cluster")

    for page in PAGES:
        app.add_api_route(f"/{page}", _page, methods=["GET"], include_in_schema=False)

    return app


async def _page() -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html")
