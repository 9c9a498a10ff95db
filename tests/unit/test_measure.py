"""Benchmark bookkeeping: a row measured in interleaved slices sums exactly those slices, and
the systems take turns."""

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

import pytest

from ferrymq.cmd.measure import Side, Tally, interleaved_sends


def test_a_tally_sums_its_slices_and_skips_what_happens_between_them() -> None:
    tally = Tally([os.getpid()])
    tally.begin()
    time.sleep(0.02)
    tally.end(3, [0.001, 0.002, 0.003])
    time.sleep(0.5)  # another system's slice: not counted
    tally.begin()
    time.sleep(0.03)
    tally.end(4, [0.004, 0.005, 0.006, 0.007])
    row = tally.row("ferrymq", "sync", 100)
    assert row.messages == 7
    assert 0.05 <= row.seconds < 0.45
    assert row.msgs_per_s == pytest.approx(7 / row.seconds)
    assert row.mb_per_s == pytest.approx(7 * 100 / row.seconds / 1e6)
    assert row.p50_ms == pytest.approx(4.0)
    assert row.p99_ms == pytest.approx(7.0)
    assert (row.system, row.mode, row.size) == ("ferrymq", "sync", 100)


def test_ending_a_slice_that_never_began_is_an_error() -> None:
    tally = Tally([])
    with pytest.raises(RuntimeError, match="without begin"):
        tally.end(1, [])
    tally.begin()
    tally.end(1, [])
    with pytest.raises(RuntimeError, match="without begin"):
        tally.end(1, [])


async def test_interleaved_sends_rotate_the_first_side_and_row_every_side_and_mode() -> None:
    calls: list[tuple[str, int]] = []

    def side(name: str) -> Side:
        def sender(size: int) -> Callable[[], Awaitable[object]]:
            async def send() -> None:
                calls.append((name, size))
                await asyncio.sleep(0.001)

            return send

        return Side(name, [], sender)

    sides = [side("a"), side("b"), side("c")]
    rows = await interleaved_sends(sides, 64, seconds=0.09, rounds=3, window=4)
    assert [(r.system, r.mode) for r in rows] == [
        (name, mode) for name in "abc" for mode in ("sync", "window 4")
    ]
    assert all(r.size == 64 and r.messages > 0 for r in rows)
    assert {size for _, size in calls} == {64}
    # the runs of one side's sends, in order: per round, the sync slices then the windowed ones,
    # each round starting one side further on
    runs = [name for i, (name, _) in enumerate(calls) if i == 0 or calls[i - 1][0] != name]
    assert runs == list("abcabc" + "bcabca" + "cabcab")
    per_side = {name: sum(1 for n, _ in calls if n == name) for name in "abc"}
    assert per_side == {name: sum(r.messages for r in rows if r.system == name) for name in "abc"}
