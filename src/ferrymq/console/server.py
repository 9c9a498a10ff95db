"""The running console: uvicorn on one socket (port 0 allowed) and the sampling task.

Rules: the console is an async context manager; `url` is known once entered (the socket is bound
before serving, so port 0 reads back). Leaving it stops the sampler, then uvicorn (which closes
the socket), then the admin connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from types import TracebackType
from typing import Final, Self

import uvicorn

from ferrymq.console.app import build_app
from ferrymq.console.reader import ConsoleReader
from ferrymq.console.sampler import Sampler
from ferrymq.security import tlsreload
from ferrymq.security.tls import process_server_tls

__all__ = ["Console"]

_SHUTDOWN_S: Final = 5.0


class Console:
    """The web console of one cluster, served at `url`."""

    def __init__(
        self,
        namesrv_addr: str,
        *,
        controller_addr: str | None = None,
        connect_url: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        interval: float = 1.0,
    ) -> None:
        self.reader = ConsoleReader(
            namesrv_addr, controller_addr=controller_addr, connect_url=connect_url
        )
        self.sampler = Sampler(self.reader, interval)
        self._host = host
        self._port = port
        self._socket: socket.socket | None = None
        self._server: _Server | None = None
        self._watching: asyncio.Task[None] | None = None
        """Reloads the TLS files when they change (`tlsreload`)."""
        self._tasks: list[asyncio.Task[None]] = []
        self.url = ""

    async def __aenter__(self) -> Self:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        sock.listen(128)
        sock.setblocking(False)
        self._socket = sock
        host, port = sock.getsockname()[:2]
        server_tls = process_server_tls()  # the process's TLS (ferry console --tls)
        tls = server_tls.context
        scheme = "https" if tls is not None else "http"
        self.url = (
            f"{scheme}://[{host}]:{port}"
            if family == socket.AF_INET6
            else f"{scheme}://{host}:{port}"
        )
        config = uvicorn.Config(
            build_app(self.reader, self.sampler),
            log_level="warning",
            lifespan="off",
            access_log=False,
            loop="none",
            timeout_graceful_shutdown=int(_SHUTDOWN_S) - 1,
        )
        if tls is not None:
            config.load()  # then uvicorn serves with our context, built in one place
            config.ssl = tls
        self._server = _Server(config)
        self._tasks = [
            asyncio.create_task(self._server.serve(sockets=[sock]), name="console-http"),
            asyncio.create_task(self.sampler.run(), name="console-sampler"),
        ]
        self._watching = asyncio.create_task(tlsreload.watch(server_tls), name="console-tls")
        return self

    async def serve_forever(self) -> None:
        """Wait until serving or sampling fails (it raises) or the console is closed."""
        done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
        http, sampler = self._tasks or (None, None)
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sampler
        if http is not None and self._server is not None:
            self._server.should_exit = True  # uvicorn closes the socket it took over
            try:
                await asyncio.wait_for(asyncio.shield(http), _SHUTDOWN_S)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing goes on regardless
                http.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await http
        elif self._socket is not None:
            self._socket.close()
        self._tasks = []
        await self.reader.close()


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the process's own loop owns SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        yield
