"""The fence state machine (broker/fence.py): table cases, then a Hypothesis model of a master's
fenced queue under racing and stale writers, failovers that cut uncommitted appends, restarts that
rebuild from the log, and retention that copies the live tail forward and deletes a prefix."""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ferrymq.broker.fence import (
    COPY,
    EPOCH,
    NO_FENCE,
    OP,
    TAIL,
    URL,
    WRITER,
    Fence,
    FenceLog,
    FenceOp,
    FenceRecord,
    InvalidFenceRecordError,
    apply,
    copy_properties,
    decide,
    parse_record,
    rebuild,
    record_properties,
)

CLAIM, SNAPSHOT, WRITE = FenceOp.CLAIM, FenceOp.SNAPSHOT, FenceOp.WRITE


def _claim(epoch: int, writer: str) -> FenceRecord:
    return FenceRecord(CLAIM, epoch, writer, f"http://{writer}")


def test_a_claim_is_a_compare_and_set_on_the_epoch() -> None:
    held = Fence(3, "w1", "http://w1")
    assert decide(held, _claim(4, "w2")) is None
    assert apply(held, _claim(4, "w2")) == Fence(4, "w2", "http://w2")
    for epoch in (1, 3, 5):
        reason = decide(held, _claim(epoch, "w2"))
        assert reason is not None
        assert "must name 4" in reason


def test_writes_and_snapshots_need_the_epoch_and_the_writer() -> None:
    held = Fence(3, "w1", "http://w1")
    assert decide(held, FenceRecord(WRITE, 3, "w1")) is None
    assert apply(held, FenceRecord(WRITE, 3, "w1")) == held
    snapshot = FenceRecord(SNAPSHOT, 3, "w1", "http://w1-moved")
    assert decide(held, snapshot) is None
    assert apply(held, snapshot) == Fence(3, "w1", "http://w1-moved")
    assert decide(held, FenceRecord(WRITE, 3, "w2")) is not None  # epoch alone is not enough
    assert decide(held, FenceRecord(WRITE, 2, "w1")) is not None
    assert decide(held, FenceRecord(WRITE, 4, "w1")) is not None
    assert decide(NO_FENCE, FenceRecord(WRITE, 0, "")) is not None


@pytest.mark.parametrize(
    ("properties", "match"),
    [
        ({}, "only records carrying"),
        ({OP: "append", EPOCH: "1", WRITER: "w"}, "not one of"),
        ({OP: "write", WRITER: "w"}, "EPOCH is missing"),
        ({OP: "write", EPOCH: "0", WRITER: "w"}, "must be >= 1"),
        ({OP: "write", EPOCH: "-1", WRITER: "w"}, "not a decimal"),
        ({OP: "write", EPOCH: " 1", WRITER: "w"}, "not a decimal"),
        ({OP: "write", EPOCH: "\u0661", WRITER: "w"}, "not a decimal"),
        ({OP: "write", EPOCH: "99999999999999999999", WRITER: "w"}, "not a decimal"),
        ({OP: "write", EPOCH: "1"}, "WRITER is missing"),
        ({OP: "write", EPOCH: "1", WRITER: ""}, "WRITER is missing"),
        ({OP: "write", EPOCH: "1", WRITER: "w" * 256}, "longer than 255"),
        ({OP: "claim", EPOCH: "1", WRITER: "w"}, "must carry FERRY_FENCE_URL"),
        ({OP: "snapshot", EPOCH: "1", WRITER: "w", URL: ""}, "must carry FERRY_FENCE_URL"),
        ({OP: "write", EPOCH: "1", WRITER: "w", COPY: "3"}, "set by the broker only"),
        ({OP: "write", EPOCH: "1", WRITER: "w", TAIL: "3"}, "set by the broker only"),
    ],
)
def test_malformed_fence_properties_are_refused_with_a_reason(
    properties: dict[str, str], match: str
) -> None:
    with pytest.raises(InvalidFenceRecordError, match=match):
        parse_record(properties, copy_allowed=False)


