"""The Connect workload: REST clients writing connector configs to random workers, recorded.

- Each client (`k0`, `k1`, ...) owns its connectors (`k0-c0`, `k0-c1`, ...), so the writes to a
  connector are ordered: the client waits for each answer before its next write. It keeps a
  couple of connectors live and writes to a random one with a random kind: create (PAUSED or
  STOPPED: tasks are assigned but no Spark query starts, so no JVM runs), patch (the config key
  `x` to a new unique value), pause, stop or delete, each sent to a random running worker (a
  follower forwards it to the leader).
- Each write is recorded like a send (`cwrite`, history.py): `ok` for a 2xx, `fail` for a
  400/404/409 or a request that never left the client (the connection was refused or never
  made: one connection per request, so a failed connect proves nothing was sent), `info` for
  anything else (504, no answer). After an unknown outcome the client never writes to that
  connector again and goes on with a fresh one: the unknown write may still land much later (a
  paused follower forwards it when it resumes), and as the last write of its connector it
  cannot be reordered with a later one.
- An observer asks every worker for its leader twice a second and records each new claim
  (`cleader`), and a worker that exited by itself (not killed by the nemesis: exit status other
  than SIGKILL's) as `cexit`.
- `final` (after the faults, once the brokers converged): waits until every worker shows the
  same config offset and connectors twice in a row, records each worker's final state (`cview`)
  and whether they converged (`cconverged`), then the raw config log (`clog`) up to the offset
  the workers reached.

The clients and the observer bind 127.0.0.13 (CONNECT_CLIENT_IP), so partitions cut them off too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from ferrymq.chaos.cluster import Cluster, Node
from ferrymq.chaos.connect_check import CREATE_OPS
from ferrymq.chaos.history import ConnectorView, EventType, LogEntry
from ferrymq.chaos.recorder import Recorder
from ferrymq.chaos.workload import CONNECT_CLIENT_IP

__all__ = ["CONNECT_OBSERVER", "ConnectConfig", "ConnectWorkload", "connector_config"]

log = logging.getLogger(__name__)

CONNECT_OBSERVER: Final = "connect-observer"
"""The `proc` of the observer's and the final check's events."""
_KINDS: Final = ("create", "create-stopped", "patch", "patch", "pause", "stop", "delete")
_NOT_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_LOG_PAGE: Final = 1000
_LOG_WAIT_S: Final = 40.0
"""How long the final check waits for a worker to show the whole raw config log: longer than a
client's route refresh (30 s), since a worker whose cached route names only slaves shows an
empty log until then (its pulls get "pull the master", which `GET /log` takes for the end)."""


def connector_config(value: str) -> dict[str, str]:
    """A replicator's config; created PAUSED or STOPPED it never starts a query."""
    return {
        "connector.class": "FerrymqReplicator",
        "topics": "chaos-connect-src",
        "target.topic.format": "${topic}-copy",
        "x": value,
    }


def _request(kind: str, name: str, value: str) -> tuple[str, str, dict[str, Any] | None]:
    if kind in CREATE_OPS:
        body = {"name": name, "config": connector_config(value), "initial_state": CREATE_OPS[kind]}
        return "POST", "/connectors", body
    if kind == "patch":
        return "PATCH", f"/connectors/{name}/config", {"x": value}
    if kind == "pause":
        return "PUT", f"/connectors/{name}/pause", None
    if kind == "stop":
        return "PUT", f"/connectors/{name}/stop", None
    return "DELETE", f"/connectors/{name}", None


def _message(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:200]
    return str(body.get("message", "")) if isinstance(body, dict) else ""


@dataclass(frozen=True)
class ConnectConfig:
    """Shape and rate of the Connect load."""

    clients: int = 3
    live_connectors: int = 2
    """Connectors each client writes to at a time."""
    writes_per_second: float = 6.0
    """In total, over all clients."""
    connect_timeout_s: float = 2.0
    answer_timeout_s: float = 25.0
    """Longer than a worker takes to answer 504 (its 10 s request timeout, plus 5 s when a
    follower forwards), so a client timeout means a worker that could not answer at all."""


