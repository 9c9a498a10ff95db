"""The front of the gRPC port: tells a connection's protocol by its first bytes, then splices it.

grpcio cannot answer bad input (it writes SETTINGS and closes, no GOAWAY, no status) nor serve
TLS and plain text on one port. So the public port is this asyncio server; grpcio listens on
127.0.0.1 port 0 (a TLS listener and/or a plain one, as the mode allows). The sans-IO part is
`classify` (first bytes -> `Kind`) and `decide` (kind and mode -> splice to which listener, or
which answer): an answer is written, then the connection is closed after the peer closes or
`LINGER` seconds (a lingering close, so the peer reads the answer instead of a reset).

- HTTP/1.x request: `HTTP/1.1 505 HTTP Version Not Supported`, text body saying the port speaks
  gRPC over HTTP/2. grpc-java's Netty server (RocketMQ's proxy) answers an HTTP/1.x request with
  an HTTP/2 GOAWAY ("Unexpected HTTP/1.x request: GET /"), which an HTTP/1 client shows as
  binary noise; grpc-go closes. 505 is what the request earned (RFC 9110 15.6.6: the server
  refuses the request's major version); 426 Upgrade Required would need an `Upgrade` header, and
  gRPC clients never upgrade (RFC 9113 drops h2c upgrade), so there is nothing to upgrade to.
- Anything else that is not the HTTP/2 preface: SETTINGS then GOAWAY PROTOCOL_ERROR with debug
  data (RFC 9113 3.4: a bad preface is a connection error PROTOCOL_ERROR).
- HTTP/2 in plain text on a TLS-only (enforcing) port: the server's SETTINGS, then the first
  call is answered with gRPC status UNAVAILABLE "this port needs TLS ..." (a trailers-only
  response), then GOAWAY INADEQUATE_SECURITY (RFC 9113 9.2.1 names it for a connection whose
  security is not what the endpoint requires). A GOAWAY alone is not enough: grpc-core retries a
  call refused by GOAWAY on a new connection until its deadline, hundreds of times a second.
- TLS on a plain-only port: a fatal TLS alert `handshake_failure`, so the client's handshake
  fails at once instead of hanging.

Splicing is two asyncio Protocols writing into each other's transport; each pauses the other's
reading while its own write buffer is above its high-water mark, so nothing buffers without
bound. TLS is never terminated here (client certificates stay end to end). grpcio sees every
client as 127.0.0.1: `peers` maps the front's outgoing local address (grpcio's `context.peer()`)
to the real client's, and `resolve` reads it (ACL white addresses and sourceIps see the client).
At most `max_pending` connections wait for their first bytes; one silent for `first_timeout`
seconds is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, cast

from ferrymq.security.tls import TlsMode

__all__ = [
    "FIRST_BYTES_MAX",
    "FIRST_TIMEOUT",
    "H2_PREFACE",
    "Decision",
    "GrpcFront",
    "Kind",
    "classify",
    "decide",
]

log = logging.getLogger(__name__)

H2_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FIRST_BYTES_MAX: Final = 4096
"""Bytes read at most before a connection is classified (an HTTP/1 request line fits)."""
FIRST_TIMEOUT: Final = 10.0
"""Seconds a new connection has to send enough bytes to be classified."""
MAX_PENDING: Final = 256
"""Connections at most waiting for their first bytes; later ones are closed at once."""
LINGER: Final = 2.0
"""Seconds an answered connection waits for its peer to close before it is closed."""

# HTTP/2 frame types and error codes (RFC 9113 6, 7)
_SETTINGS: Final = 0x4
_GOAWAY: Final = 0x7
PROTOCOL_ERROR: Final = 0x1
INADEQUATE_SECURITY: Final = 0xC

_TLS_HANDSHAKE: Final = 0x16
_TLS_ALERT: Final = 0x15
HANDSHAKE_FAILURE: Final = 40

_REQUEST_LINE: Final = re.compile(rb"[A-Z]{1,16} [\x21-\x7e]{1,4000} HTTP/1\.[0-9]\r?\n")
_REQUEST_PREFIX: Final = re.compile(rb"[A-Z]{1,16}( [\x21-\x7e]*( H?T?T?P?/?1?\.?[0-9]?\r?)?)?")


class Kind(enum.Enum):
    """What a connection's first bytes are."""

    NEED_MORE = "need more bytes"
    TLS = "a TLS ClientHello"
    H2 = "the HTTP/2 client preface"
    HTTP1 = "an HTTP/1.x request"
    GARBAGE = "neither TLS nor HTTP/2"


