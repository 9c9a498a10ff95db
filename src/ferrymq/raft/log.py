"""The in-memory Raft log of one node: snapshot, entries, commit and apply points, membership.

Owns (thesis figure 3.1 "Log" plus chapter 5 compaction):
- the latest snapshot (`Snapshot`: index, term, membership at that index, and its bytes);
- the entries after it, `entries[i].index == snapshot.index + 1 + i`;
- `stable_index`: the last entry the storage holds durably (the rest is to be persisted);
- `commit_index` and `applied_index`, with `snapshot.index <= applied <= commit <= last`;
- the membership: the snapshot's, changed by every CONF_CHANGE entry in the log, in effect as
  soon as it is appended (thesis 4.1), so truncating a conflicting suffix also undoes the
  membership changes in it.

Rules:
1. Pure: no I/O, no clock.
2. Entries at or below `commit_index` are never truncated; a conflicting suffix is cut only
   where a term differs (paper 5.3), never because an append is older than the log's end.
3. `commit_index` never goes down.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ferrymq.wire.raft import ConfChangeOp, Entry, EntryKind, decode_conf_change

__all__ = ["HardState", "RaftLog", "Snapshot", "apply_conf_change"]


@dataclass(frozen=True, slots=True)
class HardState:
    """What a node must persist before sending a message that depends on it (paper figure 2)."""

    term: int = 0
    vote: str | None = None
    commit_index: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state machine at `index` (whose entry had `term`), and the membership there."""

    index: int
    term: int
    members: Mapping[str, str]
    data: bytes = field(default=b"", repr=False)


def apply_conf_change(members: Mapping[str, str], entry: Entry) -> dict[str, str]:
    """The membership after the CONF_CHANGE `entry`."""
    change = decode_conf_change(entry.data)
    updated = dict(members)
    if change.op is ConfChangeOp.ADD:
        updated[change.node_id] = change.address
    else:
        updated.pop(change.node_id, None)
    return updated


