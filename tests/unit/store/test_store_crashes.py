"""Stateful test of the store against a model, with crashes at any byte.

A crash stops the store without flushing (`Store.abandon`) and then cuts the files to what a power
loss may leave: the commit log keeps every fsynced byte and an arbitrary prefix of the rest,
followed by garbage or zeros; consume-queue files keep what the checkpoint covers and an
arbitrary prefix of the rest; the newest index file may have holes. After recovery the store must
hold exactly the records that ended before the cut (every fsynced one among them), in dense queue
order, serve no corrupt byte, and find each surviving message by key.
"""

import os
import shutil
import struct
import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ferrymq.store.checkpoint import Checkpoint
from ferrymq.store.config import SegmentFill
from ferrymq.store.store import Store
from ferrymq.wire.records import BatchItem, decode_record

from .conftest import BORN, small_config

QUEUES = 3


class StoreWithCrashes(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="ferrymq-crash-"))
        self.config = small_config(self.root, commitlog_segment_bytes=2048, consume_queue_entries=8)
        self.store = Store.open(self.config)
        # per queue: (key, body, log_offset, end_log_offset) in queue order
        self.model: list[list[tuple[str, bytes, int, int]]] = [[] for _ in range(QUEUES)]
        self.durable = 0
        self.counter = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(
        queue_id=st.integers(0, QUEUES - 1),
        bodies=st.lists(st.binary(max_size=120), min_size=1, max_size=4),
    )
    def put(self, queue_id: int, bodies: list[bytes]) -> None:
        items = []
        keys = []
        for body in bodies:
            self.counter += 1
            keys.append(f"k{self.counter}")
            items.append(BatchItem.of(body, {"KEYS": keys[-1], "TAGS": "t"}))
        result = self.store.put("Topic", queue_id, items, born_host=BORN, born_timestamp_ms=1)
        for key, body, log_offset, size in zip(
            keys, bodies, result.log_offsets, result.sizes, strict=True
        ):
            self.model[queue_id].append((key, body, log_offset, log_offset + size))

    @rule()
    def fsync_commit_log(self) -> None:
        end = self.store.max_log_offset
        self.durable = self.store.wait_flushed(end).result(timeout=10)
        assert self.durable >= end

    @rule()
    def flush_everything(self) -> None:
        self.store.flush()
        self.durable = self.store.flushed_log_offset

    @rule()
    def clean_restart(self) -> None:
        self.store.close()
        self.store = Store.open(self.config)
        assert self.store.recovery is not None
        assert self.store.recovery.cut_reason is None
        self.durable = self.store.max_log_offset

    @precondition(lambda self: any(self.model))
    @rule(data=st.data())
    def truncate_like_a_slave(self, data: st.DataObject) -> None:
        starts = sorted(m[2] for q in self.model for m in q)
        cut = data.draw(st.sampled_from(starts))
        self.store.truncate(cut)
        self.model = [[m for m in q if m[2] < cut] for q in self.model]
        self.durable = min(self.durable, cut)

    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        written = self.store.max_log_offset
        self.store.abandon()
        checkpoint = Checkpoint.load(self.root / "checkpoint")
        safe = checkpoint.safe_log_offset if checkpoint else 0
        cut = data.draw(st.integers(self.durable, written), label="cut")
        garbage = data.draw(st.lists(st.integers(1, 255), max_size=40), label="garbage")
        self._cut_commit_log(cut, garbage)
        self._lose_queue_tails(safe, data)
        self._damage_newest_index(safe, data)
        self._leave_half_a_spare(data)
        self.model = [[m for m in q if m[3] <= cut] for q in self.model]
        self.store = Store.open(self.config)
        self.durable = self.store.max_log_offset

    def _cut_commit_log(self, cut: int, garbage: list[int]) -> None:
        """Keep the bytes before `cut`; after it, bytes that differ from what was written."""
        segment_bytes = self.config.commitlog_segment_bytes
        directory = self.root / "commitlog"
        for path in sorted(directory.iterdir()) if directory.exists() else []:
            start = int(path.name)
            if start + segment_bytes <= cut:
                continue
            if start > cut:
                path.unlink()
                continue
            with path.open("r+b") as f:
                f.seek(cut - start)
                written = f.read(len(garbage))
                f.truncate(cut - start)
                f.seek(cut - start)
                changed = bytes(
                    (written[i] if i < len(written) else 0) ^ g for i, g in enumerate(garbage)
                )
                f.write(changed[: segment_bytes - (cut - start)])

    def _lose_queue_tails(self, safe: int, data: st.DataObject) -> None:
        for queue_id in range(QUEUES):
            directory = self.root / "consumequeue" / "Topic" / str(queue_id)
            if not directory.exists():
                continue
            keep_entries = sum(1 for m in self.model[queue_id] if m[3] <= safe)
            for path in sorted(directory.iterdir()):
                start = int(path.name)
                floor = max(0, keep_entries * 20 - start)
                size = path.stat().st_size
                if floor < size:
                    os.truncate(path, data.draw(st.integers(floor, size), label="cq cut"))

    def _damage_newest_index(self, safe: int, data: st.DataObject) -> None:
        directory = self.root / "index"
        files = sorted(directory.iterdir()) if directory.exists() else []
        if not files:
            return
        newest = files[-1]
        raw = bytearray(newest.read_bytes())
        (end_log_offset,) = struct.unpack_from(">q", raw, 24)
        if end_log_offset < safe or not data.draw(st.booleans(), label="damage index"):
            return
        start = data.draw(st.integers(0, len(raw) - 1), label="hole at")
        length = data.draw(st.integers(1, 64), label="hole length")
        raw[start : start + length] = bytes(len(raw[start : start + length]))
        newest.write_bytes(raw)

    def _leave_half_a_spare(self, data: st.DataObject) -> None:
        """Prepared segments: a crash mid-preparation leaves a partial spare of any bytes."""
        fill = self.config.segment_fill
        if fill is SegmentFill.SPARSE:
            return
        partial = self.config.spare_segment_path / f"spare-{fill.value}.partial"
        partial.write_bytes(data.draw(st.binary(max_size=64), label="partial spare"))

    @invariant()
    def queues_hold_exactly_the_model(self) -> None:
        for queue_id in range(QUEUES):
            expected = self.model[queue_id]
            assert self.store.max_queue_offset("Topic", queue_id) == len(expected)
            result = self.store.get("Topic", queue_id, 0, 1000, max_bytes=1 << 30)
            records = [decode_record(r) for r in result.records]
            assert [r.body for r in records] == [m[1] for m in expected]
            assert [r.queue_offset for r in records] == list(range(len(expected)))
            assert [r.log_offset for r in records] == [m[2] for m in expected]

    @invariant()
    def every_message_is_found_by_key(self) -> None:
        for queue in self.model:
            for key, body, _, _ in queue[-3:]:
                assert [r.body for r in self.store.query_by_key("Topic", key)] == [body]


class WarmStoreWithCrashes(StoreWithCrashes):
    """The same with zero-filled segments prepared ahead (`warmMapedFileEnable` with SYNC_FLUSH)."""

    def __init__(self) -> None:
        super().__init__()
        self.store.close()
        self.config = replace(self.config, segment_fill=SegmentFill.ZEROED)
        self.store = Store.open(self.config)


TestStoreWithCrashes = StoreWithCrashes.TestCase
TestWarmStoreWithCrashes = WarmStoreWithCrashes.TestCase
