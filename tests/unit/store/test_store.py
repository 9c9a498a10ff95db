"""The store facade: appends, reads, statuses, flush, recovery, corruption, retention."""

import dataclasses
import os
import struct
from pathlib import Path

import pytest

from ferrymq.errors import (
    CorruptRecordError,
    InvalidNameError,
    MessageTooLargeError,
    StoreClosedError,
    StoreError,
    StoreLockedError,
)
from ferrymq.store.checkpoint import Checkpoint
from ferrymq.store.config import FlushDiskType
from ferrymq.store.store import GetStatus, Store
from ferrymq.wire.records import (
    SYSFLAG_TRANSACTION_PREPARED,
    BatchItem,
    decode_record,
    tags_hash,
)

from .conftest import BORN, OpenStore


def put(store: Store, topic: str, queue_id: int, *bodies: bytes, **props: str) -> list[int]:
    items = [BatchItem.of(b, props) for b in bodies]
    return store.put(topic, queue_id, items, born_host=BORN, born_timestamp_ms=1).log_offsets


def bodies(store: Store, topic: str, queue_id: int, start: int = 0) -> list[bytes]:
    result = store.get(topic, queue_id, start, 10_000, max_bytes=1 << 30)
    return [decode_record(r).body for r in result.records]


def test_put_assigns_dense_queue_offsets_and_get_returns_stored_bytes(
    open_store: OpenStore,
) -> None:
    store = open_store()
    first = store.put(
        "T", 0, [BatchItem.of(b"a"), BatchItem.of(b"b")], born_host=BORN, born_timestamp_ms=5
    )
    second = store.put("T", 0, [BatchItem.of(b"c")], born_host=BORN, born_timestamp_ms=6)
    assert (first.first_queue_offset, second.first_queue_offset) == (0, 2)
    assert second.log_offset == first.end_log_offset
    result = store.get("T", 0, 1, 10)
    assert result.status is GetStatus.FOUND
    assert result.queue_offsets == [1, 2]
    assert result.next_queue_offset == 3
    assert [decode_record(r).body for r in result.records] == [b"b", b"c"]
    assert result.records[0] == store.read_record(first.log_offsets[1])
    record = decode_record(result.records[1])
    assert (record.queue_offset, record.log_offset, record.born_timestamp_ms) == (
        2,
        second.log_offset,
        6,
    )


def test_get_statuses_follow_rocketmq(open_store: OpenStore) -> None:
    store = open_store()
    assert store.get("T", 0, 0, 1).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    put(store, "T", 0, b"x", b"y")
    assert store.get("T", 0, 2, 1).status is GetStatus.OFFSET_OVERFLOW_ONE
    overflow = store.get("T", 0, 9, 1)
    assert (overflow.status, overflow.next_queue_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0)
    assert store.get("T", 0, -1, 1).status is GetStatus.OFFSET_TOO_SMALL
    assert (store.min_queue_offset("T", 0), store.max_queue_offset("T", 0)) == (0, 2)


def test_tag_filter_skips_entries_without_reading_them(open_store: OpenStore) -> None:
    store = open_store()
    put(store, "T", 0, b"a1", TAGS="A")
    put(store, "T", 0, b"b1", TAGS="B")
    put(store, "T", 0, b"a2", TAGS="A")
    wanted = tags_hash("A")
    result = store.get("T", 0, 0, 10, tags_codes={wanted})
    assert [decode_record(r).body for r in result.records] == [b"a1", b"a2"]
    assert result.queue_offsets == [0, 2]
    none = store.get("T", 0, 0, 10, tags_codes=frozenset())
    assert (none.status, none.next_queue_offset) == (GetStatus.NO_MATCHED_MESSAGE, 3)


def test_max_bytes_limits_a_read_but_one_record_always_comes(open_store: OpenStore) -> None:
    store = open_store()
    put(store, "T", 0, b"a" * 200, b"b" * 200, b"c" * 200)
    one = store.get("T", 0, 0, 10, max_bytes=10)
    assert (len(one.records), one.next_queue_offset) == (1, 1)
    two = store.get("T", 0, 0, 10, max_bytes=2 * len(one.records[0]))
    assert (len(two.records), two.next_queue_offset) == (2, 2)


