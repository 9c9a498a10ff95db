"""Raft file storage on real files: persist and reopen, conflicts, compaction, torn tails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferrymq.errors import StoreError, StoreLockedError
from ferrymq.raft.log import HardState, Snapshot
from ferrymq.raft.storage import RaftStorage, StoredState
from ferrymq.wire.raft import ConfChange, ConfChangeOp, Entry, EntryKind, encode_conf_change

MEMBERS = {"a": "h:1", "b": "h:2", "c": "h:3"}


def entries(first: int, terms: list[int]) -> list[Entry]:
    return [
        Entry(term, index, EntryKind.COMMAND, b"v%d.%d" % (index, term))
        for index, term in enumerate(terms, start=first)
    ]


def reopen(path: Path) -> StoredState:
    storage = RaftStorage(path)
    try:
        return storage.open()
    finally:
        storage.close()


def log_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith("log-"))


def test_a_fresh_directory_holds_nothing(tmp_path: Path) -> None:
    state = reopen(tmp_path / "raft")
    assert state == StoredState()


def test_persisted_state_survives_a_reopen(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    conf = Entry(1, 3, EntryKind.CONF_CHANGE, encode_conf_change(ConfChange(ConfChangeOp.ADD, "d")))
    storage.persist(HardState(1, "a", 0), [*entries(1, [1, 1]), conf], None)
    storage.persist(HardState(1, "a", 3), entries(4, [1]), None)
    storage.close()
    state = reopen(tmp_path)
    assert state.hard_state == HardState(1, "a", 0)  # the commit index alone is not rewritten
    assert [e.index for e in state.entries] == [1, 2, 3, 4]
    assert state.entries[2] == conf


def test_a_vote_change_rewrites_the_hard_state(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(HardState(1, "a", 0), [], None)
    storage.persist(HardState(2, None, 5), [], None)
    storage.persist(HardState(2, "c", 5), [], None)
    storage.close()
    assert reopen(tmp_path).hard_state == HardState(2, "c", 5)


def test_entries_from_a_stored_index_replace_the_suffix(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(None, entries(1, [1, 1, 2, 2, 2]), None)
    storage.persist(None, entries(3, [3]), None)
    storage.persist(None, entries(4, [3, 3]), None)
    storage.close()
    assert [(e.index, e.term) for e in reopen(tmp_path).entries] == [
        (1, 1),
        (2, 1),
        (3, 3),
        (4, 3),
        (5, 3),
    ]


def test_a_gap_in_the_log_is_refused(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(None, entries(1, [1]), None)
    with pytest.raises(StoreError, match="gap"):
        storage.persist(None, entries(3, [1]), None)
    storage.close()


def test_compaction_keeps_the_snapshot_and_the_entries_after_it(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(HardState(2, "a", 6), entries(1, [1, 1, 2, 2, 2, 2]), None)
    storage.compact(Snapshot(4, 2, MEMBERS, b"state@4"))
    storage.persist(None, entries(7, [2]), None)
    storage.close()
    assert log_files(tmp_path) == [f"log-{5:020d}"]
    state = reopen(tmp_path)
    assert state.snapshot == Snapshot(4, 2, MEMBERS, b"state@4")
    assert [e.index for e in state.entries] == [5, 6, 7]


def test_an_installed_snapshot_replaces_the_whole_log(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(None, entries(1, [1, 1, 1]), None)
    storage.persist(HardState(3, None, 10), entries(11, [3]), Snapshot(10, 3, MEMBERS, b"s"))
    storage.close()
    state = reopen(tmp_path)
    assert state.snapshot is not None
    assert state.snapshot.index == 10
    assert [e.index for e in state.entries] == [11]


def test_a_crash_after_the_snapshot_but_before_the_log_reset_drops_a_stale_log(
    tmp_path: Path,
) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(None, entries(1, [1, 1, 1]), None)
    storage._write_snapshot(Snapshot(2, 3, MEMBERS, b"s"))  # index 2 was term 1 here: stale log
    storage.close()
    state = reopen(tmp_path)
    assert state.entries == []
    assert log_files(tmp_path) == [f"log-{3:020d}"]


def test_a_crash_during_compaction_keeps_the_matching_log(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(None, entries(1, [1, 1, 2, 2]), None)
    storage._write_snapshot(Snapshot(3, 2, MEMBERS, b"s"))  # then a crash: old log file stays
    storage.close()
    state = reopen(tmp_path)
    assert [e.index for e in state.entries] == [4]
    assert log_files(tmp_path) == [f"log-{4:020d}"]


def test_an_older_log_file_left_by_a_crash_is_removed(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(None, entries(1, [1, 1, 1]), None)
    storage.close()
    (tmp_path / f"log-{0:020d}").write_bytes(b"older")
    (tmp_path / f".log-{9:020d}.tmp").write_bytes(b"half")
    assert [e.index for e in reopen(tmp_path).entries] == [1, 2, 3]
    assert log_files(tmp_path) == [f"log-{1:020d}"]


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(cut=st.integers(min_value=0), garbage=st.binary(max_size=40))
def test_recovery_cuts_a_torn_tail_at_any_byte(tmp_path: Path, cut: int, garbage: bytes) -> None:
    directory = tmp_path / f"cut{cut}-{garbage.hex()}"
    storage = RaftStorage(directory)
    storage.open()
    written = entries(1, [1, 1, 2, 2, 3])
    storage.persist(None, written, None)
    storage.close()
    [name] = log_files(directory)
    path = directory / name
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(cut % (size + 1))
        f.seek(0, os.SEEK_END)
        f.write(garbage)
    recovered = reopen(directory).entries
    assert recovered == written[: len(recovered)]  # a prefix, never a changed entry
    again = RaftStorage(directory)
    again.open()
    again.persist(None, entries(len(recovered) + 1, [4]), None)  # appends after the cut
    again.close()
    assert [e.term for e in reopen(directory).entries][-1] == 4


def test_a_damaged_hard_state_refuses_to_start(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(HardState(4, "b", 0), [], None)
    storage.close()
    data = bytearray((tmp_path / "hardstate").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "hardstate").write_bytes(bytes(data))
    with pytest.raises(StoreError, match="damaged"):
        reopen(tmp_path)


def test_a_damaged_snapshot_refuses_to_start(tmp_path: Path) -> None:
    storage = RaftStorage(tmp_path)
    storage.open()
    storage.persist(None, entries(1, [1]), None)
    storage.compact(Snapshot(1, 1, MEMBERS, b"state"))
    storage.close()
    data = bytearray((tmp_path / "snapshot").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "snapshot").write_bytes(bytes(data))
    with pytest.raises(StoreError, match="damaged"):
        reopen(tmp_path)


def test_a_directory_is_used_by_one_node_at_a_time(tmp_path: Path) -> None:
    first = RaftStorage(tmp_path)
    first.open()
    with pytest.raises(StoreLockedError):
        RaftStorage(tmp_path).open()
    first.close()
    reopen(tmp_path)
