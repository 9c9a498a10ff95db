"""Store parts on their own: the flusher's failure path, segment chains, consume-queue fillers."""

import errno
import os
import threading
from pathlib import Path

import pytest

from ferrymq.errors import StoreError
from ferrymq.store.consumequeue import BLANK_ENTRY_SIZE, ConsumeQueue, pack_entries
from ferrymq.store.flush import Flusher
from ferrymq.store.segment import SegmentChain, segment_name


def test_an_fsync_error_fails_that_cycles_waiters_and_the_flusher_keeps_going() -> None:
    # EIO from fsync cannot be caused on this machine's disk, so the sync step is injected.
    written = [100]
    failures = [1]
    synced = threading.Event()

    def sync_log() -> int:
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.EIO, "Input/output error")
        synced.set()
        return written[0]

    flusher = Flusher(
        sync_log=sync_log,
        sync_metadata=lambda flushed: None,
        flush_interval=3600.0,
        metadata_interval=3600.0,
        flushed_log_offset=0,
    )
    flusher.start()
    try:
        with pytest.raises(StoreError, match="flush failed"):
            flusher.wait_flushed(50).result(timeout=5)
        assert flusher.wait_flushed(80).result(timeout=5) == 100
        assert synced.is_set()
        assert flusher.wait_flushed(10).result(timeout=0) == 100  # already flushed: immediate
    finally:
        flusher.close()


def test_waiters_left_at_close_fail_rather_than_hang() -> None:
    flusher = Flusher(
        sync_log=lambda: 0,
        sync_metadata=lambda flushed: None,
        flush_interval=3600.0,
        metadata_interval=3600.0,
        flushed_log_offset=0,
    )
    flusher.start()
    flusher.close()
    with pytest.raises(StoreError, match="closing"):
        flusher.wait_flushed(1).result(timeout=1)


def test_segment_chains_must_be_contiguous(tmp_path: Path) -> None:
    for start in (0, 4096 * 2):
        (tmp_path / segment_name(start)).write_bytes(bytes(4096))
    with pytest.raises(StoreError, match="does not follow"):
        SegmentChain(tmp_path, 4096).load()


def test_a_segment_larger_than_configured_is_refused(tmp_path: Path) -> None:
    (tmp_path / segment_name(0)).write_bytes(bytes(8192))
    with pytest.raises(StoreError, match="more than the configured segment size"):
        SegmentChain(tmp_path, 4096).load()


def test_truncation_zeroes_the_cut_bytes_durably(tmp_path: Path) -> None:
    chain = SegmentChain(tmp_path, 4096)
    segment = chain.create(0)
    segment.write(0, b"x" * 1000)
    chain.create(4096).write(0, b"y" * 10)
    chain.truncate(600)
    assert [s.start_offset for s in chain.segments] == [0]
    assert (tmp_path / segment_name(0)).read_bytes()[598:1002] == b"xx" + bytes(402)
    assert not (tmp_path / segment_name(4096)).exists()
    chain.close()


def test_a_queue_created_mid_stream_starts_with_fillers(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path / "q", "T", 0, entries_per_segment=8)
    queue.put(11, pack_entries([(500, 50, 7), (550, 60, 8)]))
    assert (queue.min_queue_offset, queue.max_queue_offset) == (11, 13)
    entries = queue.entries(8, 10)
    assert [e.size for e in entries] == [BLANK_ENTRY_SIZE] * 3 + [50, 60]
    assert [e.is_message for e in entries] == [False, False, False, True, True]
    queue.close()
    reopened = ConsumeQueue(tmp_path / "q", "T", 0, entries_per_segment=8)
    reopened.load()
    assert (reopened.min_queue_offset, reopened.max_queue_offset) == (11, 13)
    assert [p.name for p in sorted((tmp_path / "q").iterdir())] == [segment_name(160)]
    reopened.close()


def test_recovery_truncation_walks_past_torn_entries(tmp_path: Path) -> None:
    queue = ConsumeQueue(tmp_path / "q", "T", 0, entries_per_segment=4)
    queue.put(0, pack_entries([(i * 100, 100, 0) for i in range(10)]))
    queue.close()
    torn = tmp_path / "q" / segment_name(80)  # entries 4..7
    os.truncate(torn, 30)  # entry 5 half written, 6 and 7 lost; 8 and 9 survived
    reopened = ConsumeQueue(tmp_path / "q", "T", 0, entries_per_segment=4)
    reopened.load()
    assert reopened.max_queue_offset == 10
    reopened.truncate_log(400, lambda entry: entry.log_offset == entry.queue_offset * 100)
    assert reopened.max_queue_offset == 4
    reopened.close()