def test_properties_round_trip_and_copies_keep_the_first_original() -> None:
    sent = record_properties(CLAIM, 7, "w1", "http://w1:8083")
    assert parse_record(sent, copy_allowed=False) == FenceRecord(CLAIM, 7, "w1", "http://w1:8083")
    first = copy_properties(sent, 12, tail_start=30)
    again = copy_properties(first, 40)
    assert parse_record(first) == FenceRecord(CLAIM, 7, "w1", "http://w1:8083", 12, 30)
    assert parse_record(again) == FenceRecord(CLAIM, 7, "w1", "http://w1:8083", 12)
    assert parse_record(again).logical_offset(40) == 12
    with pytest.raises(InvalidFenceRecordError, match="copies only"):
        parse_record({**sent, TAIL: "3"})


def test_a_reader_skips_copies_of_what_it_applied_and_the_live_start_moves() -> None:
    records = [
        (0, _claim(1, "w1")),
        (1, FenceRecord(WRITE, 1, "w1")),
        (2, FenceRecord(SNAPSHOT, 1, "w1", "http://w1")),
        (3, FenceRecord(WRITE, 1, "w1")),
        # copy-forward of [2, 4): the block's last copy names its first
        (4, FenceRecord(SNAPSHOT, 1, "w1", "http://w1", copy_of=2)),
        (5, FenceRecord(WRITE, 1, "w1", copy_of=3, tail_start=4)),
        (6, _claim(2, "w2")),
    ]
    log = FenceLog()
    for queue_offset, record in records:
        log = log.step(queue_offset, record)
    assert log == FenceLog(Fence(2, "w2", "http://w2"), 6, 4)
    assert rebuild(records) == log
    assert rebuild(records[4:]) == log  # the originals expired: the copies carry the tail
    assert rebuild(records[3:]) == log


def test_a_copy_block_cut_short_anchors_nothing() -> None:
    records = [
        (0, _claim(1, "w1")),
        (1, _claim(2, "w2")),
        (2, FenceRecord(CLAIM, 1, "w1", "http://w1", copy_of=0)),
        # the block's second copy (of queue offset 1, with FERRY_FENCE_TAIL=2) was cut
    ]
    assert rebuild(records) == FenceLog(Fence(2, "w2", "http://w2"), 1, 0)


WRITERS = ("w1", "w2", "w3")


