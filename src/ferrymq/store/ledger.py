"""Test-only fsync ledger: how far each store's commit log is known durable (`ferry chaos`).

`FERRYMQ_TEST_FSYNC_LEDGER=PATH` in a broker's environment makes the flusher append
a line `<store root> <log offset>` to PATH after every commit-log fsync, before any waiter of that
fsync is answered. The chaos harness simulates a power failure by cutting the commit log to the
last recorded offset (what the disk is guaranteed to hold) and keeping any amount of what
follows. The ledger itself needs no fsync: the page cache survives the SIGKILL that precedes the
cut. Unset (always, outside the chaos harness) it costs one comparison per fsync.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["record_durable"]

_PATH: Final = os.environ.get("FERRYMQ_TEST_FSYNC_LEDGER")


def record_durable(root: Path, log_offset: int) -> None:
    """Note that the commit log under `root` is durable through `log_offset`."""
    if _PATH is None:
        return
    fd = os.open(_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{root} {log_offset}\n".encode())
    finally:
        os.close(fd)
