"""The key index: find messages by key or unique key within a time range (RocketMQ `IndexFile`).

File layout (RocketMQ's, big-endian), one file per `max_entries` keys, named by creation time
(`yyyyMMddHHmmssSSS`) under `index/`:

```
header (40): begin_timestamp i64 | end_timestamp i64 | begin_log_offset i64 | end_log_offset i64
             | hash_slot_count i32 | index_count i32
slots (4 * slot_count): i32 number of the newest entry in the slot's chain, 0 = empty
entries (20 * max_entries): key_hash i32 | log_offset i64 | time_diff_s i32 | previous i32
```

Entry 0 is never used, so 0 ends a chain. The key of a message is `topic#key`, for each of its keys
and for its unique key; its hash is Java's `String.hashCode`, made non-negative. Lookups return
log offsets: hashes collide, so the caller reads each record and compares keys.

Files are memory-mapped and fully allocated up front (posix_fallocate): a full disk fails at file
creation, never as a SIGBUS on a later write. Records below `end_log_offset` of the newest file are
already indexed and are skipped, so replaying the commit log into the index is idempotent.
"""

from __future__ import annotations

import datetime
import logging
import mmap
import os
import re
import struct
import threading
from pathlib import Path
from types import ModuleType
from typing import Final

from ferrymq.errors import StoreError
from ferrymq.store.atomic import fsync_dir
from ferrymq.wire.records import (
    SYSFLAG_TRANSACTION_ROLLBACK,
    RecordInfo,
    java_string_hash,
    transaction_type,
)

__all__ = ["IndexFile", "KeyIndex", "index_key_hash"]

_accel: ModuleType | None
try:
    from ferrymq.wire import accel as _accel
except ImportError:  # pragma: no cover - the C accelerator is optional
    _accel = None

log = logging.getLogger(__name__)

_HEADER: Final = struct.Struct(">qqqqii")
_SLOT: Final = struct.Struct(">i")
_ENTRY: Final = struct.Struct(">iqii")
_NAME: Final = re.compile(r"\d{17}")


def index_key_hash(topic: str, key: str) -> int:
    """RocketMQ `IndexFile.indexKeyHashMethod` of `topic#key`: a non-negative int32."""
    h = abs(java_string_hash(f"{topic}#{key}"))
    return 0 if h > 0x7FFFFFFF else h


