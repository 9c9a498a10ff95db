"""Remoting client: one shared connection per address, opened on first use and reopened after loss.

A failed connect puts the address in back-off (doubling from 0.1 s to 5 s); calls during the
back-off fail at once with `ConnectError`, so a dead broker costs its callers nothing but an
error. In-flight requests are bounded per client; callers beyond the bound wait for a slot.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self

from ferrymq.errors import ConnectError
from ferrymq.model import parse_address
from ferrymq.rpc.connection import DEFAULT_MAX_IN_FLIGHT, Connection, RequestHandler
from ferrymq.security.acl import Credentials, sign
from ferrymq.security.aclcredentials import process_credentials
from ferrymq.security.tls import ClientTls, process_client_tls
from ferrymq.wire.frame import DEFAULT_MAX_FRAME_BYTES, RemotingCommand

__all__ = ["RpcClient"]

log = logging.getLogger(__name__)

_BACKOFF_FIRST: Final = 0.1
_BACKOFF_MAX: Final = 5.0
_CLOSE_WAIT_S: Final = 2.0
"""How long `close` waits for a connection's socket to go (a TLS close_notify) before aborting."""


@dataclass(slots=True)
class _Backoff:
    until: float
    delay: float
    reason: str


class RpcClient:
    """Connections to servers by address; use as an async context manager or `close()`."""

    def __init__(
        self,
        on_request: RequestHandler | None = None,
        *,
        connect_timeout: float = 3.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        local_host: str | None = None,
        tls: ClientTls | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """Create a client; `local_host` binds every outgoing connection to that source address.

        A server that talks to its peers (a controller node, a broker on 127.0.0.i) binds to its
        own listen address, so a peer sees who it is and network rules can single it out.
        `tls` None: the process's TLS (`ferrymq.security.tls.install`).
        """
        self._on_request = on_request
        self.credentials = credentials if credentials is not None else process_credentials()
        """ACL 1.0 (issue 23): every request this client sends is signed with these."""
        self._ssl = (tls if tls is not None else process_client_tls()).context
        self._local_addr = (local_host, 0) if local_host else None
        self._connect_timeout = connect_timeout
        self._max_frame_bytes = max_frame_bytes
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._backoff: dict[str, _Backoff] = {}
        self._free_slots = max_in_flight
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        """Callers waiting for a slot, first come first served; a freed slot goes to the first."""
        self._closed = False

    async def connection(self, address: str) -> Connection:
        """The open connection to `address`, connecting if needed.

        Raises:
            ConnectError: the connection cannot be made now (or the address is in back-off).
        """
        conn = self._connections.get(address)
        if conn is not None and not conn.is_closed:
            return conn
        if self._closed:
            raise ConnectError(address, "client closed")
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        backoff = self._backoff.get(address)
        if backoff is not None and time.monotonic() < backoff.until:
            raise ConnectError(address, f"{backoff.reason} (retrying in {backoff.delay:g} s)")
        future: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = future
        try:
            conn = await self._open(address)
        except ConnectError as exc:
            delay = min(_BACKOFF_MAX, backoff.delay * 2) if backoff else _BACKOFF_FIRST
            self._backoff[address] = _Backoff(time.monotonic() + delay, delay, str(exc))
            future.set_exception(exc)
            future.exception()  # retrieved: concurrent waiters get it through shield
            raise
        finally:
            self._connecting.pop(address, None)
        self._backoff.pop(address, None)
        self._connections[address] = conn
        future.set_result(conn)
        return conn

    async def _open(self, address: str) -> Connection:
        try:
            host, port = parse_address(address)
        except ValueError as exc:
            raise ConnectError(address, str(exc)) from None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(self._on_request, max_frame_bytes=self._max_frame_bytes),
                    host,
                    port,
                    local_addr=self._local_addr,
                    ssl=self._ssl,
                    server_hostname=host if self._ssl is not None else None,
                )
        except TimeoutError:
            raise ConnectError(
                address, f"no connection within {self._connect_timeout:g} s"
            ) from None
        except ssl.SSLCertVerificationError as exc:
            raise ConnectError(
                address,
                f"TLS: the server's certificate is not trusted ({exc.verify_message}); "
                "is tls.client.trustCertPath / --tls-ca the CA that signed it?",
            ) from None
        except ssl.SSLError as exc:
            raise ConnectError(address, f"TLS handshake failed: {exc.reason or exc}") from None
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            if self._ssl is not None and not isinstance(exc, ConnectionRefusedError):
                reason = f"TLS handshake failed: {reason} (is the server's port TLS?)"
            raise ConnectError(address, reason) from None
        conn.peer = address
        return conn

    async def call(self, address: str, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send `request` to `address` and return the response.

        Raises:
            ConnectError: not sent (no connection).
            RequestTimeoutError, ConnectionClosedError: sent, outcome unknown.
        """
        conn = self._connections.get(address)
        if conn is None or conn.is_closed:
            conn = await self.connection(address)
        # the in-flight bound, by hand: `async with asyncio.Semaphore` costs two coroutines a
        # call even when a slot is free, which it nearly always is
        if self._free_slots > 0 and not self._slot_waiters:
            self._free_slots -= 1
        else:
            await self._wait_for_slot()
        try:
            if self.credentials is not None:
                sign(request.ext_fields, request.body, self.credentials, request.version)
            return await conn.call(request, timeout)
        finally:
            self._release_slot()

    async def _wait_for_slot(self) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release_slot()  # handed a slot as it was cancelled: pass it on
            elif future in self._slot_waiters:  # not yet skipped by `_release_slot`
                self._slot_waiters.remove(future)
            raise

    def _release_slot(self) -> None:
        """Hand the slot to the first caller still waiting, else free it."""
        waiters = self._slot_waiters
        while waiters:
            future = waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self._free_slots += 1

    async def oneway(self, address: str, request: RemotingCommand) -> None:
        """Send `request` to `address` expecting no response."""
        conn = await self.connection(address)
        if self.credentials is not None:
            sign(request.ext_fields, request.body, self.credentials, request.version)
        await conn.oneway(request)

    def forget_backoff(self, address: str) -> None:
        """Allow an immediate reconnect to `address` (e.g. after a route change)."""
        self._backoff.pop(address, None)

    async def close(self) -> None:
        """Close every connection; later calls fail with `ConnectError`."""
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        for conn in connections:
            conn.close()
        await asyncio.gather(*(conn.cancel_requests() for conn in connections))
        await asyncio.gather(*(conn.wait_closed(_CLOSE_WAIT_S) for conn in connections))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
