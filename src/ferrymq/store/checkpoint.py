"""The store checkpoint file: how far the store is known durable (RocketMQ `StoreCheckpoint`).

Layout: 4096 bytes, big-endian int64 fields at RocketMQ's positions, then ferrymq's own:

```
 0 physic_msg_timestamp_ms   commit log flushed up to a message stored at this time
 8 logics_msg_timestamp_ms   consume queues flushed up to this time
16 index_msg_timestamp_ms    key index flushed up to this time
24 master_flushed_log_offset
32 confirm_log_offset        replication high watermark
40 safe_log_offset           ferrymq: commit log fsynced AND consume queues and index flushed
                             for every record below this offset; recovery scans from here
48 index_file_stamp          ferrymq: name of the newest index file at that flush
56 index_begin_log_offset    ferrymq: log offset of that file's first entry
64 crc32 of bytes 0..63 (uint32)
```

Written with `write_atomic`, so a crash leaves the previous checkpoint or this one. A checkpoint
whose CRC does not match is ignored and recovery scans the whole commit log.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ferrymq.store.atomic import read_file, write_atomic

__all__ = ["CHECKPOINT_BYTES", "Checkpoint"]

CHECKPOINT_BYTES: Final = 4096
_FIELDS: Final = struct.Struct(">qqqqqqqq")
_CRC: Final = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The values of one checkpoint."""

    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    index_msg_timestamp_ms: int = 0
    master_flushed_log_offset: int = 0
    confirm_log_offset: int = 0
    safe_log_offset: int = 0
    index_file_stamp: int = 0
    index_begin_log_offset: int = 0

    def encode(self) -> bytes:
        """The 4096-byte file content."""
        fields = _FIELDS.pack(
            self.physic_msg_timestamp_ms,
            self.logics_msg_timestamp_ms,
            self.index_msg_timestamp_ms,
            self.master_flushed_log_offset,
            self.confirm_log_offset,
            self.safe_log_offset,
            self.index_file_stamp,
            self.index_begin_log_offset,
        )
        data = fields + _CRC.pack(zlib.crc32(fields))
        return data + bytes(CHECKPOINT_BYTES - len(data))

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint | None:
        """Parse file content; None when it is not a valid checkpoint."""
        if len(data) != CHECKPOINT_BYTES:
            return None
        (crc,) = _CRC.unpack_from(data, _FIELDS.size)
        if crc != zlib.crc32(data[: _FIELDS.size]):
            return None
        return cls(*_FIELDS.unpack_from(data, 0))

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        """Read the checkpoint at `path`; None when missing or invalid."""
        data = read_file(path)
        return None if data is None else cls.decode(data)

    def save(self, path: Path) -> None:
        """Replace the checkpoint at `path` atomically."""
        write_atomic(path, self.encode())
