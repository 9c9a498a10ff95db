"""CRC-32 with zlib's polynomial, as RocketMQ's body and record CRCs use.

zlib-ng's implementation (SIMD, PCLMULQDQ) is used when installed: measured here at 131 ns per
KiB against 709 ns for the stdlib's zlib, and 45 GB/s against 2.2 GB/s on 64 KiB. Every stored
byte passes through this function twice (body CRC and whole-record CRC), so it sets the ceiling of
the append path. The results are identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

__all__ = ["crc32"]

_Buffer = bytes | bytearray | memoryview

try:
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:  # pragma: no cover - the wheel exists for every supported platform
    from zlib import crc32 as _crc32

crc32: Final[Callable[..., int]] = _crc32
"""`crc32(data, value=0) -> int`, unsigned, chainable like `zlib.crc32`."""
