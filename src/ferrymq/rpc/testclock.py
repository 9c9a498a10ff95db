"""TEST_CLOCK on every server (broker, NameServer, controller): a test moves this process's clock.

Spec: `wire/testclock.py`. Every server routes the code; a process started without
`FERRYMQ_TEST_CLOCK=1` answers NO_PERMISSION saying how to enable it, and keeps running. A bad
action or argument answers INVALID_PARAMETER naming it. Each accepted change is logged as a
warning: a log reader must know the clock was moved on purpose.
"""

from __future__ import annotations

import logging

from ferrymq.clock import CLOCK, TEST_CLOCK_ENABLED, TEST_CLOCK_ENV, Clock
from ferrymq.errors import HeaderFieldError, RequestError
from ferrymq.rpc.connection import Connection, RequestHandler
from ferrymq.rpc.server import Router
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.testclock import ClockFault, ClockFaultRequestHeader, ClockFaultResponseHeader

__all__ = ["clock_fault_handler", "serve_test_clock"]

log = logging.getLogger(__name__)


def _seconds(header: ClockFaultRequestHeader, name: str) -> float:
    value = getattr(header, name)
    if value is None:
        raise RequestError(
            ResponseCode.INVALID_PARAMETER, f"TEST_CLOCK {header.action}: {name} is missing"
        )
    return float(value) / 1000


def _apply(clock: Clock, header: ClockFaultRequestHeader) -> str:
    """Change `clock` as `header` says; returns what was done."""
    try:
        match header.action:
            case ClockFault.BUMP:
                delta = _seconds(header, "delta_ms")
                clock.bump(delta)
                return f"bumped by {delta:+g} s"
            case ClockFault.STROBE:
                delta = _seconds(header, "delta_ms")
                period = _seconds(header, "period_ms")
                duration = _seconds(header, "duration_ms")
                clock.strobe(delta, period, duration)
                return f"strobing by {delta:+g} s every {period:g} s for {duration:g} s"
            case ClockFault.RESET:
                clock.reset()
                return "reset to the real clocks"
    except ValueError as exc:
        raise RequestError(
            ResponseCode.INVALID_PARAMETER, f"TEST_CLOCK {header.action}: {exc}"
        ) from None


def clock_fault_handler(
    clock: Clock = CLOCK, *, enabled: bool = TEST_CLOCK_ENABLED
) -> RequestHandler:
    """The TEST_CLOCK handler for `clock` (the process clock unless a test passes its own)."""

    async def handle(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """TEST_CLOCK (9900, ferrymq's own, test-only): bump, strobe or reset the clock."""
        if not enabled:
            raise RequestError(
                ResponseCode.NO_PERMISSION,
                f"TEST_CLOCK is refused: this process was not started with {TEST_CLOCK_ENV}=1",
            )
        try:
            header = from_ext_fields(ClockFaultRequestHeader, request.ext_fields)
        except HeaderFieldError as exc:
            raise RequestError(ResponseCode.INVALID_PARAMETER, f"TEST_CLOCK: {exc}") from None
        done = _apply(clock, header)
        offset = clock.offset()
        log.warning("test clock %s by %s: offset now %+.3f s", done, conn.peer, offset)
        answer = ClockFaultResponseHeader(
            offset_ms=round(offset * 1000), strobing=clock.is_strobing
        )
        return request.make_response(ResponseCode.SUCCESS, ext_fields=to_ext_fields(answer))

    return handle


def serve_test_clock(
    router: Router, clock: Clock = CLOCK, *, enabled: bool = TEST_CLOCK_ENABLED
) -> None:
    """Route TEST_CLOCK on `router`."""
    router.add(RequestCode.TEST_CLOCK, clock_fault_handler(clock, enabled=enabled))