def classify(data: bytes, limit: int = FIRST_BYTES_MAX) -> Kind:
    """The kind of a connection that began with `data` (GARBAGE once `limit` bytes say nothing)."""
    if not data:
        return Kind.NEED_MORE
    if data[0] == _TLS_HANDSHAKE:  # a handshake record, TLS 1.0-1.3 record versions 0x0301-4
        if len(data) < 3:
            return Kind.NEED_MORE
        return Kind.TLS if data[1] == 3 and data[2] <= 4 else Kind.GARBAGE
    head = data[: len(H2_PREFACE)]
    if H2_PREFACE.startswith(head):
        return Kind.H2 if len(head) == len(H2_PREFACE) else Kind.NEED_MORE
    line_end = data.find(b"\n")
    if line_end >= 0:
        return Kind.HTTP1 if _REQUEST_LINE.fullmatch(data[: line_end + 1]) else Kind.GARBAGE
    if len(data) < limit and _REQUEST_PREFIX.fullmatch(data):
        return Kind.NEED_MORE
    return Kind.GARBAGE


@dataclass(frozen=True, slots=True)
class Decision:
    """Splice to grpcio's TLS or plain listener (`to_tls`), or write `answer` and close."""

    to_tls: bool | None
    """True: the TLS listener; False: the plain one; None: answer instead."""
    answer: bytes = b""
    reason: str = ""
    """Why it was answered (for the log)."""
    call_refusal: str = ""
    """Not empty: after `answer`, wait for the first call (`first_stream`) and refuse it with
    `refuse_call(stream, call_refusal)` before closing."""


def goaway(error: int, debug: str) -> bytes:
    """The server's (empty) SETTINGS frame, then GOAWAY `error` on stream 0 with `debug` data."""
    settings = struct.pack(">I", 0)[1:] + bytes((_SETTINGS, 0)) + struct.pack(">I", 0)
    payload = struct.pack(">II", 0, error) + debug.encode()
    head = struct.pack(">I", len(payload))[1:] + bytes((_GOAWAY, 0)) + struct.pack(">I", 0)
    return settings + head + payload


_SETTINGS_AND_ACK: Final = bytes((0, 0, 0, _SETTINGS, 0, 0, 0, 0, 0)) + bytes(
    (0, 0, 0, _SETTINGS, 1, 0, 0, 0, 0)
)
_HEADERS: Final = 0x1
_UNAVAILABLE: Final = 14


def first_stream(data: bytes) -> int | None:
    """The stream id of the first HEADERS frame after the preface in `data` (None: not yet)."""
    pos = len(H2_PREFACE)
    while pos + 9 <= len(data):
        if data[pos + 3] == _HEADERS:
            return int.from_bytes(data[pos + 5 : pos + 9]) & 0x7FFFFFFF
        pos += 9 + int.from_bytes(data[pos : pos + 3])
    return None


