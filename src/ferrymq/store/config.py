"""Storage engine settings: RocketMQ's `MessageStoreConfig` keys that the store uses, in snake_case.

Durations are float seconds here; the broker config converts RocketMQ's `*Millis`/hours keys once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

__all__ = ["DEFAULT_STORE_HOST", "FlushDiskType", "SegmentFill", "StoreConfig"]

DEFAULT_STORE_HOST: Final = b"\x7f\x00\x00\x01\x00\x00\x27\x8f"  # 127.0.0.1:10911


class FlushDiskType(StrEnum):
    """When an append counts as written (`flushDiskType`)."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    """Acknowledge after the write to the page cache; fsync every `flush_interval`."""
    SYNC_FLUSH = "SYNC_FLUSH"
    """Acknowledge after fsync; concurrent appends share one fsync (group commit)."""


class SegmentFill(StrEnum):
    """How a commit-log segment file is made before records land in it (`store/prepare.py`)."""

    SPARSE = "sparse"
    """Created with ftruncate when needed: blocks are allocated as data lands (RocketMQ's way)."""
    ALLOCATED = "allocated"
    """`posix_fallocate`d ahead of need: writes into it skip the per-page block reservation."""
    ZEROED = "zeroed"
    """Zero-filled and synced ahead of need (`warmMapedFileEnable`): an fsync after an append
    commits no block allocation. Costs one write of zeros per segment."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """Settings of one store."""

    root_dir: Path
    """`storePathRootDir`: consume queues, index, checkpoint, abort and lock files live here."""
    commitlog_dir: Path | None = None
    """`storePathCommitLog`; default `<root_dir>/commitlog`."""
    commitlog_segment_bytes: int = 1024 * 1024 * 1024
    """`mappedFileSizeCommitLog`."""
    consume_queue_entries: int = 300_000
    """Entries per consume-queue segment (`mappedFileSizeConsumeQueue` / 20)."""
    index_slot_count: int = 500_000
    """`maxHashSlotNum` (RocketMQ: 5,000,000; smaller by default so an index file is 42 MB)."""
    index_max_entries: int = 2_000_000
    """`maxIndexNum` (RocketMQ: 20,000,000)."""
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    segment_fill: SegmentFill = SegmentFill.SPARSE
    """How commit-log segments are made; but for SPARSE, one spare segment file is prepared
    ahead of need in the background, which costs a segment of disk."""
    flush_interval: float = 0.5
    """`flushIntervalCommitLog`: async flush period."""
    checkpoint_interval: float = 1.0
    """`flushIntervalConsumeQueue`: consume queues, index and checkpoint flush period."""
    max_message_bytes: int = 4 * 1024 * 1024
    """`maxMessageSize`: the largest body a record may carry."""
    file_reserved_hours: float = 72.0
    """`fileReservedTime`: commit-log segments older than this are deleted."""
    disk_max_used_ratio: float = 0.75
    """`diskMaxUsedSpaceRatio`: above this disk use, the oldest segments go even if young."""
    check_crc_on_read: bool = True
    """Verify each record's body CRC (and whole-record CRC) before serving it."""
    require_record_crc: bool = True
    """Recovery and replication refuse records without the whole-record CRC32 property, which
    ferrymq always writes; turn off only to open a store written without it."""
    store_host: bytes = DEFAULT_STORE_HOST
    """This broker's packed address, stored in every record and in offset message ids."""
    confirm_gated: bool = False
    """Index (and so serve) records only below the confirm offset, the replication high
    watermark: on for sync-replicated masters and slaves; off, everything appended is served."""
    unkeyed_topics: frozenset[str] = frozenset()
    """Topics whose records get consume-queue entries but no key-index entries: a server's
    internal logs that nobody looks up by key or message id."""

    @property
    def commitlog_path(self) -> Path:
        """The commit log directory."""
        return self.commitlog_dir or self.root_dir / "commitlog"

    @property
    def spare_segment_path(self) -> Path:
        """Where the spare commit-log segment is prepared: `<commit log dir>.prepared`."""
        path = self.commitlog_path
        return path.with_name(f"{path.name}.prepared")
