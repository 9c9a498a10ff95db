"""Replica dumps: each stopped broker's store, read offline, as a `dump` history event.

Opened with the ordinary `Store` (so recovery runs as it would on a restart), every queue is read
one record at a time with CRC checks on; a record that fails them is dumped as `"!corrupt"`.
The epoch file is parsed line by line without the loader's own checks, so the checker sees an
epoch list exactly as written.
"""

from __future__ import annotations

from pathlib import Path

from ferrymq.chaos.history import CORRUPT_VALUE
from ferrymq.chaos.recorder import Recorder
from ferrymq.errors import CorruptRecordError, FerryError
from ferrymq.store.checkpoint import Checkpoint
from ferrymq.store.config import StoreConfig
from ferrymq.store.epochs import EPOCH_FILE_NAME
from ferrymq.store.store import GetStatus, Store
from ferrymq.wire.records import decode_record

__all__ = ["dump_store", "read_epochs"]


def read_epochs(store_dir: Path) -> list[tuple[int, int]]:
    """The (epoch, start log offset) lines of the epoch file, as written."""
    try:
        lines = (store_dir / EPOCH_FILE_NAME).read_text().splitlines()[2:]
    except (FileNotFoundError, UnicodeDecodeError):
        return []
    entries: list[tuple[int, int]] = []
    for line in lines:
        epoch, _, start = line.partition("-")
        if epoch.isdigit() and start.isdigit():
            entries.append((int(epoch), int(start)))
    return entries


def dump_store(
    recorder: Recorder,
    node: str,
    group: str,
    store_dir: Path,
    segment_bytes: int,
    topic: str,
    queue_names: dict[int, str],
) -> None:
    """Record one replica's queues, confirm offset and epochs (`f == "dump"`)."""
    checkpoint = Checkpoint.load(store_dir / "checkpoint")
    confirm = checkpoint.confirm_log_offset if checkpoint else 0
    epochs = read_epochs(store_dir)
    entries: dict[str, list[tuple[int, str, int]]] = {}
    try:
        store = Store.open(StoreConfig(root_dir=store_dir, commitlog_segment_bytes=segment_bytes))
    except FerryError as exc:
        recorder.record("observer", "fail", "dump", node=node, group=group, error=str(exc))
        return
    try:
        for queue_id, name in queue_names.items():
            rows: list[tuple[int, str, int]] = []
            high = store.max_queue_offset(topic, queue_id)
            queue_offset = store.min_queue_offset(topic, queue_id)
            while queue_offset < high:
                try:
                    result = store.get(topic, queue_id, queue_offset, 1)
                except CorruptRecordError as exc:
                    rows.append((queue_offset, CORRUPT_VALUE, exc.log_offset))
                    queue_offset += 1
                    continue
                if result.status is not GetStatus.FOUND or not result.records:
                    rows.append((queue_offset, CORRUPT_VALUE, -1))
                    queue_offset += 1
                    continue
                try:
                    record = decode_record(result.records[0], 0)
                except FerryError:
                    rows.append((queue_offset, CORRUPT_VALUE, -1))
                    queue_offset += 1
                    continue
                value = record.body.split(b" ", 1)[0].decode(errors="replace")
                rows.append((queue_offset, value, record.log_offset))
                queue_offset += 1
            entries[name] = rows
    finally:
        store.close()
    recorder.record(
        "observer",
        "ok",
        "dump",
        node=node,
        group=group,
        confirm=confirm,
        epochs=epochs,
        entries=entries,
    )