def _hpack_int(value: int) -> bytes:
    """An HPACK integer with a 7-bit prefix (RFC 7541 5.1), H (Huffman) bit clear."""
    if value < 127:
        return bytes((value,))
    out, value = bytearray((127,)), value - 127
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A literal header field without indexing, new name (RFC 7541 6.2.2)."""
    return b"\x00" + _hpack_int(len(name)) + name + _hpack_int(len(value)) + value


def refuse_call(stream: int, message: str) -> bytes:
    """A trailers-only answer UNAVAILABLE `message` on `stream`, then GOAWAY INADEQUATE_SECURITY."""
    block = (
        b"\x88"  # :status 200 (static table index 8)
        + _literal(b"content-type", b"application/grpc")
        + _literal(b"grpc-status", str(_UNAVAILABLE).encode())
        + _literal(b"grpc-message", message.replace("%", "%25").encode("ascii", "replace"))
    )
    flags = 0x1 | 0x4  # END_STREAM | END_HEADERS
    head = len(block).to_bytes(3) + bytes((_HEADERS, flags)) + stream.to_bytes(4)
    payload = struct.pack(">II", stream, INADEQUATE_SECURITY) + message.encode()
    return head + block + len(payload).to_bytes(3) + bytes((_GOAWAY, 0, 0, 0, 0, 0)) + payload


def tls_alert(description: int = HANDSHAKE_FAILURE) -> bytes:
    """A fatal TLS alert record (TLS 1.2 record version, as TLS 1.3 also writes)."""
    return bytes((_TLS_ALERT, 3, 3, 0, 2, 2, description))


def http1_answer(tls: bool) -> bytes:
    """`505 HTTP Version Not Supported` saying what the port speaks."""
    body = (
        "This port speaks gRPC over HTTP/2 (RocketMQ 5 MessagingService), not HTTP/1.x"
        + (", with TLS.\n" if tls else ".\n")
    ).encode()
    head = (
        "HTTP/1.1 505 HTTP Version Not Supported\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head + body


def decide(kind: Kind, mode: TlsMode) -> Decision:
    """What to do with a connection of `kind` on a port in `mode` (DISABLED: plain only)."""
    if kind is Kind.TLS:
        if mode is TlsMode.DISABLED:
            return Decision(None, tls_alert(), "TLS on a plain-text port")
        return Decision(True)
    if kind is Kind.H2:
        if mode is TlsMode.ENFORCING:
            why = "this port needs TLS: plain-text HTTP/2 refused (tls.server.mode=enforcing)"
            return Decision(None, _SETTINGS_AND_ACK, "plain text on a TLS port", call_refusal=why)
        return Decision(False)
    if kind is Kind.HTTP1:
        return Decision(None, http1_answer(mode is TlsMode.ENFORCING), "an HTTP/1.x request")
    expected = {
        TlsMode.DISABLED: "the HTTP/2 client preface",
        TlsMode.ENFORCING: "a TLS ClientHello",
        TlsMode.PERMISSIVE: "a TLS ClientHello or the HTTP/2 client preface",
    }[mode]
    debug = f"this port speaks gRPC: expected {expected}"
    return Decision(None, goaway(PROTOCOL_ERROR, debug), "neither TLS nor HTTP/2")


def grpc_peer(address: object) -> str:
    """`address` (a socket's) as grpcio's `context.peer()` writes it: `ipv4:h:p`, `ipv6:[h]:p`."""
    if isinstance(address, tuple) and len(address) >= 2:
        host, port = str(address[0]), address[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return str(address)


class _Side(asyncio.Protocol):
    """One side of a splice: what it reads goes to `peer`'s transport."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.out: asyncio.Transport | None = None
        """The peer's transport, once both sides are connected."""
        self.eof = False

    def data_received(self, data: bytes) -> None:
        out = self.out
        if out is not None:
            out.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.eof:
            self._close_both()
            return False
        if peer.transport.can_write_eof():
            peer.transport.write_eof()
        return True  # half-closed until the other side ends too

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._close_both()

    def _close_both(self) -> None:
        for side in (self, self.peer):
            if side is not None and side.transport is not None:
                side.transport.close()  # writes what is buffered first


class _Upstream(_Side):
    """The front's connection to grpcio."""

    def __init__(self, client: _Client) -> None:
        super().__init__()
        self.peer = client
        self.forget: Callable[[], None] | None = None
        """Called once the connection is lost (drops its entry in `GrpcFront.peers`)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's too
        # grpcio's SETTINGS may arrive before `create_connection` returns: relayed at once
        self.out = None if self.peer is None else self.peer.transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.forget is not None:
            self.forget()
        super().connection_lost(exc)


class _Client(_Side):
    """A connection accepted on the public port: classify, then splice or answer."""

    def __init__(self, front: GrpcFront) -> None:
        super().__init__()
        self.front = front
        self.first = bytearray()
        self.pending = True
        self.answered = False
        self.refusing = ""
        """A plain-text call refused on a TLS port: why (waiting for its HEADERS)."""
        self.timer: asyncio.TimerHandle | None = None
        self.real_peer = ""
        self.splicing = False
        """Classified for a splice, grpcio's connection not made yet."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's too
        self.real_peer = grpc_peer(transport.get_extra_info("peername"))
        front = self.front
        if len(front.pending) >= front.max_pending:
            front.refuse(self.real_peer, f"{front.max_pending} connections waiting; closed")
            self.pending = False
            transport.abort()
            return
        front.pending.add(self)
        front.clients.add(self)
        self.timer = asyncio.get_running_loop().call_later(front.first_timeout, self._silent)

    def _silent(self) -> None:
        self.front.refuse(
            self.real_peer, f"sent no protocol within {self.front.first_timeout:g} s; closed"
        )
        self._settled()
        if self.transport is not None:
            self.transport.abort()

    def _settled(self) -> None:
        if self.pending:
            self.pending = False
            self.front.pending.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def data_received(self, data: bytes) -> None:
        out = self.out
        if out is not None:
            out.write(data)
            return
        if self.splicing:
            self.first += data  # read before its pause took effect: relayed by `attached`
            return
        if self.answered or not self.pending:
            return  # an answered connection: discarded until it closes
        self.first += data
        if self.refusing:
            self._refuse_call()
            return
        kind = classify(bytes(self.first))
        if kind is Kind.NEED_MORE:
            return
        decision = decide(kind, self.front.mode)
        if decision.call_refusal:
            assert self.transport is not None
            self.transport.write(decision.answer)  # SETTINGS: grpc-core then sends the call
            self.refusing = decision.call_refusal
            self._refuse_call()
            return
        self._settled()
        if decision.to_tls is None:
            self._answer(decision)
        else:
            assert self.transport is not None
            self.splicing = True
            self.transport.pause_reading()
            self.front.splice(self, decision.to_tls)

    def _refuse_call(self) -> None:
        """Once the first call's HEADERS came, answer it (`refuse_call`) and close."""
        stream = first_stream(bytes(self.first))
        if stream is None:
            if len(self.first) > FIRST_BYTES_MAX:
                self._settled()
                why = "plain-text HTTP/2 on a TLS port, no call in its first bytes"
                self._answer(Decision(None, goaway(INADEQUATE_SECURITY, self.refusing), why))
            return
        self._settled()
        answer = refuse_call(stream, self.refusing)
        self._answer(Decision(None, answer, "plain-text HTTP/2 on a TLS port"))

    def _answer(self, decision: Decision) -> None:
        self.front.refuse(self.real_peer, f"{decision.reason}; answered and closed")
        self.answered = True
        transport = self.transport
        assert transport is not None
        transport.write(decision.answer)
        if transport.can_write_eof():
            transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(LINGER, transport.close)

    def eof_received(self) -> bool:
        if self.peer is None:
            self._settled()
            if self.transport is not None:
                self.transport.close()
            return False
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._settled()
        self.front.clients.discard(self)
        super().connection_lost(exc)

    def attached(self, upstream: _Upstream) -> None:
        """Relay both ways once grpcio accepted the front's connection (what was read first)."""
        assert self.transport is not None
        assert upstream.transport is not None
        self.peer = upstream
        if self.transport.is_closing():
            upstream.transport.close()
            return
        self.out = upstream.transport
        self.splicing = False
        upstream.transport.write(bytes(self.first))
        self.first = bytearray()
        self.transport.resume_reading()


class GrpcFront:
    """The public gRPC port in `mode`, splicing to grpcio's `plain` and/or `tls` listeners.

    `mode`: DISABLED (plain only), ENFORCING (TLS only) or PERMISSIVE (both), with the listener(s)
    that mode needs given as (host, port).
    """

    def __init__(
        self,
        mode: TlsMode,
        *,
        plain: tuple[str, int] | None = None,
        tls: tuple[str, int] | None = None,
        first_timeout: float = FIRST_TIMEOUT,
        max_pending: int = MAX_PENDING,
    ) -> None:
        if (mode is not TlsMode.ENFORCING) != (plain is not None):
            raise ValueError(f"GrpcFront: mode {mode} needs a plain listener iff not enforcing")
        if (mode is not TlsMode.DISABLED) != (tls is not None):
            raise ValueError(f"GrpcFront: mode {mode} needs a TLS listener iff not disabled")
        self.mode = mode
        self.plain = plain
        self.tls = tls
        self.first_timeout = first_timeout
        self.max_pending = max_pending
        self.pending: set[_Client] = set()
        self.clients: set[_Client] = set()
        self.peers: dict[str, str] = {}
        """grpcio's `context.peer()` of a front connection -> the real client's, same format."""
        self.refused = 0
        """Connections answered, refused or timed out before they were spliced."""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def resolve(self, peer: str) -> str:
        """The real client behind grpcio's `peer` (`peer` itself when it is not the front's)."""
        return self.peers.get(peer, peer)

    def refuse(self, peer: str, why: str) -> None:
        """Count a connection not spliced; log the first ten and every 1000th."""
        self.refused += 1
        level = logging.INFO if self.refused <= 10 or self.refused % 1000 == 0 else logging.DEBUG
        log.log(level, "gRPC port: %s %s (%d so far)", peer, why, self.refused)

    async def start(self, host: str, port: int) -> int:
        """Listen on `host:port` (0: a free one); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Client(self), host, port, reuse_address=True
        )
        return int(self._server.sockets[0].getsockname()[1])

    def splice(self, client: _Client, to_tls: bool) -> None:
        """Connect `client` to grpcio's TLS or plain listener (in a task)."""
        task = asyncio.get_running_loop().create_task(self._connect(client, to_tls))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, client: _Client, to_tls: bool) -> None:
        target = self.tls if to_tls else self.plain
        assert target is not None
        loop = asyncio.get_running_loop()
        try:
            transport, upstream = await loop.create_connection(lambda: _Upstream(client), *target)
        except OSError as exc:
            log.warning("gRPC port: cannot reach grpcio at %s:%d: %s", *target, exc)
            if client.transport is not None:
                client.transport.abort()
            return
        key = grpc_peer(transport.get_extra_info("sockname"))
        self.peers[key] = client.real_peer  # before grpcio can read a call on it
        transport.set_write_buffer_limits(high=256 * 1024)
        if client.transport is not None:
            client.transport.set_write_buffer_limits(high=256 * 1024)

        def forget() -> None:
            if self.peers.get(key) == client.real_peer:
                del self.peers[key]

        upstream.forget = forget
        client.attached(upstream)

    def stop_accepting(self) -> None:
        """Close the listening socket; connections go on until `close`."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop listening and close every connection (grpcio closes its side itself)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for client in list(self.clients):
            if client.transport is not None:
                client.transport.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
