"""A store whose disk fills between a record's append and its consume-queue entry.

Run by `test_disk_full.py` in a private mount namespace (`python -m tests.system.disk_full_scenario
DIR`): the store lives on a small tmpfs mounted at DIR/store, so ENOSPC is the kernel's own. The
commit-log segment is allocated up front and the queue's first page holds exactly 204 entries, so
the 205th entry is the first write that needs a new block: the append succeeds, the index write
fails, as `make chaos` saw on a master (a queue then skipped the message: a poll-skip). Prints one
JSON line: what reads saw while the disk was full, after it was freed, and after a restart.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from ferrymq.chaos.disk import fill_disk, free_disk
from ferrymq.store.config import StoreConfig
from ferrymq.store.store import Store
from ferrymq.wire.records import BatchItem, decode_record, pack_host

TOPIC = "Full"
ENTRIES_IN_FIRST_PAGE = 4096 // 20
BORN = pack_host("127.0.0.1", 40000)


def _put(store: Store, body: bytes) -> int:
    result = store.put(TOPIC, 0, [BatchItem.of(body)], born_host=BORN, born_timestamp_ms=1)
    return result.first_queue_offset


def _read(store: Store, from_queue_offset: int) -> list[tuple[int, str]]:
    result = store.get(TOPIC, 0, from_queue_offset, 1000, max_bytes=1 << 30)
    bodies = [decode_record(r).body.decode() for r in result.records]
    return list(zip(result.queue_offsets, bodies, strict=True))


def main(workdir: Path) -> None:
    mount = workdir / "store"
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], check=True)
    config = StoreConfig(
        root_dir=mount,
        commitlog_segment_bytes=256 * 1024,
        consume_queue_entries=1024,
        flush_interval=3600.0,
        checkpoint_interval=3600.0,
    )
    outcome: dict[str, object] = {}
    store = Store.open(config)
    for i in range(ENTRIES_IN_FIRST_PAGE):
        _put(store, f"m{i}".encode())
    store.dispatch()
    segment = next((mount / "commitlog").iterdir())
    fd = os.open(segment, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, config.commitlog_segment_bytes)
    finally:
        os.close(fd)
    outcome["filled_bytes"] = fill_disk(mount)
    appended = [_put(store, f"m{i}".encode()) for i in range(ENTRIES_IN_FIRST_PAGE, 207)]
    outcome["appended_while_full"] = list(appended)
    try:
        store.dispatch()
        outcome["dispatch_raised"] = None
    except OSError as exc:
        outcome["dispatch_raised"] = str(exc)
    outcome["dispatch_error"] = str(store.dispatch_error) if store.dispatch_error else None
    outcome["read_while_full"] = _read(store, 200)
    free_disk(mount)
    appended.append(_put(store, b"m207"))
    store.dispatch()
    outcome["dispatch_error_after"] = str(store.dispatch_error) if store.dispatch_error else None
    outcome["read_after"] = _read(store, 200)
    store.close()
    with Store.open(config) as reopened:
        outcome["read_after_restart"] = _read(reopened, 200)
    subprocess.run(["umount", str(mount)], check=True)
    sys.stdout.write(json.dumps(outcome) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
