"""Disk faults on a stopped broker's store: power loss, torn tails, bit flips, a full disk.

How a power failure is simulated without lazyfs (reference §2.4): brokers run with
`FERRYMQ_TEST_FSYNC_LEDGER`, so after each commit-log fsync the flusher records how far the log is
durable (`store.ledger`), before any waiter hears of it. After a SIGKILL the page cache still holds
everything written; a power failure may lose anything the last fsync did not cover. So the commit
log is cut at a point between the ledger's durable offset and the end of the written records: at
the durable offset for a plain power cut, at any byte past it for a torn write. Everything else is
left as written: the kernel may well have written those pages back, metadata files are replaced
atomically, and consume queues and index ahead of the commit log are what recovery repairs.

Segments are fixed-size sparse files, so "cutting" zeroes from the cut to the segment's end
(truncate, then extend back: a hole) and empties later segments the same way.

Rules: never change a byte below the durable offset except in `flip_bits`, which models bit rot and
only touches the region recovery re-checks (from the checkpoint's safe offset on).
"""

from __future__ import annotations

import errno
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ferrymq.errors import ProtocolError
from ferrymq.store.checkpoint import Checkpoint
from ferrymq.wire.records import BLANK_MAGIC, decode_record, peek_record_size

__all__ = [
    "Cut",
    "durable_log_offset",
    "fill_disk",
    "flip_bits",
    "free_disk",
    "power_loss",
    "segments",
    "written_end",
]

_FILLER: Final = ".chaos-filler"
_FILL_CHUNK: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Cut:
    """What a disk fault did."""

    durable: int
    """The ledger's durable log offset (capped at the written end)."""
    written: int
    """Where the written records ended."""
    cut: int
    """Where the log now ends (durable <= cut <= written), or the flipped log offset."""
    detail: str = ""


def segments(store_dir: Path) -> list[tuple[int, Path]]:
    """The commit-log segment files, by start log offset."""
    directory = store_dir / "commitlog"
    if not directory.is_dir():
        return []
    found = [(int(p.name), p) for p in directory.iterdir() if p.name.isdigit()]
    return sorted(found)


def durable_log_offset(ledger: Path, store_dir: Path) -> int:
    """The last durable log offset the ledger holds for `store_dir` (0 when none)."""
    prefix = f"{store_dir} "
    durable = 0
    try:
        with ledger.open() as file:
            for line in file:
                if line.startswith(prefix):
                    durable = int(line[len(prefix) :])
    except FileNotFoundError:
        return 0
    return durable


def _read(store_dir: Path, log_offset: int, length: int) -> bytes:
    for start, path in reversed(segments(store_dir)):
        if start <= log_offset:
            with path.open("rb") as file:
                file.seek(log_offset - start)
                return file.read(length)
    return b""


def written_end(store_dir: Path, from_offset: int = 0) -> int:
    """The end of the last whole record, scanning from `from_offset` (a record boundary)."""
    chain = segments(store_dir)
    if not chain:
        return 0
    position = max(from_offset, chain[0][0])
    for start, path in chain:
        size = path.stat().st_size
        if position >= start + size:
            continue
        if position < start:
            position = start
        data = path.read_bytes()
        i = position - start
        while i + 8 <= size:
            try:
                total, magic = peek_record_size(data, i)
            except ProtocolError:
                return start + i
            if magic == BLANK_MAGIC:
                i = size
                break
            if i + total > size:
                return start + i
            i += total
        position = start + size
    return position


def _zero_from(store_dir: Path, log_offset: int) -> None:
    for start, path in segments(store_dir):
        size = path.stat().st_size
        if start + size <= log_offset:
            continue
        keep = max(0, log_offset - start)
        os.truncate(path, keep)
        os.truncate(path, size)


def _write(store_dir: Path, log_offset: int, data: bytes) -> None:
    for start, path in reversed(segments(store_dir)):
        if start <= log_offset:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, data, log_offset - start)
            finally:
                os.close(fd)
            return


def power_loss(store_dir: Path, ledger: Path, rng: random.Random, *, torn: bool) -> Cut:
    """Lose what the last fsync did not cover (the node must be stopped).

    With `torn`, the kept tail also ends in damage: the last kept byte flipped, or (when nothing
    un-synced was kept) a few bytes of garbage written past the cut.
    """
    written = written_end(store_dir)
    durable = min(durable_log_offset(ledger, store_dir), written)
    # a plain power cut loses everything un-synced; a torn one keeps some of it, damaged
    cut = rng.randint(durable, written) if torn else durable
    _zero_from(store_dir, cut)
    detail = f"kept {cut - durable} of {written - durable} un-synced bytes"
    if torn:
        if cut > durable:
            last = _read(store_dir, cut - 1, 1)
            _write(store_dir, cut - 1, bytes([last[0] ^ (1 << rng.randrange(8))]))
            detail += "; flipped the last kept byte"
        else:
            garbage = rng.randbytes(rng.randint(8, 64))
            _write(store_dir, cut, garbage)
            detail += f"; wrote {len(garbage)} garbage bytes past it"
    return Cut(durable, written, cut, detail)


def flip_bits(store_dir: Path, rng: random.Random) -> Cut | None:
    """Flip one bit in the body of a record recovery will re-check (from the checkpoint on).

    None when there is no such record (the checkpoint covers the whole log).
    """
    checkpoint = Checkpoint.load(store_dir / "checkpoint")
    safe = checkpoint.safe_log_offset if checkpoint else 0
    written = written_end(store_dir)
    if written <= safe:
        return None
    records: list[tuple[int, int]] = []
    position = safe
    while position < written and len(records) < 10_000:
        head = _read(store_dir, position, 8)
        try:
            total, magic = peek_record_size(head, 0)
        except ProtocolError:
            break
        if magic == BLANK_MAGIC:
            later = [s for s, _ in segments(store_dir) if s > position]
            if not later:
                break
            position = later[0]
            continue
        records.append((position, total))
        position += total
    if not records:
        return None
    log_offset, total = rng.choice(records)
    data = _read(store_dir, log_offset, total)
    try:
        body = decode_record(data, 0).body
    except ProtocolError:
        return None
    body_at = data.find(body) if body else -1
    if body_at < 0:
        return None
    target = log_offset + body_at + rng.randrange(len(body))
    byte = _read(store_dir, target, 1)[0]
    _write(store_dir, target, bytes([byte ^ (1 << rng.randrange(8))]))
    return Cut(safe, written, target, f"flipped a bit of the record at log offset {log_offset}")


def fill_disk(store_dir: Path) -> int:
    """Fill the store's filesystem with a filler file; returns the bytes it took."""
    filled = 0
    chunk = bytes(_FILL_CHUNK)
    fd = os.open(store_dir / _FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                filled += os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return filled
                chunk = bytes(len(chunk) // 2)
    finally:
        os.close(fd)


def free_disk(store_dir: Path) -> None:
    """Remove the filler file."""
    (store_dir / _FILLER).unlink(missing_ok=True)
