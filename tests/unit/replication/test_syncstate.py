"""SyncStateSet bookkeeping: confirm offset, shrink, expand, minInSyncReplicas."""

from ferrymq.replication.syncstate import MAX_PENDING_TRANSFERS, SyncState


def _writable(state: SyncState) -> bool:
    return state.writable  # a call, so mypy does not carry narrowing across state changes


def test_alone_the_master_confirms_its_whole_log() -> None:
    state = SyncState(0)
    assert state.update_confirm(500) == 500
    assert state.writable


def test_every_member_must_hold_a_byte_before_it_is_confirmed() -> None:
    state = SyncState(0, frozenset({0, 1, 2}), confirm_offset=100)
    state.connected(1, now=0.0)
    state.connected(2, now=0.0)
    assert state.on_ack(1, 400, master_end=500, now=1.0) is None
    assert state.confirm_offset == 100, "member 2 has not acked: the watermark waits"
    state.on_ack(2, 300, master_end=500, now=1.0)
    assert state.confirm_offset == 300
    state.on_ack(2, 500, master_end=500, now=1.0)
    assert state.confirm_offset == 400
    state.disconnected(1)
    state.on_ack(2, 600, master_end=600, now=2.0)
    assert state.confirm_offset == 400, "a member that went away holds it until it is shrunk"
    assert state.update_confirm(600) == 400


def test_the_watermark_never_goes_down() -> None:
    state = SyncState(0, frozenset({0, 1}), confirm_offset=0)
    state.on_ack(1, 300, master_end=300, now=0.0)
    state.connected(1, now=1.0)  # reconnect, e.g. after a restart
    state.on_ack(1, 200, master_end=300, now=1.0)
    assert state.confirm_offset == 300


def test_a_slave_that_lags_too_long_is_shrunk_out_and_one_that_catches_up_expands_in() -> None:
    state = SyncState(0, frozenset({0, 1}), max_lag_seconds=15.0, min_in_sync_replicas=2)
    state.connected(1, now=0.0)
    state.on_ack(1, 100, master_end=100, now=0.0)
    assert state.check_lag(master_end=200, now=10.0) is None
    state.on_ack(1, 150, master_end=200, now=12.0)  # progress, but never caught up
    change = state.check_lag(master_end=200, now=16.0)
    assert change is not None
    assert change.members == frozenset({0})
    state.apply(change, master_end=200, now=16.0)
    assert not _writable(state), "below minInSyncReplicas: writes are refused"
    assert state.update_confirm(200) == 200
    assert state.on_ack(1, 199, master_end=200, now=17.0) is None
    expand = state.on_ack(1, 200, master_end=200, now=18.0)
    assert expand is not None
    assert expand.members == frozenset({0, 1})
    state.apply(expand, master_end=250, now=18.0)
    assert _writable(state)
    assert state.confirm_offset == 200, "the new member holds 200 of 250"
    assert state.check_lag(master_end=250, now=30.0) is None, "lag counts from joining"


def test_a_member_that_keeps_up_is_never_shrunk() -> None:
    state = SyncState(0, frozenset({0, 1}), max_lag_seconds=1.0)
    state.connected(1, now=0.0)
    for second in range(1, 100):
        state.on_ack(1, second * 10, master_end=second * 10, now=float(second))
        assert state.check_lag(master_end=second * 10, now=second + 0.5) is None


def test_after_the_clock_steps_back_a_lagging_slave_leaves_within_the_lag_limit() -> None:
    state = SyncState(0, frozenset({0, 1}), max_lag_seconds=3.0)
    state.connected(1, now=1000.0)
    state.on_ack(1, 100, master_end=100, now=1000.0)
    assert state.check_lag(master_end=200, now=760.0) is None  # the clock went back
    assert state.check_lag(master_end=200, now=763.0) is None
    change = state.check_lag(master_end=200, now=763.5)
    assert change is not None
    assert change.members == frozenset({0})


def test_an_ack_of_a_transfer_counts_from_that_transfer_though_the_end_moved_on() -> None:
    """Seed 001: lastMasterMaxOffset / lastTransferTimeMs. Under steady load every ack arrives
    after the master's end moved on; the slave is still caught up as of the transfer it acks."""
    state = SyncState(0, frozenset({0, 1}), max_lag_seconds=1.0)
    state.connected(1, now=0.0)
    end = 0
    for step in range(1, 200):
        now = step * 0.1
        end += 100
        state.on_transfer(1, end, now)  # bytes up to `end` go out
        # the ack of the previous transfer comes in; meanwhile the master appended again
        assert state.on_ack(1, end - 100, master_end=end, now=now) is None
        assert state.check_lag(master_end=end, now=now) is None


def test_a_slave_falling_further_behind_what_it_was_sent_is_shrunk() -> None:
    state = SyncState(0, frozenset({0, 1}), max_lag_seconds=1.0)
    state.connected(1, now=0.0)
    for step in range(1, 30):
        now = step * 0.1
        state.on_transfer(1, step * 1000, now)
        # it acks, but 40 % of the rate the log grows: what it holds is ever older
        state.on_ack(1, step * 400, master_end=step * 1000, now=now)
        if now < 1.5:
            assert state.check_lag(master_end=step * 1000, now=now) is None
    change = state.check_lag(master_end=29_000, now=2.9)
    assert change is not None
    assert change.members == frozenset({0})


def test_pending_transfers_are_bounded_and_a_reconnect_forgets_them() -> None:
    state = SyncState(0, frozenset({0, 1}), max_lag_seconds=1.0)
    state.connected(1, now=0.0)
    for i in range(MAX_PENDING_TRANSFERS * 3):
        state.on_transfer(1, i + 1, now=float(i))
    assert len(state._transfers[1]) == MAX_PENDING_TRANSFERS
    state.on_transfer(1, MAX_PENDING_TRANSFERS * 3, now=9999.0)
    assert len(state._transfers[1]) == MAX_PENDING_TRANSFERS, "the same end twice is one entry"
    state.disconnected(1)
    state.on_transfer(1, 5, now=10_000.0)  # nothing is recorded for a slave that is gone
    assert 1 not in state._transfers
    state.connected(1, now=10_001.0)
    assert not state._transfers[1]
