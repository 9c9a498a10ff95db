"""The epoch history of a replica's commit log and its file, `epochFileCheckpoint`.

Spec: reference/rocketmq-controller-spec.md section 4.4 (file format) and section 9 item 4, which
ferrymq follows instead of RocketMQ's `appendEntry`: Kafka leader-epoch semantics.

- Each entry says "bytes from `start_offset` on were written in `epoch`"; an entry ends where the
  next one starts, the last one at the log's end.
- A new epoch must be greater than the last. Entries starting at or after the new start offset are
  replaced (RocketMQ rejects a new epoch at an equal offset and its callers ignore that, so an
  empty epoch's successor inherits the wrong label).
- The file is RocketMQ's text format (count, masked CRC32 of the entry lines, `epoch-start`
  lines), written with `write_atomic` (RocketMQ: copy to `.bak`, overwrite, no fsync). A file whose
  count or CRC does not match fails to load with `StoreError`, never as an empty history.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from ferrymq.errors import StoreError
from ferrymq.store.atomic import read_file, write_atomic
from ferrymq.wire.ha import EpochEntry

__all__ = ["EPOCH_FILE_NAME", "EpochFile", "EpochHistory"]

EPOCH_FILE_NAME: Final = "epochFileCheckpoint"


class EpochHistory:
    """Epoch entries in ascending epoch and start offset; pure, no I/O."""

    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self._entries: list[EpochEntry] = []
        for entry in entries or []:
            self.assign(entry.epoch, entry.start_offset)

    def __iter__(self) -> Iterator[EpochEntry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EpochHistory) and self._entries == other._entries

    def __repr__(self) -> str:
        return f"EpochHistory({self._entries!r})"

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        """All entries, oldest first."""
        return tuple(self._entries)

    @property
    def last(self) -> EpochEntry | None:
        """The current epoch's entry."""
        return self._entries[-1] if self._entries else None

    @property
    def last_epoch(self) -> int:
        """The current epoch; -1 for an empty history."""
        return self._entries[-1].epoch if self._entries else -1

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`; returns whether anything changed.

        Raises:
            StoreError: `epoch` is below the last epoch, or equal to it at another offset.
        """
        if epoch < 0 or start_offset < 0:
            raise StoreError(f"bad epoch entry {epoch}-{start_offset}")
        last = self.last
        if last is not None:
            if epoch == last.epoch and start_offset == last.start_offset:
                return False
            if epoch <= last.epoch:
                raise StoreError(
                    f"epoch {epoch} at {start_offset} is not newer than the last epoch "
                    f"{last.epoch} at {last.start_offset}"
                )
        while self._entries and self._entries[-1].start_offset >= start_offset:
            self._entries.pop()  # no byte was written in them past `start_offset`
        self._entries.append(EpochEntry(epoch, start_offset))
        return True

    def truncate_from_offset(self, log_offset: int) -> bool:
        """Forget entries starting at or after `log_offset` (the log was cut there)."""
        keep = [e for e in self._entries if e.start_offset < log_offset]
        changed = len(keep) != len(self._entries)
        self._entries = keep
        return changed

    def truncate_from_epoch(self, epoch: int) -> bool:
        """Forget entries of `epoch` and later."""
        keep = [e for e in self._entries if e.epoch < epoch]
        changed = len(keep) != len(self._entries)
        self._entries = keep
        return changed

    def drop_before(self, log_offset: int) -> bool:
        """Forget entries that end at or before `log_offset` (retention removed their bytes)."""
        keep = [
            e
            for i, e in enumerate(self._entries)
            if i + 1 == len(self._entries) or self._entries[i + 1].start_offset > log_offset
        ]
        changed = len(keep) != len(self._entries)
        self._entries = keep
        return changed

    def end_of(self, index: int, log_end: int) -> int:
        """Where entry `index` ends: the next entry's start, or `log_end` for the last."""
        if index + 1 < len(self._entries):
            return self._entries[index + 1].start_offset
        return log_end

    def find(self, log_offset: int, log_end: int) -> tuple[EpochEntry, int] | None:
        """The entry holding `log_offset` and where it ends; None outside every entry."""
        for i, entry in enumerate(self._entries):
            end = self.end_of(i, log_end)
            if entry.start_offset <= log_offset < end:
                return entry, end
        return None

    def epoch_at(self, log_offset: int) -> int | None:
        """The epoch the byte at `log_offset` was written in (the last entry has no end)."""
        found = None
        for entry in self._entries:
            if entry.start_offset > log_offset:
                break
            found = entry.epoch
        return found


def _crc(lines: bytes) -> int:
    return zlib.crc32(lines) & 0x7FFFFFFF


def encode_epoch_file(history: EpochHistory) -> bytes:
    """RocketMQ's text layout."""
    lines = "".join(f"{e.epoch}-{e.start_offset}\n" for e in history).encode()
    return f"{len(history)}\n{_crc(lines)}\n".encode() + lines


def decode_epoch_file(data: bytes, source: str) -> EpochHistory:
    """Parse and check a file's content.

    Raises:
        StoreError: not the layout, or the count or CRC does not match.
    """
    try:
        text = data.decode()
        head, _, rest = text.partition("\n")
        crc_text, _, body = rest.partition("\n")
        count, crc = int(head), int(crc_text)
        lines = body.splitlines()
        entries = []
        for line in lines:
            epoch, _, start = line.partition("-")
            entries.append(EpochEntry(int(epoch), int(start)))
    except (UnicodeDecodeError, ValueError) as exc:
        raise StoreError(f"{source}: not an epoch file ({exc})") from None
    if count != len(entries):
        raise StoreError(f"{source}: says {count} entries, holds {len(entries)}")
    if crc != 0 and crc != _crc(body.encode()):
        raise StoreError(f"{source}: CRC mismatch")
    for before, after in itertools.pairwise(entries):
        if after.epoch <= before.epoch or after.start_offset <= before.start_offset:
            raise StoreError(f"{source}: entry {after} does not follow {before}")
    if any(e.epoch < 0 or e.start_offset < 0 for e in entries):
        raise StoreError(f"{source}: negative epoch or offset")
    return EpochHistory(entries)


class EpochFile:
    """An `EpochHistory` kept on disk: every change is written atomically before it returns."""

    def __init__(self, path: Path, history: EpochHistory) -> None:
        self.path = path
        self.history = history

    @classmethod
    def open(cls, root: Path) -> EpochFile:
        """Load `<root>/epochFileCheckpoint`; a missing file is an empty history.

        Raises:
            StoreError: the file exists but is damaged.
        """
        path = root / EPOCH_FILE_NAME
        data = read_file(path)
        if data is None:
            return cls(path, EpochHistory())
        return cls(path, decode_epoch_file(data, str(path)))

    def _save(self, changed: bool) -> bool:
        if changed:
            write_atomic(self.path, encode_epoch_file(self.history))
        return changed

    def assign(self, epoch: int, start_offset: int) -> bool:
        """`EpochHistory.assign`, persisted."""
        return self._save(self.history.assign(epoch, start_offset))

    def truncate_from_offset(self, log_offset: int) -> bool:
        """`EpochHistory.truncate_from_offset`, persisted."""
        return self._save(self.history.truncate_from_offset(log_offset))

    def truncate_from_epoch(self, epoch: int) -> bool:
        """`EpochHistory.truncate_from_epoch`, persisted."""
        return self._save(self.history.truncate_from_epoch(epoch))

    def drop_before(self, log_offset: int) -> bool:
        """`EpochHistory.drop_before`, persisted."""
        return self._save(self.history.drop_before(log_offset))

    def replace(self, entries: tuple[EpochEntry, ...]) -> None:
        """Make the history exactly `entries` (a slave copying its master's)."""
        self.history = EpochHistory(list(entries))
        write_atomic(self.path, encode_epoch_file(self.history))
