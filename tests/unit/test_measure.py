"""Benchmark bookkeeping: a row measured in interleaved slices sums exactly those slices."""

import os
import time

import pytest

from ferrymq.cmd.measure import Tally


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
