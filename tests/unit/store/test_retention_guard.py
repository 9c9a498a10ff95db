"""Retention's guard and plan (issue 18): `keep_log_offset`, `expired_log_offset`,
`log_offset_of`, and the runtime retention settings a broker passes."""

from ferrymq.store.store import Store
from ferrymq.wire.records import BatchItem

from .conftest import BORN, OpenStore


def _put(store: Store, topic: str, count: int) -> list[int]:
    """`count` records of ~200 bytes; their log offsets."""
    return [
        store.put(
            topic, 0, [BatchItem.of(b"x" * 150)], born_host=BORN, born_timestamp_ms=1
        ).log_offsets[0]
        for _ in range(count)
    ]


def test_no_segment_holding_the_kept_offset_or_after_it_is_deleted(open_store: OpenStore) -> None:
    store = open_store()
    offsets = _put(store, "T", 100)  # ~5 segments of 4 KiB
    store.flush()
    segments = [s.start_offset for s in store.commitlog.chain.segments]
    assert len(segments) >= 4
    kept = offsets[60]
    store.keep_log_offset = lambda: kept
    plan = store.expired_log_offset(force=False, reserved_hours=0)
    assert plan == segments[-1]  # every segment but the one being written
    deleted = 0
    for _ in range(len(segments)):
        deleted += store.delete_expired(force=True)
    holding = max(s for s in segments if s <= kept)
    assert store.min_log_offset == holding
    assert deleted == segments.index(holding)
    assert store.delete_expired(reserved_hours=0) == 0  # expired or not: kept
    store.keep_log_offset = lambda: None
    left = len(store.commitlog.chain.segments)
    assert store.delete_expired(reserved_hours=0) == left - 1


def test_the_plan_and_the_deletion_follow_the_retention_given(open_store: OpenStore) -> None:
    store = open_store(file_reserved_hours=72.0)
    _put(store, "T", 60)
    store.flush()
    now_ms = store._clock_ms()
    assert store.expired_log_offset(now_ms=now_ms) == store.min_log_offset == 0
    assert store.expired_log_offset(force=True) == store.commitlog.chain.segments[1].start_offset
    assert store.delete_expired(now_ms=now_ms) == 0
    assert store.delete_expired(now_ms=now_ms, reserved_hours=0) >= 2


def test_log_offsets_of_visible_and_held_records(open_store: OpenStore) -> None:
    store = open_store(confirm_gated=True)
    offsets = _put(store, "T", 3)
    store.set_confirm_offset(offsets[1])  # the first record is committed, the others held
    assert [store.log_offset_of("T", 0, q) for q in range(4)] == [*offsets, None]
    assert store.log_offset_of("Other", 0, 0) is None
    assert store.max_queue_offset("T", 0) == 1
