"""The test-clock request's headers (ferrymq's own TEST_CLOCK; served by `rpc/testclock.py`).

TEST_CLOCK moves the clock of the process that receives it (`ferrymq.clock`), for clock-fault
tests: `bump` steps it by `deltaMs` (either sign), `strobe` flips it between its offset and
offset + `deltaMs` every `periodMs` for `durationMs`, `reset` puts it back on the real clocks.
The answer carries the offset in force and whether a strobe runs. A process started without
`FERRYMQ_TEST_CLOCK=1` answers NO_PERMISSION; a bad action or argument answers INVALID_PARAMETER.
"""

from __future__ import annotations

from enum import StrEnum

from ferrymq.wire.headers import I64, CommandHeader

__all__ = ["ClockFault", "ClockFaultRequestHeader", "ClockFaultResponseHeader"]


class ClockFault(StrEnum):
    """What a TEST_CLOCK request does."""

    BUMP = "bump"
    STROBE = "strobe"
    RESET = "reset"


class ClockFaultRequestHeader(CommandHeader):
    """TEST_CLOCK: the action and its arguments (milliseconds, as wire fields are)."""

    action: ClockFault
    delta_ms: I64 | None = None
    """bump: the step; strobe: the flip."""
    period_ms: I64 | None = None
    """strobe: how long each half of a flip lasts."""
    duration_ms: I64 | None = None
    """strobe: how long it flips."""


class ClockFaultResponseHeader(CommandHeader):
    """TEST_CLOCK's answer: the clock as it now stands."""

    offset_ms: I64
    """How far ahead of the real clocks (negative: behind), strobe flip included."""
    strobing: bool
