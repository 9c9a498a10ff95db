"""Message ids: the broker's offset id and the producer's unique key.

- Offset message id (`MessageDecoder.createMessageId`): the store host (4 address bytes and an
  int32 port, or 16 and 4 for IPv6) followed by the record's int64 log offset, as uppercase hex.
  It locates a record: VIEW_MESSAGE_BY_ID decodes it back.
- Unique key (`MessageClientIDSetter`, property UNIQ_KEY): IPv4 address (4), the low 16 bits of
  the PID (2), a per-process random int32 (4), milliseconds since the start of the month (4) and
  a 16-bit counter (2), as uppercase hex. The clock is passed in.
"""

from __future__ import annotations

import datetime
import random
import struct
from typing import Final

from ferrymq.errors import ProtocolError

__all__ = ["UniqueIdGenerator", "decode_offset_msg_id", "offset_msg_id"]

_I64: Final = struct.Struct(">q")


def offset_msg_id(store_host: bytes, log_offset: int) -> str:
    """The offset message id of the record stored at `log_offset` by `store_host` (packed)."""
    return (store_host + _I64.pack(log_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[bytes, int]:
    """Split an offset message id into (packed store host, log offset).

    Raises:
        ProtocolError: the id is not 32 (IPv4) or 56 (IPv6) hex digits.
    """
    if len(msg_id) not in (32, 56):
        raise ProtocolError(f"message id {msg_id!r} is not 32 or 56 hex digits")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ProtocolError(f"message id {msg_id!r} is not hex") from None
    (log_offset,) = _I64.unpack_from(raw, len(raw) - 8)
    return raw[:-8], log_offset


def _month_start_ms(now_ms: int) -> int:
    now = datetime.datetime.fromtimestamp(now_ms / 1000, tz=datetime.UTC)
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp() * 1000)


class UniqueIdGenerator:
    """Make UNIQ_KEY values in RocketMQ's layout; one per producer process."""

    def __init__(self, ipv4: bytes, pid: int, seed: int | None = None) -> None:
        if len(ipv4) != 4:
            raise ValueError("ipv4 must be 4 bytes")
        salt = random.Random(seed).getrandbits(32)
        self._fixed = (ipv4 + struct.pack(">HI", pid & 0xFFFF, salt)).hex().upper()
        self._counter = 0
        self._month_start_ms = 0
        self._next_month_ms = 0

    def next_id(self, now_ms: int) -> str:
        """Return a new unique key for a message sent at `now_ms` (epoch milliseconds)."""
        if now_ms >= self._next_month_ms or now_ms < self._month_start_ms:
            self._month_start_ms = _month_start_ms(now_ms)
            self._next_month_ms = _month_start_ms(self._month_start_ms + 32 * 86_400_000)
        self._counter = (self._counter + 1) & 0xFFFF
        span_ms = (now_ms - self._month_start_ms) & 0xFFFFFFFF
        return self._fixed + struct.pack(">IH", span_ms, self._counter).hex().upper()
