"""Warm segments: zero-filled commit-log segments prepared ahead of need (`store/prepare.py`)."""

import logging
import os
from pathlib import Path

import pytest

from ferrymq.store.config import FlushDiskType
from ferrymq.store.store import Store
from ferrymq.wire.records import BatchItem, decode_record

from .conftest import BORN, OpenStore

SEGMENT = 64 * 1024


def allocated(path: Path) -> int:
    """Bytes of disk the file holds (a sparse file holds fewer than its size)."""
    return os.stat(path).st_blocks * 512


def segments(store: Store) -> list[Path]:
    return sorted(p for p in store.config.commitlog_path.iterdir())


def spare(store: Store) -> Path:
    return store.config.spare_segment_path / "spare"


def fill(store: Store, count: int, size: int = 1000) -> list[bytes]:
    bodies = [os.urandom(size) for _ in range(count)]
    for body in bodies:
        store.put("T", 0, [BatchItem.of(body, {})], born_host=BORN, born_timestamp_ms=1)
    return bodies


def stored_bodies(store: Store) -> list[bytes]:
    store.dispatch()
    result = store.get("T", 0, 0, 100_000, max_bytes=1 << 30)
    return [decode_record(r).body for r in result.records]


def test_a_new_store_starts_on_a_zero_filled_segment_and_prepares_the_next_at_half(
    open_store: OpenStore,
) -> None:
    store = open_store(
        warm_segments=True,
        commitlog_segment_bytes=SEGMENT,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
    )
    assert allocated(spare(store)) >= SEGMENT  # prepared at open, before the first append
    bodies = fill(store, 1)
    (first,) = segments(store)
    assert first.name == f"{0:020d}"
    assert allocated(first) >= SEGMENT  # the spare, renamed: no block is allocated by appends
    assert not spare(store).exists()

    bodies += fill(store, 20)  # ~23 KB: not yet half the segment
    assert store.commitlog.preparer is not None
    store.commitlog.preparer.wait()
    assert not spare(store).exists()
    bodies += fill(store, 15)  # past half: the next segment is prepared in the background
    store.commitlog.preparer.wait()
    assert allocated(spare(store)) >= SEGMENT
    assert spare(store).read_bytes() == bytes(SEGMENT)

    bodies += fill(store, 40)  # rolls into the prepared file
    first, second = segments(store)
    assert second.name == f"{SEGMENT:020d}"
    assert allocated(second) >= SEGMENT
    assert stored_bodies(store) == bodies
    store.wait_flushed(store.max_log_offset).result(timeout=10)


def test_a_roll_with_no_spare_ready_creates_a_sparse_segment(open_store: OpenStore) -> None:
    store = open_store(warm_segments=True, commitlog_segment_bytes=SEGMENT)
    bodies = fill(store, 40)
    assert store.commitlog.preparer is not None
    store.commitlog.preparer.wait()
    spare(store).unlink()  # as if the preparation were still under way at the roll
    bodies += fill(store, 40)
    _first, second = segments(store)
    assert allocated(second) < SEGMENT
    assert stored_bodies(store) == bodies


def test_a_failed_preparation_is_logged_and_the_log_goes_on(
    open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(warm_segments=True, commitlog_segment_bytes=SEGMENT)
    bodies = fill(store, 1)
    # a real error from the filesystem: the partial file's name is taken by a directory
    (store.config.spare_segment_path / "spare.partial").mkdir()
    with caplog.at_level(logging.WARNING, logger="ferrymq.store.prepare"):
        bodies += fill(store, 40)
        assert store.commitlog.preparer is not None
        store.commitlog.preparer.wait()
    assert "could not prepare a spare commit-log segment" in caplog.text
    assert "Is a directory" in caplog.text
    assert not spare(store).exists()
    bodies += fill(store, 40)
    _first, second = segments(store)
    assert allocated(second) < SEGMENT
    assert stored_bodies(store) == bodies


def test_reopen_deletes_a_partial_spare_and_one_of_another_size(
    open_store: OpenStore, tmp_path: Path
) -> None:
    store = open_store(warm_segments=True, commitlog_segment_bytes=SEGMENT)
    bodies = fill(store, 3)
    store.close()
    prepared = store.config.spare_segment_path
    (prepared / "spare.partial").write_bytes(b"\xff" * 100)
    (prepared / "spare").write_bytes(bytes(SEGMENT // 2))

    again = open_store(warm_segments=True, commitlog_segment_bytes=SEGMENT)
    assert again.recovery is not None
    assert again.recovery.cut_reason is None
    assert not (prepared / "spare.partial").exists()
    assert not (prepared / "spare").exists()  # the log is not empty: no spare until half
    assert stored_bodies(again) == bodies
    assert [p.name for p in segments(again)] == [f"{0:020d}"]


def test_crash_recovery_of_a_zero_filled_segment_finds_the_end(open_store: OpenStore) -> None:
    store = open_store(warm_segments=True, commitlog_segment_bytes=SEGMENT)
    bodies = fill(store, 20)
    store.wait_flushed(store.max_log_offset).result(timeout=10)
    store.abandon()
    again = open_store(warm_segments=True, commitlog_segment_bytes=SEGMENT)
    assert again.recovery is not None
    assert again.recovery.after_crash
    assert again.recovery.cut_reason is None
    assert again.recovery.quarantined == []
    assert stored_bodies(again) == bodies


def test_sparse_segments_without_warm_segments(open_store: OpenStore) -> None:
    store = open_store(commitlog_segment_bytes=SEGMENT)
    fill(store, 50)
    assert store.commitlog.preparer is None
    assert not store.config.spare_segment_path.exists()
    assert allocated(segments(store)[0]) < SEGMENT