@dataclass
class ConnectWorkload:
    """Runs the Connect clients and observer against `cluster.workers`; records what they see."""

    cluster: Cluster
    recorder: Recorder
    config: ConnectConfig
    rng: random.Random
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def _http(self, timeout: float) -> httpx.AsyncClient:
        transport = self.cluster.http_transport(
            CONNECT_CLIENT_IP, limits=httpx.Limits(max_keepalive_connections=0)
        )
        return httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=self.config.connect_timeout_s),
        )

    def start(self) -> None:
        """Start every client and the observer (nothing without workers)."""
        if not self.cluster.workers:
            return
        loop = asyncio.get_running_loop()
        for k in range(self.config.clients):
            rng = random.Random(self.rng.random())
            self._tasks.append(loop.create_task(self._client(k, rng)))
        self._tasks.append(loop.create_task(self._observe()))

    async def finish(self) -> None:
        """Stop the clients (each finishes its write in progress) and the observer."""
        self.stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    # ------------------------------------------------------------------ clients

    async def _client(self, k: int, rng: random.Random) -> None:
        proc = f"k{k}"
        counter = 0

        def fresh() -> str:
            nonlocal counter
            counter += 1
            return f"{proc}-c{counter - 1}"

        live = [fresh() for _ in range(self.config.live_connectors)]
        interval = self.config.clients / self.config.writes_per_second
        async with self._http(self.config.answer_timeout_s) as http:
            for n in range(10**9):
                if self.stop.is_set():
                    return
                workers = [w for w in self.cluster.workers if w.running]
                if not workers:
                    await asyncio.sleep(0.2)
                    continue
                slot = rng.randrange(len(live))
                name, kind, worker = live[slot], rng.choice(_KINDS), rng.choice(workers)
                outcome = await self._write(http, proc, name, kind, f"{proc}-{n}", worker)
                if outcome == "info":
                    live[slot] = fresh()  # the unknown write stays its connector's last
                await asyncio.sleep(interval * rng.uniform(0.5, 1.5))

    async def _write(
        self, http: httpx.AsyncClient, proc: str, name: str, kind: str, value: str, worker: Node
    ) -> EventType:
        method, path, body = _request(kind, name, value)
        fields: dict[str, Any] = {"conn": name, "op": kind, "v": value, "node": worker.name}
        self.recorder.record(proc, "invoke", "cwrite", **fields)
        try:
            answer = await http.request(method, worker.url + path, json=body)
        except _NOT_SENT as exc:
            error = f"not sent: {type(exc).__name__}: {exc}"
            self.recorder.record(proc, "fail", "cwrite", **fields, error=error)
            return "fail"
        except httpx.HTTPError as exc:
            error = f"no answer: {type(exc).__name__}: {exc}"
            self.recorder.record(proc, "info", "cwrite", **fields, error=error)
            return "info"
        status = answer.status_code
        outcome: EventType = (
            "ok" if 200 <= status < 300 else "fail" if status in (400, 404, 409) else "info"
        )
        message = _message(answer) if outcome != "ok" else None
        self.recorder.record(proc, outcome, "cwrite", **fields, status=status, error=message)
        return outcome

    # ------------------------------------------------------------------ observer

    async def _observe(self) -> None:
        epoch = -1
        exits: dict[str, int] = {}
        transport = self.cluster.http_transport(CONNECT_CLIENT_IP)
        async with httpx.AsyncClient(transport=transport, timeout=0.8) as http:
            while not self.stop.is_set():
                for worker in self.cluster.workers:
                    self._note_exit(worker, exits)
                asked = [w for w in self.cluster.workers if w.running and not w.paused]
                # all at once: a worker cut off (it answers nothing) delays no other's answer
                for seen, leader_id in await asyncio.gather(
                    *(self._leader(http, w) for w in asked)
                ):
                    if seen > epoch and leader_id:
                        epoch = seen
                        node = self.cluster.worker(leader_id)
                        self.recorder.record(
                            CONNECT_OBSERVER,
                            "ok",
                            "cleader",
                            node=node.name if node is not None else leader_id,
                            epoch=seen,
                        )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 0.5)

    @staticmethod
    async def _leader(http: httpx.AsyncClient, worker: Node) -> tuple[int, str]:
        """(epoch, leader id) as the worker reports them; (-1, "") when it does not answer."""
        try:
            leader = (await http.get(worker.url + "/")).json()["leader"]
            return int(leader["epoch"]), str(leader["worker_id"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return -1, ""

    def _note_exit(self, worker: Node, exits: dict[str, int]) -> None:
        process = worker.process
        if process is None or exits.get(worker.name) == worker.starts:
            return
        code = process.poll()
        if code is None or code == -signal.SIGKILL:
            return
        exits[worker.name] = worker.starts
        self.recorder.record(
            CONNECT_OBSERVER, "info", "cexit", node=worker.name, error=f"exited with {code}"
        )

    # ------------------------------------------------------------------ the end

    async def _view(
        self, http: httpx.AsyncClient, worker: Node
    ) -> tuple[int, dict[str, ConnectorView]] | str:
        """(config offset, connectors) as the worker shows them, or why it did not."""
        if not worker.running or worker.paused:
            return "not running"
        try:
            answer = await http.get(
                worker.url + "/connectors", params=[("expand", "info"), ("expand", "status")]
            )
            answer.raise_for_status()
            offset = int(answer.headers["X-Ferry-Config-Offset"])
            view = {
                name: ConnectorView(
                    state=str(entry["status"]["connector"]["state"]),
                    config={str(k): str(v) for k, v in entry["info"]["config"].items()},
                    tasks=len(entry["info"]["tasks"]),
                )
                for name, entry in answer.json().items()
            }
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return offset, view

    async def final(self, timeout: float) -> bool:
        """Wait for the workers to agree, record their final states and the log; True if they did.

        Agreeing: every worker shows the same config offset and connectors twice in a row (at
        most `timeout` s). Records each one's final state (`cview`), whether they converged
        (`cconverged`) and the raw config log (`clog`).
        """
        if not self.cluster.workers:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        previous: list[tuple[int, dict[str, ConnectorView]] | str] | None = None
        async with self._http(5.0) as http:
            while True:
                views = [await self._view(http, w) for w in self.cluster.workers]
                answered = [v for v in views if not isinstance(v, str)]
                agreed = len(answered) == len(views) and all(v == answered[0] for v in answered)
                if agreed and views == previous:
                    break
                if loop.time() > deadline:
                    break
                previous = views
                await asyncio.sleep(1.0)
            converged = agreed and views == previous
            for worker, view in zip(self.cluster.workers, views, strict=True):
                if isinstance(view, str):
                    self.recorder.record(
                        CONNECT_OBSERVER, "fail", "cview", node=worker.name, error=view
                    )
                else:
                    self.recorder.record(
                        CONNECT_OBSERVER, "ok", "cview", node=worker.name, off=view[0], view=view[1]
                    )
            offsets = sorted({v[0] for v in answered})
            self.recorder.record(
                CONNECT_OBSERVER,
                "ok" if converged else "fail",
                "cconverged",
                error=None
                if converged
                else f"not converged in {timeout:g} s: {len(answered)} of {len(views)} workers "
                f"answered, config offsets {offsets}",
            )
            await self._record_log(http, max(offsets, default=0))
        return converged

    async def _record_log(self, http: httpx.AsyncClient, end: int) -> None:
        """The raw config log as the workers show it (`clog`, `off` = the workers' offset).

        Asks each running worker in turn, for up to `_LOG_WAIT_S`, until one shows the log up to
        the config offset `end` the workers reached; records the longest it was shown, and why
        it fell short when it did.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _LOG_WAIT_S
        best: tuple[list[LogEntry], str] | None = None
        problems: list[str] = []
        while True:
            for worker in self.cluster.workers:
                if not worker.running or worker.paused:
                    continue
                try:
                    records = await self._read_log(http, worker)
                except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                    problems.append(f"{worker.name}: {type(exc).__name__}: {exc}")
                    continue
                shown = records[-1].offset + 1 if records else 0
                if best is None or shown > (best[0][-1].offset + 1 if best[0] else 0):
                    best = (records, worker.name)
                if shown >= end:
                    break
                problems.append(f"{worker.name} showed it up to {shown}")
            else:
                if loop.time() < deadline:
                    await asyncio.sleep(1.0)
                    continue
            break
        if best is None:
            error = "; ".join(problems[-3:]) or "no worker running"
            self.recorder.record(CONNECT_OBSERVER, "fail", "clog", off=end, error=error)
            return
        records, node = best
        self.recorder.record(
            CONNECT_OBSERVER,
            "ok",
            "clog",
            node=node,
            off=end,
            records=records,
            error="; ".join(problems[-3:]) or None,
        )

    @staticmethod
    async def _read_log(http: httpx.AsyncClient, worker: Node) -> list[LogEntry]:
        records: list[LogEntry] = []
        while True:
            start = records[-1].offset + 1 if records else 0
            answer = await http.get(worker.url + "/log", params={"from": start, "limit": _LOG_PAGE})
            answer.raise_for_status()
            page = answer.json()
            records += [_entry(r) for r in page]
            if len(page) < _LOG_PAGE:
                return records


def _entry(raw: dict[str, Any]) -> LogEntry:
    record = raw.get("record")
    kind = str(raw["kind"])
    claimed = record.get("epoch") if kind == "Claim" and isinstance(record, dict) else None
    return LogEntry(
        offset=int(raw["offset"]),
        logical_offset=int(raw["logical_offset"]),
        kind=kind,
        epoch=raw.get("epoch"),
        writer=str(raw.get("writer") or ""),
        claimed=int(claimed) if claimed is not None else None,
    )
