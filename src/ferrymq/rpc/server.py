"""Remoting servers: a routing table per server and the listening socket.

Each server (NameServer, broker, controller) builds one `Router` in one place, mapping request
codes to handler functions. The router turns handler errors into responses: `RequestError`
carries its own code, a header that does not parse answers SYSTEM_ERROR naming the field (as
RocketMQ answers a `RemotingCommandException`), and an unknown code answers
REQUEST_CODE_NOT_SUPPORTED.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Self

from ferrymq.errors import FerryError, HeaderFieldError, RequestError
from ferrymq.model import format_address
from ferrymq.rpc.busypoll import BusyPoll
from ferrymq.rpc.connection import (
    DEFAULT_MAX_IN_FLIGHT,
    Connection,
    EncodedFrame,
    LaterResponse,
    RequestHandler,
)
from ferrymq.security.tls import ServerTls, process_server_tls
from ferrymq.security.tlsserve import Listener, listen
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import DEFAULT_MAX_FRAME_BYTES, RemotingCommand

__all__ = ["Router", "RpcServer"]

log = logging.getLogger(__name__)


def _code_name(code: int) -> str:
    try:
        return RequestCode(code).name
    except ValueError:
        return str(code)


class Router:
    """Request code -> handler, for one server."""

    def __init__(self, server_name: str) -> None:
        self.server_name = server_name
        self._routes: dict[int, RequestHandler] = {}

    def add(self, code: int, handler: RequestHandler) -> None:
        """Route `code` to `handler`; each code is routed once."""
        if code in self._routes:
            raise ValueError(f"request code {code} is already routed")
        self._routes[code] = handler

    def handler(self, code: int) -> RequestHandler | None:
        """The handler routed for `code`, if any."""
        return self._routes.get(code)

    def replace(self, code: int, handler: RequestHandler) -> None:
        """Route an already routed `code` to `handler` (to compose two servers on one port)."""
        if code not in self._routes:
            raise ValueError(f"request code {code} is not routed")
        self._routes[code] = handler

    @property
    def codes(self) -> frozenset[int]:
        """Every routed request code."""
        return frozenset(self._routes)

    async def __call__(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand | EncodedFrame | LaterResponse | None:
        """Run the handler routed for the request's code; turn its errors into responses."""
        handler = self._routes.get(request.code)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s: %s from %s %s",
                self.server_name,
                _code_name(request.code),
                conn.peer,
                request.ext_fields,
            )
        if handler is None:
            return request.make_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f"{self.server_name} does not serve request code {request.code}",
            )
        try:
            return await handler(conn, request)
        except RequestError as exc:
            return request.make_response(exc.code, remark=exc.remark)
        except HeaderFieldError as exc:
            return request.make_response(
                ResponseCode.SYSTEM_ERROR,
                remark=f"{_code_name(request.code)}: bad header field {exc.field}: {exc.reason}",
            )
        except FerryError as exc:
            return request.make_response(ResponseCode.SYSTEM_ERROR, remark=str(exc))


class RpcServer:
    """A listening remoting server; use as an async context manager."""

    def __init__(
        self,
        router: RequestHandler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        on_close: Callable[[Connection], None] | None = None,
        busy_poll: BusyPoll | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        """Serve `router`; `tls` None: the process's TLS (`ferrymq.security.tls.install`)."""
        self._router = router
        self._tls = tls if tls is not None else process_server_tls()
        self._on_close = on_close
        self._busy_poll = busy_poll
        self._host = host
        self._port = port
        self._max_frame_bytes = max_frame_bytes
        self._max_in_flight = max_in_flight
        self._server: Listener | None = None
        self.connections: set[Connection] = set()

    def _protocol(self) -> Connection:
        conn = Connection(
            self._router,
            max_frame_bytes=self._max_frame_bytes,
            max_in_flight=self._max_in_flight,
            on_close=self._closed,
            busy_poll=self._busy_poll,
        )
        self.connections.add(conn)
        return conn

    def _closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if self._on_close is not None:
            self._on_close(conn)

    async def start(self) -> None:
        """Listen; with port 0 the kernel picks a free port (read it from `address`)."""
        name = getattr(self._router, "server_name", "server")
        self._server = await listen(self._protocol, self._host, self._port, self._tls, name=name)

    @property
    def address(self) -> str:
        """`host:port` the server listens on."""
        assert self._server is not None, "server not started"
        host, port = self._server.sockname
        return format_address(host, port)

    @property
    def port(self) -> int:
        """The port the server listens on."""
        assert self._server is not None, "server not started"
        return self._server.sockname[1]

    async def close(self) -> None:
        """Stop listening, close every connection and cancel the requests in progress."""
        if self._server is None:
            return
        self._server.close()
        connections = list(self.connections)
        for conn in connections:
            conn.close()
        await asyncio.gather(*(conn.cancel_requests() for conn in connections))
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
