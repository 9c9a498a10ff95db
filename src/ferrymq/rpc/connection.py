"""One remoting connection: the asyncio edge between a socket and the sans-IO frame codec.

Both ends use the same class. Incoming responses resolve the caller waiting on their opaque;
incoming requests go to the connection's request handler, started eagerly: a handler that finishes
without waiting (an ASYNC_FLUSH send, an offset query) answers inside `data_received`, and only one
that waits becomes a task (`rpc.eager`). Responses made while one read is processed are written
together. Outside a read, a command with no other request in flight its way (a sync send; the
response to one) is written at once; otherwise it waits for the start of the next loop turn and
goes out with the others of this turn (the requests of a window of sends; the responses one
replication ack commits), or earlier once 16 wait, so the peer is kept busy: one syscall and one
wake-up of the peer for many. Writes keep their order. A server pushes requests to clients the
same way (NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE).

Calls time out by one timer per connection, armed for the earliest deadline, not one per call.

A handler that must wait for something another party resolves (a send waiting for its slaves'
acks) may return `conn.answer_later(request)` instead of awaiting it, and `send` the response
from that party's callback: no task, no coroutine frames and no loop turn in between.

Rules:
1. Bytes that do not decode close this connection (logged with the peer and the reason); the
   process and every other connection keep running.
2. Back-pressure both ways: at `max_in_flight` unanswered incoming requests (tasks and later
   responses) the connection stops reading until one finishes; writers wait while the
   transport's buffer is above its high-water mark (`pause_writing`).
3. When the connection is lost every waiting caller fails with `ConnectionClosedError`: its
   request was sent, so its outcome is unknown.
4. A handler's first step runs outside any task, so it bounds waits with `rpc.deadline`, not
   `asyncio.timeout` (which needs a current task).
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from ferrymq.errors import ConnectionClosedError, ProtocolError, RequestTimeoutError
from ferrymq.rpc.busypoll import BusyPoll
from ferrymq.rpc.eager import start_eagerly
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.frame import (
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_ONEWAY,
    FrameDecoder,
    RemotingCommand,
    encode_frame_parts,
)

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "Connection",
    "EncodedFrame",
    "LaterResponse",
    "RequestHandler",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT: Final = 1024
"""Unanswered requests one connection may have before its reading pauses."""

_DEFERRED_PARTS: Final = 32
"""Deferred writes go out once this many parts (16 commands with bodies) wait, not only at the
next turn: a turn that makes a window of sends takes long, and the peer should start on them."""

_COMPACT_SLACK: Final = 1024
"""Answered calls the deadline heap may hold beyond twice the unanswered ones before it is
rebuilt without them (answered calls leave it lazily, when they reach its top)."""


class EncodedFrame(bytes):
    """A whole encoded frame, written as it is (a response built without a `RemotingCommand`).

    See `wire.broker.encode_send_ok`.
    """

    __slots__ = ()


class LaterResponse:
    """The answer to one request, sent later (`Connection.answer_later`).

    A handler returns it in place of a response and calls `send` or `send_built` once the
    response is ready; until then the request counts as in flight. Only the first answer counts.
    """

    __slots__ = ("_conn", "_request", "_sent")

    def __init__(self, conn: Connection, request: RemotingCommand) -> None:
        self._conn = conn
        self._request = request
        self._sent = False

    def send(self, response: RemotingCommand | EncodedFrame) -> None:
        """Answer with `response` (written with the others of this loop turn)."""
        if not self._sent:
            self._sent = True
            self._conn._answered_later(self._request, response)

    def send_built(self, build: Callable[[], RemotingCommand | EncodedFrame]) -> None:
        """Answer with what `build()` returns, or SYSTEM_ERROR naming what it raised."""
        try:
            response = build()
        except Exception as exc:
            log.exception("request %d from %s failed", self._request.code, self._conn.peer)
            response = self._request.make_response(ResponseCode.SYSTEM_ERROR, remark=str(exc))
        self.send(response)


RequestHandler = Callable[
    ["Connection", RemotingCommand],
    Awaitable[RemotingCommand | EncodedFrame | LaterResponse | None],
]
"""Handles one incoming request; returns the response (or its encoded frame), a
`LaterResponse`, or None for none."""

_opaques = itertools.count(1)


def next_opaque() -> int:
    """A request id, unique in this process (wraps within the int32 range)."""
    return next(_opaques) & 0x7FFFFFFF


class Connection(asyncio.Protocol):
    """A remoting connection carrying requests and responses both ways."""

    def __init__(
        self,
        on_request: RequestHandler | None = None,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        on_close: Callable[[Connection], None] | None = None,
        busy_poll: BusyPoll | None = None,
    ) -> None:
        self._on_request = on_request
        self._on_close = on_close
        self._busy_poll = busy_poll
        """The server's loop poller, told of every read (None: a client, which never polls)."""
        self._decoder = FrameDecoder(max_frame_bytes)
        self._max_in_flight = max_in_flight
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._later = 0
        """`LaterResponse`s not yet answered (counted in flight, like tasks)."""
        self._backlog: collections.deque[RemotingCommand] = collections.deque()
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False
        self._corked: list[bytes] | None = None
        self._joins_writes = False
        """TLS: parts written together go out as one write, so as one TLS record (up to 16 KiB)
        instead of one record per part, each with its own encryption call and header."""
        self._deferred: list[bytes] | None = None
        """Commands made outside a read with others in flight, written together by
        `_write_deferred` at the start of the next turn (None: nothing waits; a lone command is
        written at once, and the next that is not lone starts the list)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadlines: list[tuple[float, int, asyncio.Future[RemotingCommand]]] = []
        """Unanswered calls by deadline (loop time), and answered ones not yet dropped."""
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_timer_at = 0.0
        self.closed = asyncio.Event()
        self.peer = "?"
        self.attributes: dict[str, object] = {}
        """What the owner of the connection remembers about the peer (client id, group...)."""

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Remember the transport and the peer's address."""
        self._transport = typing.cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._joins_writes = transport.get_extra_info("sslcontext") is not None
        self._loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.peer = f"{peer[0]}:{peer[1]}"

    def data_received(self, data: bytes) -> None:
        """Decode frames: responses resolve their callers, requests start handler tasks."""
        poll = self._busy_poll
        if poll is None:
            self._received(data)
            return
        poll.read_started()
        try:
            self._received(data)
        finally:
            poll.read_done()

    def _received(self, data: bytes) -> None:
        try:
            commands = self._decoder.feed(data)
        except ProtocolError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.close()
            return
        self._corked = []
        try:
            for command in commands:
                if command.is_response:
                    future = self._pending.pop(command.opaque, None)
                    if future is not None and not future.done():
                        future.set_result(command)
                else:
                    self._start_request(command)
        finally:
            corked, self._corked = self._corked, None
            if corked and self._transport is not None and not self._transport.is_closing():
                self._writelines(self._transport, corked)

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail every waiting caller and tell the owner."""
        self._transport = None
        self._writable.set()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionClosedError(self.peer))
        self._pending.clear()
        self._deadlines.clear()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self.closed.set()
        if self._on_close is not None:
            self._on_close(self)

    def pause_writing(self) -> None:
        """The transport's buffer is full: writers wait."""
        self._writable.clear()

    def resume_writing(self) -> None:
        """The transport's buffer drained: writers go on."""
        self._writable.set()

    # ------------------------------------------------------------------ requests in

    def _start_request(self, request: RemotingCommand) -> None:
        if len(self._tasks) + self._later >= self._max_in_flight:
            self._backlog.append(request)
            if not self._reading_paused:
                self._reading_paused = True
                if self._transport is not None:
                    self._transport.pause_reading()
            return
        task = start_eagerly(self._serve(request))
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._request_done)

    def _request_done(self, task: asyncio.Task[None] | None = None) -> None:
        if task is not None:
            self._tasks.discard(task)
        while self._backlog and len(self._tasks) + self._later < self._max_in_flight:
            self._start_request(self._backlog.popleft())
        if self._reading_paused and not self._backlog:
            self._reading_paused = False
            if self._transport is not None:
                self._transport.resume_reading()

    async def _serve(self, request: RemotingCommand) -> None:
        response: RemotingCommand | EncodedFrame | LaterResponse | None
        if self._on_request is None:
            response = request.make_response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f"request code {request.code} is not served on this connection",
            )
        else:
            try:
                response = await self._on_request(self, request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("request %d from %s failed", request.code, self.peer)
                response = request.make_response(ResponseCode.SYSTEM_ERROR, remark=str(exc))
        if isinstance(response, LaterResponse):
            return
        if response is not None and not request.is_oneway:
            if self._corked is None and not self._writable.is_set():
                await self._writable.wait()
            # this task is still among `_tasks`: alone when no other request is in flight
            self._write_soon(response, alone=len(self._tasks) <= 1 and not self._later)

    def answer_later(self, request: RemotingCommand) -> LaterResponse:
        """A handle to answer `request` later; return it from the handler (see the module)."""
        self._later += 1
        return LaterResponse(self, request)

    def _answered_later(
        self, request: RemotingCommand, response: RemotingCommand | EncodedFrame
    ) -> None:
        self._later -= 1
        if self._backlog or self._reading_paused:
            self._request_done()
        if not request.is_oneway and not self.is_closed:
            self._write_soon(response, alone=not self._tasks and not self._later)

    def _write_soon(self, command: RemotingCommand | EncodedFrame, *, alone: bool) -> None:
        """Write a command: with the read's others inside `data_received`, else batched by turn.

        `alone`: no other request is in flight this way (a sync send, its response): written
        at once. Else it waits for the start of the next loop turn, with the others made in
        this one (or until `_DEFERRED_PARTS` wait).
        """
        if self._corked is None and self._deferred is None and not alone:
            self._deferred = []
            self._later_turn(self._write_deferred)
        self.write(command)

    def _later_turn(self, callback: Callable[[], object]) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        loop.call_soon(callback)

    def _write_deferred(self) -> None:
        deferred, self._deferred = self._deferred, None
        transport = self._transport
        if deferred and transport is not None and not transport.is_closing():
            self._writelines(transport, deferred)

    def _writelines(self, transport: asyncio.Transport, parts: Sequence[bytes]) -> None:
        if self._joins_writes:
            transport.write(b"".join(parts))
        else:
            transport.writelines(parts)

    # ------------------------------------------------------------------ commands out

    @property
    def is_closed(self) -> bool:
        """Whether the connection is gone."""
        return self._transport is None or self._transport.is_closing()

    def write(self, command: RemotingCommand | EncodedFrame) -> None:
        """Write a command now (after what waits to be written), ignoring back-pressure.

        Use `send` for anything large.
        """
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        head: bytes
        body: bytes
        if isinstance(command, RemotingCommand):
            head, body = encode_frame_parts(command)
        else:  # an EncodedFrame
            head, body = command, b""
        # inside data_received: written together at its end; after a write this turn: at the
        # start of the next (in order)
        corked = self._corked
        if corked is not None:
            corked.append(head)
            if body:
                corked.append(body)
        elif (deferred := self._deferred) is not None:
            deferred.append(head)
            if body:
                deferred.append(body)
            if len(deferred) >= _DEFERRED_PARTS:  # keep the peer busy: do not hold a whole turn
                self._writelines(transport, deferred)
                deferred.clear()
        elif body:
            self._writelines(transport, (head, body))
        else:
            transport.write(head)

    async def send(self, command: RemotingCommand) -> None:
        """Write a command once the transport has room for it."""
        if not self._writable.is_set():
            await self._writable.wait()
        self.write(command)

    async def call(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for its response.

        Raises:
            ConnectionClosedError: the connection is or became closed.
            RequestTimeoutError: no response within `timeout` seconds.
        """
        loop = self._loop
        if loop is None or self.is_closed:
            raise ConnectionClosedError(self.peer)
        opaque = request.opaque = next_opaque()
        future: asyncio.Future[RemotingCommand] = loop.create_future()
        self._pending[opaque] = future
        deadline = loop.time() + timeout
        try:
            if not self._writable.is_set():
                # a peer that stopped reading (SIGSTOP, a full socket): the wait for room counts
                # against the same timeout, or callers would hang as long as the peer does
                await asyncio.wait_for(self._writable.wait(), timeout)
            self._write_soon(request, alone=len(self._pending) == 1)
            self._expire_at(deadline, opaque, future)
            return await future
        except TimeoutError:
            raise RequestTimeoutError(self.peer, request.code, timeout) from None
        finally:
            self._pending.pop(opaque, None)

    def _expire_at(
        self, deadline: float, opaque: int, future: asyncio.Future[RemotingCommand]
    ) -> None:
        """Fail `future` with TimeoutError at `deadline` unless it is done by then."""
        deadlines = self._deadlines
        heapq.heappush(deadlines, (deadline, opaque, future))
        if len(deadlines) > 2 * len(self._pending) + _COMPACT_SLACK:
            deadlines[:] = [entry for entry in deadlines if not entry[2].done()]
            heapq.heapify(deadlines)
        timer = self._deadline_timer
        if timer is None or deadline < self._deadline_timer_at:
            if timer is not None:
                timer.cancel()
            self._arm_deadline_timer(deadline)

    def _arm_deadline_timer(self, deadline: float) -> None:
        assert self._loop is not None
        self._deadline_timer = self._loop.call_at(deadline, self._expire_calls)
        self._deadline_timer_at = deadline

    def _expire_calls(self) -> None:
        self._deadline_timer = None
        assert self._loop is not None
        now = self._loop.time()
        deadlines = self._deadlines
        while deadlines and (deadlines[0][2].done() or deadlines[0][0] <= now):
            _, _, future = heapq.heappop(deadlines)
            if not future.done():
                future.set_exception(TimeoutError())
        if deadlines:
            self._arm_deadline_timer(deadlines[0][0])

    async def oneway(self, request: RemotingCommand) -> None:
        """Send a request that expects no response."""
        if self.is_closed:
            raise ConnectionClosedError(self.peer)
        request.opaque = next_opaque()
        request.flag |= FLAG_ONEWAY
        await self.send(request)

    def close(self) -> None:
        """Close the connection; waiting callers fail with `ConnectionClosedError`."""
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Drop the connection at once, without flushing what is buffered."""
        if self._transport is not None:
            self._transport.abort()

    async def wait_closed(self, timeout_s: float) -> None:
        """After `close`: wait until the socket is gone, then abort it if `timeout_s` passed.

        A TLS close first exchanges close_notify, which takes the loop a few turns: a client
        whose loop ended right after `close` left its socket open (a ResourceWarning later).
        """
        if self._transport is None:
            return
        try:
            await asyncio.wait_for(self.closed.wait(), timeout_s)
        except TimeoutError:
            self.abort()

    async def cancel_requests(self) -> None:
        """Cancel the incoming requests still being handled and wait for them to end."""
        self._backlog.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
