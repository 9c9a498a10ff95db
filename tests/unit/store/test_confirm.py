"""The confirm offset (replication high watermark) and crash-safe truncation in the store."""

from pathlib import Path

from ferrymq.store.store import GetStatus, Store
from ferrymq.wire.records import BatchItem, decode_record

from .conftest import BORN, OpenStore


def _put(store: Store, *bodies: bytes) -> list[int]:
    items = [BatchItem.of(b) for b in bodies]
    result = store.put("T", 0, items, born_host=BORN, born_timestamp_ms=1)
    return [*result.log_offsets, result.end_log_offset]


def _bodies(store: Store) -> list[bytes]:
    result = store.get("T", 0, 0, 100)
    return [decode_record(r).body for r in result.records]


def test_a_gated_store_serves_only_what_the_confirm_offset_covers(open_store: OpenStore) -> None:
    store = open_store(confirm_gated=True)
    offsets = _put(store, b"a", b"b", b"c")
    assert _bodies(store) == []
    assert store.max_queue_offset("T", 0) == 0
    assert store.get("T", 0, 0, 10).status is GetStatus.NO_MESSAGE_IN_QUEUE
    store.set_confirm_offset(offsets[2])  # the end of b
    assert _bodies(store) == [b"a", b"b"]
    assert store.confirm_offset == offsets[2]
    store.set_confirm_offset(10**12)  # a master's watermark above what this replica holds
    assert store.confirm_offset == offsets[3]
    assert _bodies(store) == [b"a", b"b", b"c"]


def test_an_ungated_store_serves_everything_and_confirms_its_end(open_store: OpenStore) -> None:
    store = open_store()
    offsets = _put(store, b"a", b"b")
    assert _bodies(store) == [b"a", b"b"]
    assert store.confirm_offset == offsets[-1]


def test_the_confirm_offset_survives_a_restart_and_a_crash(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = open_store(confirm_gated=True)
    offsets = _put(store, b"a", b"b", b"c")
    store.set_confirm_offset(offsets[1])
    store.close()
    reopened = open_store(confirm_gated=True)
    assert reopened.confirm_offset == offsets[1]
    assert _bodies(reopened) == [b"a"]
    reopened.flush()
    reopened.abandon()  # a crash: the held records are recovered and still held
    crashed = open_store(confirm_gated=True)
    assert crashed.max_log_offset == offsets[3]
    assert _bodies(crashed) == [b"a"]
    crashed.set_confirm_offset(None)
    assert _bodies(crashed) == [b"a", b"b", b"c"]


def test_truncation_lowers_the_watermark_and_drops_held_records(open_store: OpenStore) -> None:
    store = open_store(confirm_gated=True)
    offsets = _put(store, b"a", b"b", b"c")
    store.set_confirm_offset(offsets[2])
    store.truncate(offsets[1])
    assert store.confirm_offset == offsets[1]
    assert store.max_log_offset == offsets[1]
    assert _bodies(store) == [b"a"]
    store.set_confirm_offset(None)
    assert _bodies(store) == [b"a"]


def test_an_open_finishes_a_truncation_a_crash_cut_short(
    tmp_path: Path, open_store: OpenStore
) -> None:
    store = open_store()
    offsets = _put(store, b"a", b"b", b"c")
    store.flush()
    store.abandon()
    # the crash came after the intent was written and before any byte was cut
    (tmp_path / "store" / "truncating").write_text(str(offsets[1]))
    reopened = open_store()
    assert reopened.max_log_offset == offsets[1]
    assert _bodies(reopened) == [b"a"]
    assert not (tmp_path / "store" / "truncating").exists()
    assert reopened.read_record(offsets[0])  # what stays is intact


def test_held_records_keep_their_queue_offsets_after_a_restart_and_a_truncation(
    open_store: OpenStore,
) -> None:
    store = open_store(confirm_gated=True)
    offsets = _put(store, b"a", b"b", b"c")
    store.set_confirm_offset(offsets[1])
    store.close()
    # a replica reopened with b and c above its watermark, then promoted: the next put must
    # take queue offset 3, not 1 (which b still owns)
    promoted = open_store(confirm_gated=True)
    _put(promoted, b"d")
    promoted.set_confirm_offset(None)
    assert _bodies(promoted) == [b"a", b"b", b"c", b"d"]
    # cut back to the end of a: the offsets b, c and d owned are free again
    promoted.truncate(offsets[1])
    _put(promoted, b"e")
    assert _bodies(promoted) == [b"a", b"e"]