class FencedQueue(RuleBasedStateMachine):
    """One fenced queue on a group: the master's log, its commit point and its incremental fence.

    `log` holds the stored records (queue offset, record) from the oldest not deleted;
    `committed` is the queue offset below which every record is on the SyncStateSet;
    `originals` is every accepted original record ever stored and not cut by a failover (retention
    deletes only from `log`), for the full-replay checks.
    """

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[int, FenceRecord]] = []
        self.next_queue_offset = 0
        self.committed = 0
        self.master = FenceLog()
        self.originals: list[tuple[int, FenceRecord]] = []
        self.committed_epoch = 0

    # ------------------------------------------------------------------ writes

    def _append(self, record: FenceRecord) -> bool:
        if decide(self.master.fence, record) is not None:
            return False
        queue_offset = self.next_queue_offset
        self.log.append((queue_offset, record))
        self.originals.append((queue_offset, record))
        self.master = self.master.step(queue_offset, record)
        self.next_queue_offset += 1
        return True

    @rule(writer=st.sampled_from(WRITERS), delta=st.integers(-2, 2))
    def claim(self, writer: str, delta: int) -> None:
        before = self.master.fence.epoch
        epoch = max(1, before + delta)
        assert self._append(_claim(epoch, writer)) == (epoch == before + 1)

    @rule(writers=st.lists(st.sampled_from(WRITERS), min_size=2, max_size=3, unique=True))
    def racing_claims(self, writers: list[str]) -> None:
        epoch = self.master.fence.epoch + 1
        won = [writer for writer in writers if self._append(_claim(epoch, writer))]
        assert won == writers[:1]
        assert self.master.fence.writer == writers[0]

    @rule(
        writer=st.sampled_from(WRITERS),
        delta=st.integers(-1, 1),
        op=st.sampled_from([WRITE, SNAPSHOT]),
    )
    def write(self, writer: str, delta: int, op: FenceOp) -> None:
        fence = self.master.fence
        epoch = max(1, fence.epoch + delta)
        url = f"http://{writer}/{epoch}" if op is SNAPSHOT else None
        accepted = self._append(FenceRecord(op, epoch, writer, url))
        assert accepted == (fence.epoch >= 1 and epoch == fence.epoch and writer == fence.writer)

    # ------------------------------------------------------------------ replication

    @rule(count=st.integers(1, 8))
    def commit(self, count: int) -> None:
        self.committed = min(self.next_queue_offset, self.committed + count)

    @rule(data=st.data())
    def failover(self, data: st.DataObject) -> None:
        """The master dies; the new one holds the committed records and perhaps more."""
        cut = data.draw(st.integers(self.committed, self.next_queue_offset))
        self.log = [(q, r) for q, r in self.log if q < cut]
        self.originals = [(q, r) for q, r in self.originals if q < cut]
        self.next_queue_offset = cut
        self.master = rebuild(self.log)

    @rule()
    def restart(self) -> None:
        assert rebuild(self.log) == self.master
        self.master = rebuild(self.log)

    # ------------------------------------------------------------------ retention

    def _committed_live_start(self) -> int:
        committed = [(q, r) for q, r in self.log if q < self.committed]
        return rebuild(committed).live_start_queue_offset if committed else 0

    @precondition(lambda self: self.log)
    @rule(commit_copies=st.booleans(), data=st.data())
    def copy_forward_then_expire(self, commit_copies: bool, data: st.DataObject) -> None:
        start = self.master.live_start_queue_offset
        tail = [(q, r) for q, r in self.log if q >= start]
        assert tail
        assert tail[0][0] == start, "the live tail is whole"
        block_start = self.next_queue_offset
        for index, (queue_offset, record) in enumerate(tail):
            copy = FenceRecord(
                record.op,
                record.epoch,
                record.writer,
                record.url,
                record.logical_offset(queue_offset),
                block_start if index == len(tail) - 1 else None,
            )
            self.log.append((self.next_queue_offset, copy))
            self.master = self.master.step(self.next_queue_offset, copy)
            self.next_queue_offset += 1
        if commit_copies:
            self.committed = self.next_queue_offset
        self._expire(data.draw(st.integers(0, self.next_queue_offset)))

    @rule(cut=st.integers(0, 60))
    def expire_without_copies(self, cut: int) -> None:
        self._expire(cut)

    def _expire(self, cut: int) -> None:
        """Delete records below `cut`, never the committed live tail (the store's guard)."""
        keep = min(cut, self._committed_live_start())
        self.log = [(q, r) for q, r in self.log if q >= keep]

    # ------------------------------------------------------------------ invariants

    @invariant()
    def a_rebuild_equals_the_incremental_state(self) -> None:
        assert rebuild(self.log) == self.master

    @invariant()
    def snapshot_and_tail_replay_equals_full_replay(self) -> None:
        fence = NO_FENCE
        for _, record in self.originals:
            fence = apply(fence, record)
        assert self.master.fence == fence

    @invariant()
    def every_record_satisfied_the_rule_at_its_position(self) -> None:
        fence = NO_FENCE
        for _, record in self.originals:
            assert decide(fence, record) is None
            fence = apply(fence, record)

    @invariant()
    def one_writer_per_epoch_in_the_committed_log(self) -> None:
        writers: dict[int, str] = {}
        for queue_offset, record in self.originals:
            if queue_offset >= self.committed:
                break
            if record.op is CLAIM:
                assert record.epoch not in writers
                writers[record.epoch] = record.writer
            else:
                assert writers.get(record.epoch, record.writer) == record.writer

    @invariant()
    def the_committed_epoch_never_goes_back(self) -> None:
        committed = [(q, r) for q, r in self.log if q < self.committed]
        epoch = rebuild(committed).fence.epoch if committed else self.committed_epoch
        assert epoch >= self.committed_epoch
        self.committed_epoch = epoch

    @invariant()
    def the_live_tail_is_never_deleted(self) -> None:
        if self.log:
            assert self.log[0][0] <= self.master.live_start_queue_offset


TestFencedQueue = FencedQueue.TestCase
