"""Durable storage of one Raft node: hard state, log entries, snapshot (files in one directory).

Files:
- `hardstate`: CRC-32 (u32) | MessagePack [term, vote, commit_index], replaced atomically
  (`store.atomic`: temp file, fsync, rename, directory fsync).
- `snapshot`: `FRSN` | CRC-32 of the rest (u32) | meta length (u32) | MessagePack
  [index, term, members] | state-machine bytes; replaced atomically.
- `log-<first index, 20 digits>`: the entries from that index on, each a record
  `payload length (u32) | CRC-32 of payload (u32) | MessagePack entry`, appended and fdatasync'ed.

Rules:
1. `persist` returns only once everything it was given is durable: the driver sends the messages
   of a Ready after it (paper figure 2: respond after stable storage is updated).
2. Within one `persist`: snapshot, then entries, then hard state. Appending entries whose first
   index is already stored cuts the stored log there first (a conflicting suffix).
3. The hard state file is rewritten when the term or the vote changes; the commit index it
   carries may lag (Raft relearns it from the leader), which saves two fsyncs per commit.
4. Compaction writes the snapshot first, then a new log file holding only the entries after it
   (written under a temporary name, fsynced, renamed), then removes the old file. On open the
   newest log file wins and older ones are removed.
5. Recovery reads records until the first one that is short, fails its CRC, does not decode or
   does not follow on, and cuts the file there (a torn tail: it was never acknowledged). A log
   that does not continue the snapshot (a crash between installing a leader's snapshot and
   resetting the log) is dropped, as the paper's InstallSnapshot step 7 would.
6. A damaged hard state or snapshot file (atomic writes cannot tear them) is a `StoreError`:
   refusing to start beats forgetting a vote.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from ferrymq.errors import StoreError, StoreLockedError
from ferrymq.raft.log import HardState, Snapshot
from ferrymq.store.atomic import fsync_dir, read_file, write_atomic
from ferrymq.wire.crc import crc32
from ferrymq.wire.raft import Entry

__all__ = ["RaftStorage", "StoredState"]

log = logging.getLogger(__name__)

_RECORD: Final = struct.Struct(">II")  # payload length, CRC-32 of payload
_U32: Final = struct.Struct(">I")
_SNAPSHOT_MAGIC: Final = b"FRSN"
_MAX_RECORD_BYTES: Final = 256 * 1024 * 1024
_LOG_PREFIX: Final = "log-"

_encoder: Final = msgspec.msgpack.Encoder()
_entry_decoder: Final = msgspec.msgpack.Decoder(Entry)


class _HardStateRecord(msgspec.Struct, array_like=True):
    term: int
    vote: str | None
    commit_index: int


class _SnapshotMeta(msgspec.Struct, array_like=True):
    index: int
    term: int
    members: dict[str, str]


_hard_state_decoder: Final = msgspec.msgpack.Decoder(_HardStateRecord)
_snapshot_meta_decoder: Final = msgspec.msgpack.Decoder(_SnapshotMeta)


@dataclass(slots=True)
class StoredState:
    """What a node restarts from."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot | None = None
    entries: list[Entry] = field(default_factory=list)


