"""The loop poller: its window follows the gaps between reads, and while it polls the loop runs
(yielding each round) instead of sleeping."""

import asyncio
import time

import pytest

from ferrymq.rpc import busypoll
from ferrymq.rpc.busypoll import BusyPoll


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _polling(poll: BusyPoll) -> bool:
    """`poll.polling`, read anew (an assert on the property would narrow it for mypy)."""
    return poll.polling


def _read_after(poll: BusyPoll, clock: Clock, gap_us: float) -> None:
    """A read `gap_us` after the last one was done (its handling takes no time)."""
    clock.now += gap_us / 1e6
    poll.read_started()
    poll.read_done()


async def test_the_window_grows_to_twice_a_gap_it_missed_and_halves_after_a_long_one() -> None:
    clock = Clock()
    poll = BusyPoll(300e-6, clock=clock)
    _read_after(poll, clock, 0)  # the first read: nothing to go by
    assert poll.window == 0
    _read_after(poll, clock, 100)  # missed by 100 us: polling 200 us would have met it
    assert poll.window == pytest.approx(200e-6)
    _read_after(poll, clock, 50)  # met: no change
    assert poll.window == pytest.approx(200e-6)
    _read_after(poll, clock, 250)  # missed, within the bound: grows, capped at it
    assert poll.window == pytest.approx(300e-6)
    _read_after(poll, clock, 1000)  # sparse traffic: halves each time...
    assert poll.window == pytest.approx(150e-6)
    for _ in range(7):
        _read_after(poll, clock, 5000)
    assert poll.window == pytest.approx(150e-6 / 2**7)
    for _ in range(3):
        _read_after(poll, clock, 5000)
    assert poll.window == 0  # ...and below a microsecond it stops
    await asyncio.sleep(0)


async def test_off_with_a_zero_bound_and_a_negative_one_is_refused() -> None:
    clock = Clock()
    poll = BusyPoll(0, clock=clock)
    for _ in range(5):
        _read_after(poll, clock, 10)
        assert not poll.polling
    assert poll.window == 0
    with pytest.raises(ValueError, match=">= 0"):
        BusyPoll(-1e-6)


async def test_while_polling_the_loop_keeps_running_and_yields_each_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rounds: list[float] = []
    monkeypatch.setattr(busypoll, "_yield", lambda: rounds.append(time.perf_counter()))
    poll = BusyPoll(0.05)
    poll.window = 0.02
    poll.read_done()
    assert _polling(poll)
    started = time.perf_counter()
    while _polling(poll):
        await asyncio.sleep(0)
        assert time.perf_counter() - started < 5
    assert len(rounds) > 10  # scheduled round after round, not once
    assert rounds[-1] - rounds[0] >= 0.019  # for the whole window, then it stops
    count = len(rounds)
    await asyncio.sleep(0.01)
    assert len(rounds) == count


async def test_a_read_while_polling_starts_the_window_again_from_its_end() -> None:
    poll = BusyPoll(1.0)
    poll.window = 0.4
    poll.read_done()
    await asyncio.sleep(0.1)
    assert poll.polling
    poll.read_started()  # met by polling: the window stays, and counts again from read_done
    assert poll.window == pytest.approx(0.4)
    await asyncio.sleep(0.1)
    poll.read_done()
    await asyncio.sleep(0.3)  # 0.5 s after the first read_done, 0.3 s after the second
    assert poll.polling
    started = time.perf_counter()
    while poll.polling:
        await asyncio.sleep(0.01)
        assert time.perf_counter() - started < 5
