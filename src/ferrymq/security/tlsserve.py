"""Listeners with TLS: plain, TLS only (`enforcing`) or both on one port (`permissive`).

A disabled mode is `loop.create_server`, as before. Otherwise this module accepts connections
itself, peeks at each one's first byte (a TLS record starts with 0x16, a handshake; a remoting
frame with its length's high byte, 0 below 16 MiB), and hands the socket to the loop with or
without TLS (`connect_accepted_socket`). A refused or failed connection costs one log line and
its socket, never the listener: plain text on an enforcing port, a handshake that fails (an
unknown CA, no client certificate where one is required, garbage), a peer silent for
`HANDSHAKE_TIMEOUT` seconds. At most `MAX_PENDING` connections wait for their first byte or
handshake at once; later ones are closed at once. A client that keeps trying (a plain-text
poller) gets one line per `LOG_EVERY` seconds for its host and kind of refusal, saying how many
were not logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Final

from ferrymq.security import tlsreload
from ferrymq.security.tls import ServerTls, TlsMode

__all__ = ["HANDSHAKE_TIMEOUT", "LOG_EVERY", "MAX_PENDING", "Listener", "listen"]

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT: Final = 10.0
"""Seconds a new connection has to send its first byte and finish the TLS handshake."""

MAX_PENDING: Final = 256
"""Connections at most between accept and the end of their handshake."""

LOG_EVERY: Final = 60.0
"""Seconds between two log lines for refusals of one kind from one host."""

_LOGGED_MAX: Final = 1024
"""(host, kind) entries remembered for `LOG_EVERY`; all forgotten when full."""

_TLS_HANDSHAKE_RECORD: Final = 0x16


class Listener:
    """A listening socket (plain `asyncio.Server`, or this module's accept loop for TLS)."""

    def __init__(
        self,
        name: str,
        sockname: tuple[str, int],
        server: asyncio.Server | None,
        sock: socket.socket | None,
    ) -> None:
        self.name = name
        self.sockname = sockname
        """(host, port) listened on."""
        self._sock = sock
        self._server = server
        self._accepting: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None
        self._pending: set[asyncio.Task[None]] = set()
        self.refused = 0
        """Connections refused or failed before their protocol saw them (for tests and logs)."""
        self._logged: dict[tuple[str, str], tuple[float, int]] = {}
        """(host, kind) -> (when last logged, refusals not logged since)."""

    def _refuse(self, peer: str, kind: str, line: str) -> None:
        """Count a refusal; log it unless its host and kind were logged within `LOG_EVERY`."""
        self.refused += 1
        key = (peer.rsplit(":", 1)[0], kind)
        now = time.monotonic()
        last = self._logged.get(key)
        if last is not None and now - last[0] < LOG_EVERY:
            self._logged[key] = (last[0], last[1] + 1)
            return
        if len(self._logged) >= _LOGGED_MAX:
            self._logged.clear()
        self._logged[key] = (now, 0)
        if last is not None and last[1]:
            line += f" ({last[1]} more from {key[0]} not logged)"
        log.warning("%s: %s", self.name, line)

    def close(self) -> None:
        """Stop accepting and drop connections still in their handshake (then `wait_closed`)."""
        if self._server is not None:
            self._server.close()
            return
        for task in (self._accepting, self._watching, *self._pending):
            if task is not None:
                task.cancel()
        if self._sock is not None:
            self._sock.close()

    async def wait_closed(self) -> None:
        """Wait until `close` has taken effect."""
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            return
        tasks = (self._accepting, self._watching, *self._pending)
        for task in [t for t in tasks if t is not None]:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _start(self, factory: Callable[[], asyncio.Protocol], tls: ServerTls) -> None:
        loop = asyncio.get_running_loop()
        self._accepting = loop.create_task(self._accept(factory, tls))
        self._watching = loop.create_task(tlsreload.watch(tls))  # new certificates, no restart

    async def _accept(self, factory: Callable[[], asyncio.Protocol], tls: ServerTls) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                conn, peer = await loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and the like: the listener goes on
                log.warning("%s: accept failed: %s", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            if len(self._pending) >= MAX_PENDING:
                self._refuse(
                    _peer(peer),
                    "busy",
                    f"{MAX_PENDING} connections in their handshake; {_peer(peer)} closed",
                )
                conn.close()
                continue
            task = loop.create_task(self._admit(conn, _peer(peer), factory, tls))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _admit(
        self,
        conn: socket.socket,
        peer: str,
        factory: Callable[[], asyncio.Protocol],
        tls: ServerTls,
    ) -> None:
        loop = asyncio.get_running_loop()
        conn.setblocking(False)
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                first = await _peek(loop, conn)
                if not first:
                    conn.close()
                    return
                is_tls = first[0] == _TLS_HANDSHAKE_RECORD
                if not is_tls and tls.mode is TlsMode.ENFORCING:
                    self._refuse(
                        peer,
                        "plain",
                        f"plain text from {peer} on a TLS port (tls.server.mode=enforcing): "
                        "connection closed",
                    )
                    conn.close()
                    return
                await loop.connect_accepted_socket(
                    factory,
                    conn,
                    ssl=tls.context if is_tls else None,
                    ssl_handshake_timeout=HANDSHAKE_TIMEOUT if is_tls else None,
                )
        except TimeoutError:
            silent = f"{peer} sent nothing or no handshake within {HANDSHAKE_TIMEOUT:g} s"
            self._refuse(peer, "silent", silent)
            conn.close()
        except (ssl.SSLError, OSError, EOFError) as exc:
            self._refuse(peer, "handshake", f"TLS handshake with {peer} failed: {_reason(exc)}")
            conn.close()


def _peer(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return str(exc) or type(exc).__name__


async def _peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The connection's first byte, left in the socket; b"" if the peer closed."""
    fd = conn.fileno()
    while True:
        try:
            return conn.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            pass
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, readable.set_result, None)
        try:
            await readable
        finally:
            loop.remove_reader(fd)


async def listen(
    factory: Callable[[], asyncio.Protocol],
    host: str,
    port: int,
    tls: ServerTls,
    *,
    name: str,
) -> Listener:
    """Listen on `host:port` (0: the kernel picks) with `tls`; read the port from `sockname`."""
    loop = asyncio.get_running_loop()
    if tls.context is None and tls.mode is not TlsMode.DISABLED:
        # never plain text where TLS was asked for (a security setting does not fail open)
        raise ValueError(f"{name}: tls.server.mode={tls.mode} needs an SSLContext")
    if tls.mode is TlsMode.DISABLED:
        server = await loop.create_server(factory, host, port, reuse_address=True)
        return Listener(name, _sockname(server.sockets[0].getsockname()), server, None)
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    listener = Listener(name, _sockname(sock.getsockname()), None, sock)
    listener._start(factory, tls)
    return listener


def _sockname(address: tuple[object, ...]) -> tuple[str, int]:
    return str(address[0]), int(str(address[1]))
