"""The Prometheus endpoint of a server: `GET /metrics` of one registry, on its own port.

Owns the HTTP side of metrics (RocketMQ 5's `metricsExporterType=PROM`, `metricsPromExporterHost`,
`metricsPromExporterPort`): a tiny HTTP/1.1 responder on the server's own event loop, so the
collectors, which read the server's state at scrape time, run on the loop that owns that state
and need no locks (prometheus-client's `start_http_server` would scrape from another thread).

Rules:
1. One request per connection, answered and closed; the request head is bounded
   (`_MAX_HEAD_BYTES`) and must arrive within `_READ_TIMEOUT_S`.
2. A collector that raises fails that scrape with a 500 naming the error; the server goes on.
3. A server process makes one `CollectorRegistry` and registers its collectors on it; servers
   sharing a process (a NameServer with an embedded controller) share the registry and port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from enum import StrEnum
from types import TracebackType
from typing import Final, Self

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = [
    "DEFAULT_PROM_PORT",
    "FuncCollector",
    "MetricsExporterType",
    "MetricsServer",
    "serve",
]

log = logging.getLogger(__name__)

DEFAULT_PROM_PORT: Final = 5557
"""RocketMQ's default `metricsPromExporterPort`."""
_MAX_HEAD_BYTES: Final = 8192
_READ_TIMEOUT_S: Final = 5.0


class MetricsExporterType(StrEnum):
    """`metricsExporterType`: RocketMQ's values that ferrymq honours (OTLP_GRPC, LOG: not yet)."""

    DISABLE = "DISABLE"
    PROM = "PROM"


class FuncCollector(Collector):
    """A collector whose metrics a function builds at scrape time."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        """The metrics of this scrape."""
        return list(self._collect())


class MetricsServer:
    """Serves `registry` at `http://host:port/metrics`; use as an async context manager."""

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0):
        self.registry = registry
        self.host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (after `start`; port 0 asks the kernel for one)."""
        if self._server is None:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> str:
        """`host:port` to scrape."""
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        """Bind and serve."""
        self._server = await asyncio.start_server(self._serve, self.host, self._port)
        log.info("metrics on http://%s/metrics", self.address)

    async def close(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            if len(head) > _MAX_HEAD_BYTES:
                return
            status, content_type, body = self._answer(head)
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _answer(self, head: bytes) -> tuple[str, str, bytes]:
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) < 2 or parts[0] != b"GET":
            return "405 Method Not Allowed", "text/plain", b"GET /metrics\n"
        path = parts[1].split(b"?", 1)[0]
        if path not in (b"/metrics", b"/"):
            return "404 Not Found", "text/plain", b"GET /metrics\n"
        try:
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
        except Exception as exc:  # rule 2: a broken collector fails one scrape, not the server
            log.exception("metrics scrape failed")
            return "500 Internal Server Error", "text/plain", f"{exc!r}\n".encode()


def serve(
    port: int = DEFAULT_PROM_PORT,
    host: str = "127.0.0.1",
    registry: CollectorRegistry | None = None,
) -> MetricsServer:
    """A metrics endpoint for `registry` (default: prometheus-client's global `REGISTRY`).

    The one call a server needs: `async with metrics.serve(port) as endpoint:`; metrics made
    with prometheus-client's `Counter`/`Histogram` on that registry are then scraped there.
    """
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    return MetricsServer(registry, host, port)