class RaftLog:
    """Snapshot + entries + commit/apply points of one node."""

    def __init__(self, snapshot: Snapshot, entries: Sequence[Entry] = ()) -> None:
        self.snapshot = snapshot
        self.entries: list[Entry] = []
        self.stable_index = snapshot.index
        self.commit_index = snapshot.index
        self.applied_index = snapshot.index
        self._configs: list[tuple[int, dict[str, str]]] = [(snapshot.index, dict(snapshot.members))]
        self._append(list(entries))
        self.stable_index = self.last_index

    # ------------------------------------------------------------------ reads

    @property
    def first_index(self) -> int:
        """The index of the first entry held (after the snapshot)."""
        return self.snapshot.index + 1

    @property
    def last_index(self) -> int:
        """The index of the last entry (the snapshot's when there is none)."""
        return self.snapshot.index + len(self.entries)

    @property
    def last_term(self) -> int:
        """The term of the last entry."""
        return self.entries[-1].term if self.entries else self.snapshot.term

    def term_at(self, index: int) -> int | None:
        """The term of the entry at `index`; None when compacted away or not there yet."""
        if index == self.snapshot.index:
            return self.snapshot.term
        if index < self.snapshot.index or index > self.last_index:
            return None
        return self.entries[index - self.first_index].term

    def matches(self, index: int, term: int) -> bool:
        """Whether the log holds an entry at `index` with `term`."""
        return self.term_at(index) == term

    def entry(self, index: int) -> Entry:
        """The entry at `index` (which must be held)."""
        return self.entries[index - self.first_index]

    def slice(self, low: int, high: int, max_count: int | None = None) -> list[Entry]:
        """Entries with `low <= index < high` (at most `max_count`); `low` must be held."""
        start = low - self.first_index
        stop = high - self.first_index
        if max_count is not None:
            stop = min(stop, start + max_count)
        return self.entries[start:stop]

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Whether a log ending at (`last_index`, `last_term`) is at least as up to date (5.4.1)."""
        return (last_term, last_index) >= (self.last_term, self.last_index)

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """The last index <= `index` whose term is <= `term` (the fast back-off probe point).

        Stops at the snapshot's index: below it nothing is known.
        """
        index = min(index, self.last_index)
        while index > self.snapshot.index:
            entry_term = self.term_at(index)
            if entry_term is not None and entry_term <= term:
                return index
            index -= 1
        return self.snapshot.index

    def unstable_entries(self) -> list[Entry]:
        """Entries not yet persisted."""
        return self.entries[self.stable_index - self.snapshot.index :]

    def committed_to_apply(self, max_count: int) -> list[Entry]:
        """Committed entries not yet handed out for applying (at most `max_count`)."""
        low = self.applied_index + 1
        high = min(self.commit_index, low + max_count - 1)
        if high < low:
            return []
        return self.slice(low, high + 1)

    @property
    def members(self) -> dict[str, str]:
        """The membership in effect: the latest in the log, committed or not (thesis 4.1)."""
        return self._configs[-1][1]

    @property
    def last_conf_index(self) -> int:
        """The index of the latest membership change (the snapshot's index if none after it)."""
        return self._configs[-1][0]

    def members_at(self, index: int) -> dict[str, str]:
        """The membership in effect at `index` (>= the snapshot's index)."""
        for conf_index, members in reversed(self._configs):
            if conf_index <= index:
                return members
        return self._configs[0][1]

    # ------------------------------------------------------------------ writes

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries that follow on from the log (a leader's own, never conflicting)."""
        if entries and entries[0].index != self.last_index + 1:
            raise ValueError(f"entry {entries[0].index} does not follow {self.last_index}")
        self._append(list(entries))

    def maybe_append(self, prev_index: int, prev_term: int, entries: Sequence[Entry]) -> int | None:
        """A follower's append (paper 5.3): the last new index, or None if the prev does not match.

        Entries already held with the same term are skipped; the suffix from the first entry
        whose term differs is cut and replaced.
        """
        if not self.matches(prev_index, prev_term):
            return None
        last_new = prev_index + len(entries)
        for position, entry in enumerate(entries):
            held = self.term_at(entry.index)
            if held == entry.term:
                continue
            if entry.index <= self.snapshot.index:
                continue  # below the snapshot: committed, and the leader's copy agrees
            if entry.index <= self.commit_index:
                raise AssertionError(
                    f"entry {entry.index} conflicts with a committed entry (commit "
                    f"{self.commit_index}): the leader broke the log matching property"
                )
            self._truncate_after(entry.index - 1)
            self._append(list(entries[position:]))
            break
        return last_new

    def commit_to(self, index: int) -> bool:
        """Raise the commit index to `index` (never lowers it); whether it moved."""
        if index <= self.commit_index:
            return False
        if index > self.last_index:
            raise AssertionError(f"commit {index} is past the last index {self.last_index}")
        self.commit_index = index
        return True

    def applied_to(self, index: int) -> None:
        """Record that entries up to `index` were applied."""
        if index > self.applied_index:
            self.applied_index = min(index, self.commit_index)

    def stable_to(self, index: int, term: int) -> None:
        """Entries up to (`index`, `term`) are persisted (ignored if the log changed since)."""
        if self.matches(index, term) and index > self.stable_index:
            self.stable_index = index

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the whole log by a snapshot from the leader (paper 7, step 7)."""
        self.snapshot = snapshot
        self.entries = []
        self.stable_index = snapshot.index
        self.commit_index = snapshot.index
        self._configs = [(snapshot.index, dict(snapshot.members))]

    def compact(self, index: int, data: bytes) -> Snapshot:
        """Take a snapshot at the applied `index` with the state machine's `data`; drop entries.

        Returns:
            The new snapshot.
        """
        if not self.snapshot.index < index <= self.applied_index:
            raise ValueError(
                f"snapshot index {index} must be in ({self.snapshot.index}, {self.applied_index}]"
            )
        term = self.term_at(index)
        assert term is not None
        members = self.members_at(index)
        self.entries = self.entries[index - self.snapshot.index :]
        self.snapshot = Snapshot(index, term, dict(members), data)
        self.stable_index = max(self.stable_index, index)
        newer = [(i, m) for i, m in self._configs if i > index]
        self._configs = [(index, dict(members)), *newer]
        return self.snapshot

    def _append(self, entries: list[Entry]) -> None:
        members = self.members
        for entry in entries:
            if entry.kind is EntryKind.CONF_CHANGE:
                members = apply_conf_change(members, entry)
                self._configs.append((entry.index, members))
        self.entries.extend(entries)

    def _truncate_after(self, index: int) -> None:
        del self.entries[index - self.snapshot.index :]
        self.stable_index = min(self.stable_index, index)
        while len(self._configs) > 1 and self._configs[-1][0] > index:
            self._configs.pop()