def test_records_roll_across_segments_with_blank_records(open_store: OpenStore) -> None:
    store = open_store()
    for i in range(100):
        put(store, "T", i % 3, f"message-{i}".encode() * 5)
    assert len(store.commitlog.chain.segments) > 3
    got = sorted(b for q in range(3) for b in bodies(store, "T", q))
    assert got == sorted(f"message-{i}".encode() * 5 for i in range(100))


def test_prepared_transaction_messages_get_no_queue_entry(open_store: OpenStore) -> None:
    store = open_store()
    result = store.put(
        "T",
        0,
        [BatchItem.of(b"half")],
        born_host=BORN,
        born_timestamp_ms=1,
        sys_flag=SYSFLAG_TRANSACTION_PREPARED,
    )
    assert result.first_queue_offset == 0
    assert store.max_queue_offset("T", 0) == 0
    assert decode_record(store.read_record(result.log_offset)).body == b"half"


def test_bad_topic_names_are_refused_before_touching_disk(
    open_store: OpenStore, tmp_path: Path
) -> None:
    store = open_store()
    for bad in ["", "../etc", "a/b", ".", "..", "t" * 40000, "sp ace"]:
        with pytest.raises(InvalidNameError):
            put(store, bad, 0, b"x")
    assert sorted(p.name for p in (tmp_path / "store" / "consumequeue").glob("*")) == []
    assert store.max_log_offset == 0


def test_oversized_bodies_are_refused_and_nothing_is_written(open_store: OpenStore) -> None:
    store = open_store(max_message_bytes=100)
    with pytest.raises(MessageTooLargeError) as info:
        put(store, "T", 0, b"x" * 101)
    assert info.value.limit_bytes == 100
    with pytest.raises(MessageTooLargeError):
        put(store, "T", 0, *[b"y" * 90] * 50)  # a batch larger than a segment
    assert store.max_log_offset == 0
    put(store, "T", 0, b"fits")
    assert bodies(store, "T", 0) == [b"fits"]


def test_a_second_process_cannot_open_a_locked_store(open_store: OpenStore, tmp_path: Path) -> None:
    open_store()
    from .conftest import small_config

    with pytest.raises(StoreLockedError):
        Store.open(small_config(tmp_path / "store"))


def test_a_closed_store_refuses_use(open_store: OpenStore) -> None:
    store = open_store()
    store.close()
    with pytest.raises(StoreClosedError):
        put(store, "T", 0, b"x")


