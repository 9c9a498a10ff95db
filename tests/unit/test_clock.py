"""The process clock seam: bump, strobe and reset move both clocks; bad arguments are refused."""

import math
from collections.abc import Callable

import pytest

from ferrymq.broker.state import NO_LEASE_YET, MasterLease
from ferrymq.clock import MAX_OFFSET_S, Clock


class Source:
    """Real clocks a test moves by hand."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall_ns = 1_700_000_000_000 * 1_000_000

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall_ns += round(seconds * 1e9)


@pytest.fixture
def source() -> Source:
    return Source()


@pytest.fixture
def clock(source: Source) -> Clock:
    return Clock(lambda: source.mono, lambda: source.wall_ns)


def test_an_untouched_clock_reads_the_real_clocks(source: Source, clock: Clock) -> None:
    assert clock.mono() == 1000.0
    assert clock.wall_ms() == 1_700_000_000_000
    assert clock.offset() == 0.0
    source.advance(2.5)
    assert clock.mono() == 1002.5
    assert clock.wall_ms() == 1_700_000_002_500


def test_a_bump_steps_monotonic_and_wall_time_alike_and_adds_up(
    source: Source, clock: Clock
) -> None:
    assert clock.bump(-300.0) == -300.0
    assert clock.mono() == 700.0  # "monotonic" time went back
    assert clock.wall_ms() == 1_700_000_000_000 - 300_000
    assert clock.bump(0.5) == -299.5
    source.advance(1.0)
    assert clock.mono() == pytest.approx(701.5)
    assert clock.wall_ms() == 1_699_999_701_500


def test_reset_returns_to_the_real_clocks(source: Source, clock: Clock) -> None:
    clock.bump(42.0)
    clock.strobe(5.0, 0.1, 10.0)
    clock.reset()
    assert clock.offset() == 0.0
    assert not clock.is_strobing
    assert clock.mono() == source.mono
    assert clock.wall_ms() == source.wall_ns // 1_000_000


def test_a_strobe_flips_between_the_offset_and_offset_plus_delta_then_stops(
    source: Source, clock: Clock
) -> None:
    clock.bump(10.0)
    clock.strobe(-4.0, 0.5, 2.0)
    readings = []
    for _ in range(6):
        readings.append(clock.offset())
        source.advance(0.5)
    assert readings == [10.0, 6.0, 10.0, 6.0, 10.0, 10.0]
    assert not clock.is_strobing
    assert clock.mono() == source.mono + 10.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.bump(math.nan), "finite"),
        (lambda c: c.bump(math.inf), "finite"),
        (lambda c: c.bump(MAX_OFFSET_S + 1), "beyond"),
        (lambda c: c.strobe(1.0, 0.0, 5.0), "period"),
        (lambda c: c.strobe(1.0, 0.1, 0.0), "lasts"),
        (lambda c: c.strobe(1.0, 0.1, 1e9), "lasts"),
        (lambda c: c.strobe(-MAX_OFFSET_S - 10, 0.1, 5.0), "beyond"),
    ],
)
def test_bad_arguments_are_refused_and_change_nothing(
    clock: Clock, call: Callable[[Clock], object], message: str
) -> None:
    clock.bump(3.0)
    with pytest.raises(ValueError, match=message):
        call(clock)
    assert clock.offset() == 3.0
    assert not clock.is_strobing


def test_a_lease_covers_only_from_its_heartbeat_until_it_ends() -> None:
    lease = MasterLease(start=100.0, until=101.2)
    assert lease.covers(100.0)
    assert lease.covers(101.1)
    assert not lease.covers(101.2)  # ran out: the controller may elect now
    # the clock stepped back below the heartbeat that earned the lease: it proves nothing
    assert not lease.covers(99.9)
    assert not lease.covers(-188.0)
    assert not any(NO_LEASE_YET.covers(t) for t in (-1e12, 0.0, 1e12))