class RaftStorage:
    """The files of one node; used by one thread at a time (the driver's persist calls)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._hard_state = HardState()
        self._snapshot_index = 0
        self._log_first = 1
        self._log_path: Path | None = None
        self._log_fd = -1
        self._offsets: list[int] = []  # file offset of entry `_log_first + i`
        self._terms: list[int] = []
        self._end = 0
        self._lock_fd = -1

    # ------------------------------------------------------------------ open / recover

    def open(self) -> StoredState:
        """Lock the directory and recover what it holds.

        Raises:
            StoreLockedError: another process uses the directory.
            StoreError: the hard state or snapshot file is damaged.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        hard_state = self._load_hard_state()
        snapshot = self._load_snapshot()
        self._hard_state = hard_state
        self._snapshot_index = snapshot.index if snapshot else 0
        entries = self._load_log(snapshot)
        return StoredState(hard_state, snapshot, entries)

    def _lock(self) -> None:
        fd = os.open(self.data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreLockedError(f"{self.data_dir} is in use by another process") from None
        self._lock_fd = fd

    def _load_hard_state(self) -> HardState:
        data = read_file(self.data_dir / "hardstate")
        if data is None:
            return HardState()
        if len(data) < _U32.size or _U32.unpack_from(data)[0] != crc32(data[_U32.size :]):
            raise StoreError(f"{self.data_dir / 'hardstate'} is damaged (CRC)")
        try:
            record = _hard_state_decoder.decode(data[_U32.size :])
        except msgspec.DecodeError as exc:
            raise StoreError(f"{self.data_dir / 'hardstate'} is damaged: {exc}") from None
        return HardState(record.term, record.vote, record.commit_index)

    def _load_snapshot(self) -> Snapshot | None:
        path = self.data_dir / "snapshot"
        data = read_file(path)
        if data is None:
            return None
        head = len(_SNAPSHOT_MAGIC) + 2 * _U32.size
        if (
            len(data) < head
            or not data.startswith(_SNAPSHOT_MAGIC)
            or _U32.unpack_from(data, 4)[0] != crc32(memoryview(data)[8:])
        ):
            raise StoreError(f"{path} is damaged (magic or CRC)")
        (meta_length,) = _U32.unpack_from(data, 8)
        try:
            meta = _snapshot_meta_decoder.decode(data[head : head + meta_length])
        except msgspec.DecodeError as exc:
            raise StoreError(f"{path} is damaged: {exc}") from None
        return Snapshot(meta.index, meta.term, meta.members, data[head + meta_length :])

    def _load_log(self, snapshot: Snapshot | None) -> list[Entry]:
        snapshot_index = snapshot.index if snapshot else 0
        segments = sorted(
            (int(p.name[len(_LOG_PREFIX) :]), p)
            for p in self.data_dir.glob(f"{_LOG_PREFIX}*")
            if p.name[len(_LOG_PREFIX) :].isdigit()
        )
        for _, stale in segments[:-1]:
            stale.unlink()
        for tmp in self.data_dir.glob(f".{_LOG_PREFIX}*"):
            tmp.unlink()
        if not segments:
            self._start_segment(snapshot_index + 1, [])
            return []
        first, path = segments[-1]
        entries = self._read_segment(first, path)
        if first == snapshot_index + 1:
            return entries
        # The file starts at or before the snapshot: keep what follows it only if the log holds
        # the snapshot's last entry (paper 7); otherwise the snapshot replaces the whole log.
        kept: list[Entry] = []
        if snapshot is not None and first <= snapshot_index:
            at = snapshot_index - first
            if at < len(entries) and entries[at].term == snapshot.term:
                kept = entries[at + 1 :]
        self._start_segment(snapshot_index + 1, kept)
        return kept

    def _read_segment(self, first: int, path: Path) -> list[Entry]:
        data = path.read_bytes()
        entries: list[Entry] = []
        offsets: list[int] = []
        position = 0
        while position + _RECORD.size <= len(data):
            length, crc = _RECORD.unpack_from(data, position)
            end = position + _RECORD.size + length
            if length > _MAX_RECORD_BYTES or end > len(data):
                break
            payload = data[position + _RECORD.size : end]
            if crc32(payload) != crc:
                break
            try:
                entry = _entry_decoder.decode(payload)
            except msgspec.DecodeError:
                break
            if entry.index != first + len(entries):
                break
            entries.append(entry)
            offsets.append(position)
            position = end
        if position < len(data):
            log.warning(
                "%s: cutting %d bytes of torn or damaged tail after entry %d",
                path,
                len(data) - position,
                first + len(entries) - 1,
            )
        self._open_segment(path, first, offsets, [e.term for e in entries], position)
        if position < len(data):
            os.ftruncate(self._log_fd, position)
            os.fsync(self._log_fd)
        return entries

    # ------------------------------------------------------------------ segments

    def _open_segment(
        self, path: Path, first: int, offsets: list[int], terms: list[int], end: int
    ) -> None:
        if self._log_fd >= 0:
            os.close(self._log_fd)
        self._log_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._log_path = path
        self._log_first = first
        self._offsets = offsets
        self._terms = terms
        self._end = end

    def _start_segment(self, first: int, entries: Sequence[Entry]) -> None:
        """Write a new log file from `first` holding `entries`, then drop the old one."""
        path = self.data_dir / f"{_LOG_PREFIX}{first:020d}"
        tmp = self.data_dir / f".{path.name}.tmp"
        records, offsets, end = _encode_records(entries, 0)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, records, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        old = self._log_path
        os.replace(tmp, path)
        fsync_dir(self.data_dir)
        self._open_segment(path, first, offsets, [e.term for e in entries], end)
        if old is not None and old != path:
            old.unlink(missing_ok=True)
            fsync_dir(self.data_dir)

    # ------------------------------------------------------------------ writes

    def persist(
        self,
        hard_state: HardState | None,
        entries: Sequence[Entry],
        snapshot: Snapshot | None,
    ) -> None:
        """Make a Ready's snapshot, entries and hard state durable, in that order."""
        if snapshot is not None:
            self._write_snapshot(snapshot)
            self._start_segment(snapshot.index + 1, [])
        if entries:
            self._append(entries)
        if hard_state is not None and (
            hard_state.term != self._hard_state.term or hard_state.vote != self._hard_state.vote
        ):
            record = _encoder.encode(
                _HardStateRecord(hard_state.term, hard_state.vote, hard_state.commit_index)
            )
            write_atomic(self.data_dir / "hardstate", _U32.pack(crc32(record)) + record)
            self._hard_state = hard_state

    def compact(self, snapshot: Snapshot) -> None:
        """Store a snapshot the node took at `snapshot.index` and drop the entries it covers."""
        self._write_snapshot(snapshot)
        last = self._log_first + len(self._offsets) - 1
        kept: list[Entry] = []
        if snapshot.index < last:
            kept = self._read_entries(snapshot.index + 1)
        self._start_segment(snapshot.index + 1, kept)

    def _write_snapshot(self, snapshot: Snapshot) -> None:
        meta = _encoder.encode(_SnapshotMeta(snapshot.index, snapshot.term, dict(snapshot.members)))
        body = _U32.pack(len(meta)) + meta + snapshot.data
        write_atomic(self.data_dir / "snapshot", _SNAPSHOT_MAGIC + _U32.pack(crc32(body)) + body)
        self._snapshot_index = snapshot.index

    def _append(self, entries: Sequence[Entry]) -> None:
        first_new = entries[0].index
        last = self._log_first + len(self._offsets) - 1
        if first_new < self._log_first:
            raise StoreError(f"entry {first_new} precedes the stored log ({self._log_first})")
        if first_new > last + 1:
            raise StoreError(f"entry {first_new} leaves a gap after the stored log ({last})")
        if first_new <= last:
            keep = first_new - self._log_first
            self._end = self._offsets[keep]
            del self._offsets[keep:]
            del self._terms[keep:]
            os.ftruncate(self._log_fd, self._end)
        records, offsets, end = _encode_records(entries, self._end)
        _write_all(self._log_fd, records, self._end)
        os.fdatasync(self._log_fd)
        self._offsets.extend(offsets)
        self._terms.extend(e.term for e in entries)
        self._end = end

    def _read_entries(self, low: int) -> list[Entry]:
        start = self._offsets[low - self._log_first]
        data = os.pread(self._log_fd, self._end - start, start)
        entries = []
        position = 0
        while position < len(data):
            length, _ = _RECORD.unpack_from(data, position)
            payload = data[position + _RECORD.size : position + _RECORD.size + length]
            entries.append(_entry_decoder.decode(payload))
            position += _RECORD.size + length
        return entries

    def close(self) -> None:
        """Close the files and release the directory lock."""
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _encode_records(entries: Sequence[Entry], start: int) -> tuple[list[bytes], list[int], int]:
    records: list[bytes] = []
    offsets: list[int] = []
    position = start
    for entry in entries:
        payload = _encoder.encode(entry)
        offsets.append(position)
        records.append(_RECORD.pack(len(payload), crc32(payload)))
        records.append(payload)
        position += _RECORD.size + len(payload)
    return records, offsets, position


def _write_all(fd: int, chunks: list[bytes], position: int) -> None:
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            written = os.pwrite(fd, view, position)
            position += written
            view = view[written:]
