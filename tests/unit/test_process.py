"""Server process plumbing: `run_until_signal` runs the server with the tuned collector."""

import asyncio
import gc
from collections.abc import Iterator

import pytest

from ferrymq.cmd.process import GC_THRESHOLDS, run_until_signal


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("restore_gc")
def test_a_server_runs_with_the_servers_gc_thresholds() -> None:
    gc.set_threshold(700, 10, 10)
    seen: list[tuple[int, int, int]] = []

    async def main(stop: asyncio.Event) -> None:
        seen.append(gc.get_threshold())
        assert not stop.is_set()

    run_until_signal(main)
    assert seen == [GC_THRESHOLDS]