class IndexFile:
    """One memory-mapped index file."""

    def __init__(self, path: Path, slot_count: int, max_entries: int, create: bool) -> None:
        self.path = path
        self.slot_count = slot_count
        self.max_entries = max_entries
        self.file_bytes = _HEADER.size + slot_count * _SLOT.size + max_entries * _ENTRY.size
        self._entries_at = _HEADER.size + slot_count * _SLOT.size
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self._fd = os.open(path, flags, 0o644)
        try:
            if create:
                os.posix_fallocate(self._fd, 0, self.file_bytes)
            elif os.fstat(self._fd).st_size != self.file_bytes:
                raise StoreError(f"index file {path} does not have the configured size")
            self._map = mmap.mmap(self._fd, self.file_bytes)
        except BaseException:
            os.close(self._fd)
            if create:
                path.unlink(missing_ok=True)
            raise
        (
            self.begin_timestamp_ms,
            self.end_timestamp_ms,
            self.begin_log_offset,
            self.end_log_offset,
            self.hash_slot_count,
            self.index_count,
        ) = _HEADER.unpack_from(self._map, 0)
        if create:
            self.index_count = 1
            self.write_header()
        elif not 1 <= self.index_count <= max_entries:
            self._map.close()
            os.close(self._fd)
            raise StoreError(f"index file {path} has a bad entry count {self.index_count}")

    @property
    def is_full(self) -> bool:
        """Whether no more entries fit."""
        return bool(self.index_count >= self.max_entries)

    def write_header(self) -> None:
        """Store the header fields in the file (after a batch of `put`s, before a sync)."""
        self._write_header()

    def _write_header(self) -> None:
        _HEADER.pack_into(
            self._map,
            0,
            self.begin_timestamp_ms,
            self.end_timestamp_ms,
            self.begin_log_offset,
            self.end_log_offset,
            self.hash_slot_count,
            self.index_count,
        )

    def put(self, key_hash: int, log_offset: int, store_timestamp_ms: int) -> None:
        """Add one key; the file must not be full."""
        slot_at = _HEADER.size + (key_hash % self.slot_count) * _SLOT.size
        (head,) = _SLOT.unpack_from(self._map, slot_at)
        if not 0 < head < self.index_count:
            head = 0
        if self.index_count == 1:
            self.begin_timestamp_ms = store_timestamp_ms
            self.begin_log_offset = log_offset
        time_diff_s = max(0, (store_timestamp_ms - self.begin_timestamp_ms) // 1000)
        _ENTRY.pack_into(
            self._map,
            self._entries_at + self.index_count * _ENTRY.size,
            key_hash,
            log_offset,
            min(time_diff_s, 0x7FFFFFFF),
            head,
        )
        _SLOT.pack_into(self._map, slot_at, self.index_count)
        if head == 0:
            self.hash_slot_count += 1
        self.index_count += 1
        self.end_timestamp_ms = max(self.end_timestamp_ms, store_timestamp_ms)
        self.end_log_offset = max(self.end_log_offset, log_offset)

    def put_many(self, keys: list[tuple[str, str, int, int]]) -> None:
        """`put` each (topic, key, log_offset, store_timestamp_ms), in order; they must fit.

        By the C accelerator when built (`accel.index_put`, the same bytes as `put`: a unit
        test holds them equal).
        """
        if not keys:
            return
        if self.index_count + len(keys) > self.max_entries:
            raise StoreError(f"{len(keys)} keys do not fit index file {self.path}")
        if self.index_count == 1:
            _, _, log_offset, store_timestamp_ms = keys[0]
            self.begin_timestamp_ms = store_timestamp_ms
            self.begin_log_offset = log_offset
        if _accel is None:
            for topic, key, log_offset, store_timestamp_ms in keys:
                self.put(index_key_hash(topic, key), log_offset, store_timestamp_ms)
            return
        self.index_count, taken = _accel.index_put(
            self._map,
            self.slot_count,
            self._entries_at,
            self.index_count,
            self.begin_timestamp_ms,
            keys,
        )
        self.hash_slot_count += taken
        self.end_timestamp_ms = max(self.end_timestamp_ms, max(k[3] for k in keys))
        self.end_log_offset = max(self.end_log_offset, max(k[2] for k in keys))

    def query(self, key_hash: int, max_count: int, begin_ms: int, end_ms: int) -> list[int]:
        """Log offsets of entries with `key_hash` stored within [begin_ms, end_ms], newest first."""
        found: list[int] = []
        if (
            self.index_count <= 1
            or end_ms < self.begin_timestamp_ms
            or begin_ms > self.end_timestamp_ms
        ):
            return found
        (number,) = _SLOT.unpack_from(self._map, _HEADER.size + (key_hash % self.slot_count) * 4)
        steps = 0
        while 0 < number < self.index_count and len(found) < max_count and steps < self.index_count:
            entry_hash, log_offset, time_diff_s, previous = _ENTRY.unpack_from(
                self._map, self._entries_at + number * _ENTRY.size
            )
            stored_ms = self.begin_timestamp_ms + time_diff_s * 1000
            if entry_hash == key_hash and begin_ms <= stored_ms + 999 and stored_ms <= end_ms:
                found.append(log_offset)
            if previous >= number:
                break
            number = previous
            steps += 1
        return found

    def dup_fd(self) -> int:
        """A duplicate descriptor for the flusher (fdatasync also writes back mapped pages)."""
        return os.dup(self._fd)

    def close(self) -> None:
        """Unmap and close."""
        if self._fd >= 0:
            self.write_header()
            self._map.close()
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        """Close and remove the file."""
        self.close()
        self.path.unlink(missing_ok=True)


class KeyIndex:
    """The index files of a store, oldest first; one owner thread writes."""

    def __init__(self, directory: Path, slot_count: int, max_entries: int) -> None:
        self.directory = directory
        self.slot_count = slot_count
        self.max_entries = max_entries
        self.files: list[IndexFile] = []
        self._last_name = ""
        self._dirty: set[IndexFile] = set()
        self._dirty_lock = threading.Lock()  # the flusher thread takes the dirty set

    @property
    def end_log_offset(self) -> int:
        """Records below this log offset are indexed (0 when there is no file)."""
        return self.files[-1].end_log_offset if self.files else 0

    def load(self) -> None:
        """Open the existing files; a file that does not open is deleted (it is rebuilt)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(p for p in self.directory.iterdir() if _NAME.fullmatch(p.name)):
            try:
                self.files.append(IndexFile(path, self.slot_count, self.max_entries, create=False))
            except (StoreError, OSError) as exc:
                log.warning("index file %s is unusable (%s); deleting it for a rebuild", path, exc)
                path.unlink(missing_ok=True)
            self._last_name = path.name

    def _new_file(self, now_ms: int) -> IndexFile:
        stamp = datetime.datetime.fromtimestamp(now_ms / 1000, tz=datetime.UTC)
        name = stamp.strftime("%Y%m%d%H%M%S") + f"{stamp.microsecond // 1000:03d}"
        if name <= self._last_name:
            name = f"{int(self._last_name) + 1:017d}"
        self._last_name = name
        index_file = IndexFile(
            self.directory / name, self.slot_count, self.max_entries, create=True
        )
        fsync_dir(self.directory)
        self.files.append(index_file)
        return index_file

    def add_many(self, infos: list[RecordInfo]) -> None:
        """Index the keys and unique keys of records in log order; store the touched headers.

        Records below the newest file's end are indexed already and skipped, so a replay of the
        log is idempotent.
        """
        if not infos:
            return
        current = self.files[-1] if self.files else None
        indexed_below = current.end_log_offset if current is not None else 0
        run: list[tuple[str, str, int, int]] = []
        room = current.max_entries - current.index_count if current is not None else 0
        for info in infos:
            if (not info.keys and info.uniq_key is None) or info.log_offset < indexed_below:
                continue
            if transaction_type(info.sys_flag) == SYSFLAG_TRANSACTION_ROLLBACK:
                continue
            keys = [*info.keys, info.uniq_key] if info.uniq_key else info.keys
            for key in keys:
                if len(run) >= room:  # this file is full: its run first, then a new file
                    if current is not None:
                        self._put_run(current, run)
                    current = self._new_file(info.store_timestamp_ms)
                    room = current.max_entries - current.index_count
                    run = []
                run.append((info.topic, key, info.log_offset, info.store_timestamp_ms))
        if current is not None:
            self._put_run(current, run)

    def _put_run(self, index_file: IndexFile, run: list[tuple[str, str, int, int]]) -> None:
        if run:
            with self._dirty_lock:
                self._dirty.add(index_file)
            index_file.put_many(run)
        index_file.write_header()

    def query(self, topic: str, key: str, max_count: int, begin_ms: int, end_ms: int) -> list[int]:
        """Candidate log offsets for `key` in `topic`, newest first, without duplicates."""
        key_hash = index_key_hash(topic, key)
        found: list[int] = []
        for index_file in reversed(self.files):
            for log_offset in index_file.query(key_hash, max_count - len(found), begin_ms, end_ms):
                if log_offset not in found:
                    found.append(log_offset)
            if len(found) >= max_count:
                break
        return found

    def drop_from(self, log_offset: int) -> int:
        """Delete the files holding entries at or after `log_offset`.

        Returns the lowest log offset they covered, from which the commit log must be replayed
        into the index (`log_offset` when nothing was deleted).
        """
        replay_from = log_offset
        while self.files and self.files[-1].end_log_offset >= log_offset:
            doomed = self.files.pop()
            replay_from = min(replay_from, doomed.begin_log_offset)
            log.info(
                "dropping index file %s (covers log offsets from %d)",
                doomed.path.name,
                doomed.begin_log_offset,
            )
            doomed.delete()
        return replay_from

    def delete_expired(self, min_log_offset: int) -> int:
        """Delete files whose entries all point below `min_log_offset`, keeping the newest."""
        deleted = 0
        while len(self.files) > 1 and self.files[0].end_log_offset < min_log_offset:
            self.files.pop(0).delete()
            deleted += 1
        return deleted

    def sync_handles(self) -> tuple[list[int], int, int]:
        """For the flusher: what to sync, and where the newest file starts.

        Returns duplicated descriptors of every file written since the last call, and the stamp
        and first log offset of the newest file, which the checkpoint keeps (`drop_unsynced`).
        """
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
            last = self.files[-1] if self.files else None
            newest = int(last.path.name) if last else 0
            begin = last.begin_log_offset if last else 0
        handles: list[int] = []
        for index_file in dirty:
            try:
                handles.append(index_file.dup_fd())
            except OSError:  # deleted meanwhile: nothing left to sync
                continue
        return handles, newest, begin

    def drop_unsynced(self, synced_stamp: int) -> None:
        """After a crash: drop the files that may have been written since the last checkpoint.

        The checkpoint named the newest file at its sync (`synced_stamp`); that file and every
        newer one may hold torn slots and entries, which cannot be repaired in place (a slot is
        overwritten, so its older chain is lost with a torn write). The caller replays the
        commit log from the checkpoint's `index_begin_log_offset` to rebuild them.
        """
        while self.files and int(self.files[-1].path.name) >= synced_stamp:
            doomed = self.files.pop()
            log.info("dropping index file %s written after the last checkpoint", doomed.path.name)
            doomed.delete()

    def close(self) -> None:
        """Close every file."""
        for index_file in self.files:
            index_file.close()
