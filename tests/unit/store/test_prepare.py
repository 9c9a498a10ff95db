"""Commit-log segments allocated or zero-filled ahead of need (`store/prepare.py`)."""

import logging
import os
from pathlib import Path

import pytest

from ferrymq.store.config import FlushDiskType, SegmentFill
from ferrymq.store.prepare import SegmentPreparer
from ferrymq.store.store import Store
from ferrymq.wire.records import BatchItem, decode_record

from .conftest import BORN, OpenStore

SEGMENT = 64 * 1024
PREPARED = pytest.mark.parametrize("segment_fill", [SegmentFill.ZEROED, SegmentFill.ALLOCATED])


def allocated(path: Path) -> int:
    """Bytes of disk the file holds (a sparse file holds fewer than its size)."""
    return os.stat(path).st_blocks * 512


def segments(store: Store) -> list[Path]:
    return sorted(p for p in store.config.commitlog_path.iterdir())


def spare(store: Store) -> Path:
    return store.config.spare_segment_path / f"spare-{store.config.segment_fill.value}"


def fill(store: Store, count: int, size: int = 1000) -> list[bytes]:
    bodies = [os.urandom(size) for _ in range(count)]
    for body in bodies:
        store.put("T", 0, [BatchItem.of(body, {})], born_host=BORN, born_timestamp_ms=1)
    return bodies


def stored_bodies(store: Store) -> list[bytes]:
    store.dispatch()
    result = store.get("T", 0, 0, 100_000, max_bytes=1 << 30)
    return [decode_record(r).body for r in result.records]


@PREPARED
def test_a_new_store_starts_on_a_prepared_segment_and_prepares_the_next_at_half(
    open_store: OpenStore, segment_fill: SegmentFill
) -> None:
    store = open_store(
        segment_fill=segment_fill,
        commitlog_segment_bytes=SEGMENT,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
    )
    assert allocated(spare(store)) >= SEGMENT  # prepared at open, before the first append
    bodies = fill(store, 1)
    (first,) = segments(store)
    assert first.name == f"{0:020d}"
    assert allocated(first) >= SEGMENT  # the spare, renamed: appends allocate no block
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
    store = open_store(segment_fill=SegmentFill.ALLOCATED, commitlog_segment_bytes=SEGMENT)
    bodies = fill(store, 40)
    assert store.commitlog.preparer is not None
    store.commitlog.preparer.wait()
    spare(store).unlink()  # as if the preparation were still under way at the roll
    bodies += fill(store, 40)
    _first, second = segments(store)
    assert allocated(second) < SEGMENT
    assert stored_bodies(store) == bodies


@PREPARED
def test_a_failed_preparation_is_logged_and_the_log_goes_on(
    open_store: OpenStore, caplog: pytest.LogCaptureFixture, segment_fill: SegmentFill
) -> None:
    store = open_store(segment_fill=segment_fill, commitlog_segment_bytes=SEGMENT)
    bodies = fill(store, 1)
    # a real error from the filesystem: the partial file's name is taken by a directory
    spare(store).with_name(f"{spare(store).name}.partial").mkdir()
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


def test_reopen_deletes_a_partial_spare_one_of_another_size_and_one_of_another_fill(
    open_store: OpenStore,
) -> None:
    store = open_store(segment_fill=SegmentFill.ZEROED, commitlog_segment_bytes=SEGMENT)
    bodies = fill(store, 3)
    store.close()
    prepared = store.config.spare_segment_path
    (prepared / "spare-zeroed.partial").write_bytes(b"\xff" * 100)
    (prepared / "spare-zeroed").write_bytes(bytes(SEGMENT // 2))

    again = open_store(segment_fill=SegmentFill.ZEROED, commitlog_segment_bytes=SEGMENT)
    assert again.recovery is not None
    assert again.recovery.cut_reason is None
    assert not (prepared / "spare-zeroed.partial").exists()
    assert not (prepared / "spare-zeroed").exists()  # the log is not empty: no spare until half
    assert stored_bodies(again) == bodies
    assert [p.name for p in segments(again)] == [f"{0:020d}"]
    again.close()

    # a spare allocated but never written must not pass for a zero-filled one, nor the reverse
    (prepared / "spare-allocated").write_bytes(bytes(SEGMENT))
    third = open_store(segment_fill=SegmentFill.ZEROED, commitlog_segment_bytes=SEGMENT)
    assert sorted(p.name for p in prepared.iterdir()) == []
    assert stored_bodies(third) == bodies


@PREPARED
def test_crash_recovery_of_a_prepared_segment_finds_the_end(
    open_store: OpenStore, segment_fill: SegmentFill
) -> None:
    store = open_store(segment_fill=segment_fill, commitlog_segment_bytes=SEGMENT)
    bodies = fill(store, 20)
    store.wait_flushed(store.max_log_offset).result(timeout=10)
    store.abandon()
    again = open_store(segment_fill=segment_fill, commitlog_segment_bytes=SEGMENT)
    assert again.recovery is not None
    assert again.recovery.after_crash
    assert again.recovery.cut_reason is None
    assert again.recovery.quarantined == []
    assert stored_bodies(again) == bodies


def test_sparse_segments_by_default(open_store: OpenStore) -> None:
    store = open_store(commitlog_segment_bytes=SEGMENT)
    fill(store, 50)
    assert store.config.segment_fill is SegmentFill.SPARSE
    assert store.commitlog.preparer is None
    assert not store.config.spare_segment_path.exists()
    assert allocated(segments(store)[0]) < SEGMENT


def test_a_preparer_for_sparse_segments_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sparse segments need no preparer"):
        SegmentPreparer(tmp_path, SEGMENT, SegmentFill.SPARSE)