def test_sync_flush_waiters_share_fsyncs(open_store: OpenStore) -> None:
    store = open_store(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    futures = []
    for i in range(50):
        (log_offset,) = put(store, "T", 0, b"m%d" % i)
        futures.append(store.wait_flushed(log_offset + 1))
    results = [f.result(timeout=10) for f in futures]
    assert all(r >= store.max_log_offset - 200 for r in results[-1:])
    assert store.flushed_log_offset == store.max_log_offset


def test_clean_restart_restores_everything(open_store: OpenStore) -> None:
    store = open_store()
    for i in range(40):
        put(store, "T", i % 2, b"m%d" % i, KEYS=f"key{i}")
    end = store.max_log_offset
    store.close()
    reopened = open_store()
    assert reopened.recovery is not None
    assert not reopened.recovery.after_crash
    assert reopened.recovery.cut_reason is None
    assert reopened.max_log_offset == end
    assert bodies(reopened, "T", 0) == [b"m%d" % i for i in range(0, 40, 2)]
    assert [r.body for r in reopened.query_by_key("T", "key7")] == [b"m7"]
    put(reopened, "T", 0, b"after")
    assert reopened.max_queue_offset("T", 0) == 21


def test_crash_recovery_rebuilds_consume_queues_and_index(
    open_store: OpenStore, tmp_path: Path
) -> None:
    store = open_store()
    for i in range(30):
        put(store, "T", 0, b"m%d" % i, KEYS=f"k{i}")
    store.flush()
    for i in range(30, 45):
        put(store, "T", 0, b"m%d" % i, KEYS=f"k{i}")
    end = store.max_log_offset
    # the commit log reached the disk, the queue entries written after the flush did not
    store.dispatch()
    store.abandon()
    queue_dir = tmp_path / "store" / "consumequeue" / "T" / "0"
    os.truncate(queue_dir / f"{16 * 20:020d}", (30 - 16) * 20)
    os.truncate(queue_dir / f"{32 * 20:020d}", 0)
    reopened = open_store()
    assert reopened.recovery is not None
    assert reopened.recovery.after_crash
    assert reopened.max_log_offset == end
    assert bodies(reopened, "T", 0) == [b"m%d" % i for i in range(45)]
    assert [r.body for r in reopened.query_by_key("T", "k40")] == [b"m40"]


def test_unkeyed_topics_are_served_but_never_key_indexed(open_store: OpenStore) -> None:
    store = open_store(unkeyed_topics=frozenset({"Log"}))
    for i in range(5):
        put(store, "Log", 0, b"log%d" % i, KEYS="k")
        put(store, "T", 0, b"t%d" % i, KEYS="k")
    assert bodies(store, "Log", 0) == [b"log%d" % i for i in range(5)]
    assert store.query_by_key("Log", "k") == []
    assert len(store.query_by_key("T", "k")) == 5
    store.dispatch()
    store.abandon()  # a crash: the key index is rebuilt from the log, by the same rule
    reopened = open_store(unkeyed_topics=frozenset({"Log"}))
    assert reopened.query_by_key("Log", "k") == []
    assert len(reopened.query_by_key("T", "k")) == 5
    assert bodies(reopened, "Log", 0) == [b"log%d" % i for i in range(5)]


def test_a_torn_tail_is_cut_and_the_rest_served(open_store: OpenStore, tmp_path: Path) -> None:
    store = open_store()
    offsets = [put(store, "T", 0, b"m%d" % i)[0] for i in range(10)]
    store.flush()
    store.abandon()
    segment = tmp_path / "store" / "commitlog" / f"{0:020d}"
    os.truncate(segment, offsets[7] + 30)  # the last fsync was lost mid-record
    reopened = open_store()
    assert reopened.max_log_offset == offsets[7]
    assert bodies(reopened, "T", 0) == [b"m%d" % i for i in range(7)]
    put(reopened, "T", 0, b"new")
    assert bodies(reopened, "T", 0, 7) == [b"new"]


def test_a_bit_flip_mid_segment_is_cut_reported_and_quarantined(
    open_store: OpenStore, tmp_path: Path
) -> None:
    store = open_store()
    offsets = [put(store, "T", 0, b"payload-%d" % i)[0] for i in range(12)]
    store.close()
    segment = tmp_path / "store" / "commitlog" / f"{0:020d}"
    raw = bytearray(segment.read_bytes())
    flip_at = raw.index(b"payload-5")
    raw[flip_at] ^= 0x10
    segment.write_bytes(raw)
    reopened = open_store()
    report = reopened.recovery
    assert report is not None
    assert report.end_log_offset == offsets[5]
    assert report.cut_reason is not None
    assert "CRC" in report.cut_reason
    assert [p.name for p in report.quarantined] == [f"{0:020d}.from-{offsets[5]:020d}"]
    assert report.quarantined[0].read_bytes()[:200] == bytes(raw[offsets[5] : offsets[5] + 200])
    assert bodies(reopened, "T", 0) == [b"payload-%d" % i for i in range(5)]


def test_a_stored_record_whose_properties_are_not_utf8_is_served_and_indexing_goes_on(
    open_store: OpenStore,
) -> None:
    """Sends refuse such properties now; a record stored before that must not stop indexing."""
    store = open_store()
    store.put("T", 0, [BatchItem(b"odd", b"KEYS\x01\xff\x02")], born_host=BORN, born_timestamp_ms=1)
    put(store, "T", 0, b"next", KEYS="k")

    def served() -> list[bytes]:
        records = store.get("T", 0, 0, 10).records
        assert len(records) == 2
        assert b"odd" in records[0]  # served as stored (a consumer's decode refuses it)
        return [decode_record(records[1]).body]

    assert served() == [b"next"]
    assert store.dispatch_error is None
    assert [r.body for r in store.query_by_key("T", "k", max_count=5)] == [b"next"]
    store.close()
    store = open_store()  # recovery keeps it: its CRCs hold
    assert served() == [b"next"]


def test_a_corrupt_record_is_never_served(open_store: OpenStore, tmp_path: Path) -> None:
    store = open_store()
    for i in range(60):
        put(store, "T", 0, b"payload-%03d" % i)
    assert len(store.commitlog.chain.segments) >= 2
    first = tmp_path / "store" / "commitlog" / f"{0:020d}"
    with first.open("r+b") as f:  # bit rot in an old, already verified segment
        raw = f.read()
        at = raw.index(b"payload-002")
        f.seek(at)
        f.write(b"X")
    with pytest.raises(CorruptRecordError, match="CRC"):
        store.get("T", 0, 0, 10)
    assert decode_record(store.get("T", 0, 3, 1).records[0]).body == b"payload-003"


def test_an_invalid_checkpoint_means_checking_the_whole_log(
    open_store: OpenStore, tmp_path: Path
) -> None:
    store = open_store()
    for i in range(80):
        put(store, "T", 0, b"m%d" % i)
    store.close()
    (tmp_path / "store" / "checkpoint").write_bytes(b"garbage")
    reopened = open_store()
    assert reopened.recovery is not None
    assert reopened.recovery.scan_from_log_offset == 0
    assert reopened.recovery.records_checked == 80


def test_checkpoint_round_trips_and_rejects_damage() -> None:
    checkpoint = Checkpoint(1, 2, 3, 4, 5, 6)
    data = checkpoint.encode()
    assert len(data) == 4096
    assert Checkpoint.decode(data) == checkpoint
    assert struct.unpack_from(">q", data, 32)[0] == 5  # confirmPhyOffset at RocketMQ's position
    damaged = bytearray(data)
    damaged[3] ^= 1
    assert Checkpoint.decode(bytes(damaged)) is None


def test_search_by_time_and_earliest_store_time(open_store: OpenStore) -> None:
    now = [1_000_000]
    store = open_store()
    store._clock_ms = lambda: now[0]
    for i in range(10):
        now[0] = 1_000_000 + i * 1000
        put(store, "T", 0, b"m%d" % i)
    assert store.search_queue_offset("T", 0, 1_004_500) == 5
    assert store.search_queue_offset("T", 0, 0) == 0
    assert store.search_queue_offset("T", 0, 9_999_999) == 10
    assert store.earliest_store_time("T", 0) == 1_000_000


def test_query_by_key_and_unique_key_within_time_range(open_store: OpenStore) -> None:
    store = open_store()
    now = [5_000_000]
    store._clock_ms = lambda: now[0]
    for i in range(50):  # more keys than one index file holds
        now[0] += 1000
        put(store, "T", 0, b"m%d" % i, KEYS=f"order-{i % 5} extra", UNIQ_KEY=f"U{i}")
    put(store, "Other", 0, b"other", KEYS="order-1")
    store.dispatch()
    assert len(store.index.files) > 2
    found = store.query_by_key("T", "order-1", max_count=100)
    assert [r.body for r in found] == [b"m%d" % i for i in range(46, -1, -5)]
    assert [r.body for r in store.query_by_key("T", "U33")] == [b"m33"]
    in_range = store.query_by_key("T", "order-1", begin_ms=5_010_000, end_ms=5_020_000)
    assert [r.body for r in in_range] == [b"m16", b"m11"]
    assert store.query_by_key("T", "nope") == []


def test_retention_deletes_old_segments_and_moves_queue_minimums(open_store: OpenStore) -> None:
    store = open_store(file_reserved_hours=1.0)
    for i in range(120):
        put(store, "T", 0, b"m%03d" % i, KEYS=f"k{i}")
    store.flush()
    segments = len(store.commitlog.chain.segments)
    assert store.delete_expired(now_ms=store._clock_ms()) == 0
    deleted = store.delete_expired(now_ms=store._clock_ms() + 2 * 3_600_000)
    assert deleted == segments - 1
    low = store.min_queue_offset("T", 0)
    assert low > 0
    assert store.get("T", 0, 0, 1).status is GetStatus.OFFSET_TOO_SMALL
    assert bodies(store, "T", 0, low) == [b"m%03d" % i for i in range(low, 120)]


def test_replica_bytes_are_indexed_by_the_same_path(open_store: OpenStore, tmp_path: Path) -> None:
    master = open_store()
    for i in range(30):
        put(master, "T", i % 2, b"m%d" % i, KEYS=f"k{i}")
    data = master.commitlog.read(0, 1 << 20)
    slave = Store.open(dataclasses.replace(master.config, root_dir=tmp_path / "slave"))
    try:
        position = 0
        while position < master.max_log_offset:
            chunk = master.commitlog.read(position, 700)
            position = slave.append_replica(position, chunk) if chunk else position
        assert slave.max_log_offset == master.max_log_offset
        assert slave.commitlog.read(0, 1 << 20) == data
        assert bodies(slave, "T", 1) == bodies(master, "T", 1)
        assert [r.body for r in slave.query_by_key("T", "k9")] == [b"m9"]
        cut = decode_record(master.get("T", 0, 5, 1).records[0]).log_offset
        slave.truncate(cut)
        assert slave.max_log_offset == cut
        assert slave.max_queue_offset("T", 0) == 5
        assert slave.query_by_key("T", "k29") == []
    finally:
        slave.close()


def test_replica_bytes_with_a_corrupt_record_are_refused_whole(
    open_store: OpenStore, tmp_path: Path
) -> None:
    master = open_store()
    for i in range(4):
        put(master, "T", 0, b"record-%d" % i)
    data = bytearray(master.commitlog.read(0, 1 << 20))
    slave = Store.open(dataclasses.replace(master.config, root_dir=tmp_path / "slave"))
    try:
        assert slave.append_replica(0, bytes(data[:40])) == 0  # only part of the first record
        data[data.index(b"record-2")] ^= 0xFF  # its body CRC no longer holds
        with pytest.raises(CorruptRecordError):
            slave.append_replica(0, bytes(data))
        assert slave.max_log_offset == 0  # nothing of it kept, not even the records before
        assert slave.commitlog.read(0, 1 << 20) == b""
    finally:
        slave.close()


def test_flusher_and_appends_run_concurrently_without_losing_data(open_store: OpenStore) -> None:
    store = open_store(flush_interval=0.001, checkpoint_interval=0.002)
    for i in range(500):
        put(store, "T", i % 4, b"m%d" % i)
    store.close()
    reopened = open_store()
    assert sum(reopened.max_queue_offset("T", q) for q in range(4)) == 500


def test_restart_log_at_refuses_an_offset_off_a_segment_boundary_or_before_the_end(
    open_store: OpenStore,
) -> None:
    store = open_store()
    put(store, "T", 0, b"a" * 3000)
    put(store, "T", 0, b"b" * 3000)  # 4 KiB segments: the second record rolled to the second
    end = store.max_log_offset
    with pytest.raises(StoreError, match="not a multiple of this store's segment size 4096"):
        store.restart_log_at(3 * 4096 + 1)
    with pytest.raises(StoreError, match="before its end"):
        store.restart_log_at(4096)
    assert store.max_log_offset == end
    assert bodies(store, "T", 0) == [b"a" * 3000, b"b" * 3000]
    store.restart_log_at(4 * 4096)
    assert (store.min_log_offset, store.max_log_offset) == (4 * 4096, 4 * 4096)
    assert store.get("T", 0, 0, 10).records == []
