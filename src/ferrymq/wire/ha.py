"""The HA replication packets between a slave and its master: codec and incremental decoders.

Spec: reference/rocketmq-controller-spec.md section 4.1-4.2 (RocketMQ AutoSwitch HA). All
integers big-endian. One TCP connection from the slave to the master's HA port:

    slave -> master  HANDSHAKE  state=1 i32 | syncFromLastFile i16 | asyncLearner i16 | brokerId i64
                     ACK        state=2 i32 | ack offset i64
    master -> slave  HANDSHAKE  state=1 i32 | bodySize i32 | maxPhyOffset i64 | lastEpoch i32
                                | bodySize/12 x (epoch i32, startOffset i64)
                     TRANSFER   state=2 i32 | bodySize i32 | offset i64 | epoch i32
                                | epochStartOffset i64 | confirmOffset i64 | body

Where ferrymq is stricter than RocketMQ (section 9, item 12): a decoder needs a packet's full
size before it parses it (RocketMQ reads a 16-byte handshake after checking for 12), any state
other than HANDSHAKE and TRANSFER, a negative offset or size, or a body that is not whole epoch
entries is a `ProtocolError` naming the field; the epoch list has no count cap, only the byte
limit every packet body has.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from ferrymq.errors import FrameTooLargeError, ProtocolError

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "EpochEntry",
    "HAState",
    "MasterHandshake",
    "MasterPacketDecoder",
    "SlaveAck",
    "SlaveHandshake",
    "SlavePacketDecoder",
    "Transfer",
    "encode_master_handshake",
    "encode_slave_ack",
    "encode_slave_handshake",
    "encode_transfer_header",
]


class HAState(IntEnum):
    """Connection states; the ordinal travels as the first int32 of every packet."""

    READY = 0
    HANDSHAKE = 1
    TRANSFER = 2
    SUSPEND = 3
    SHUTDOWN = 4


DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
"""Largest transfer body or epoch list a decoder accepts (RocketMQ's batches are 32 KiB)."""

_STATE: Final = struct.Struct(">i")
_SLAVE_HANDSHAKE: Final = struct.Struct(">ihhq")  # 16 bytes
_SLAVE_ACK: Final = struct.Struct(">iq")  # 12 bytes
_MASTER_HANDSHAKE: Final = struct.Struct(">iiqi")  # 20 bytes
_EPOCH_ENTRY: Final = struct.Struct(">iq")  # 12 bytes
_TRANSFER: Final = struct.Struct(">iiqiqq")  # 36 bytes


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """An epoch and the log offset of its first byte."""

    epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class SlaveHandshake:
    """The slave introduces itself."""

    slave_broker_id: int
    sync_from_last_file: bool = False
    async_learner: bool = False


@dataclass(frozen=True, slots=True)
class SlaveAck:
    """The slave holds the master's log below `ack_offset`."""

    ack_offset: int


@dataclass(frozen=True, slots=True)
class MasterHandshake:
    """The master's epoch history and the end of its log."""

    max_log_offset: int
    last_epoch: int
    epochs: tuple[EpochEntry, ...]


@dataclass(frozen=True, slots=True)
class Transfer:
    """Commit-log bytes from `log_offset`, all of one epoch; a heartbeat when `body` is empty."""

    log_offset: int
    epoch: int
    epoch_start_offset: int
    confirm_offset: int
    body: bytes = b""


def encode_slave_handshake(packet: SlaveHandshake) -> bytes:
    """The 16-byte slave handshake."""
    return _SLAVE_HANDSHAKE.pack(
        HAState.HANDSHAKE,
        int(packet.sync_from_last_file),
        int(packet.async_learner),
        packet.slave_broker_id,
    )


def encode_slave_ack(ack_offset: int) -> bytes:
    """The 12-byte slave ack."""
    return _SLAVE_ACK.pack(HAState.TRANSFER, ack_offset)


def encode_master_handshake(packet: MasterHandshake) -> bytes:
    """The master handshake with every epoch entry (no count cap)."""
    body = b"".join(_EPOCH_ENTRY.pack(e.epoch, e.start_offset) for e in packet.epochs)
    head = _MASTER_HANDSHAKE.pack(
        HAState.HANDSHAKE, len(body), packet.max_log_offset, packet.last_epoch
    )
    return head + body


def encode_transfer_header(
    log_offset: int, epoch: int, epoch_start_offset: int, confirm_offset: int, body_size: int
) -> bytes:
    """The 36-byte transfer header; the body (commit-log bytes) is written after it unchanged."""
    return _TRANSFER.pack(
        HAState.TRANSFER, body_size, log_offset, epoch, epoch_start_offset, confirm_offset
    )


def _non_negative(value: int, field: str) -> int:
    if value < 0:
        raise ProtocolError(f"HA packet field {field} is negative: {value}")
    return value


class _Decoder:
    """Bytes in, whole packets out; a bad packet raises and the decoder must be dropped."""

    def __init__(self, max_body_bytes: int) -> None:
        self._buffer = bytearray()
        self._max_body = max_body_bytes

    def _body_size(self, value: int, field: str) -> int:
        _non_negative(value, field)
        if value > self._max_body:
            raise FrameTooLargeError(value, self._max_body)
        return value

    def _state(self) -> HAState | None:
        if len(self._buffer) < _STATE.size:
            return None
        (value,) = _STATE.unpack_from(self._buffer)
        if value not in (HAState.HANDSHAKE, HAState.TRANSFER):
            raise ProtocolError(f"HA packet state {value} is neither HANDSHAKE nor TRANSFER")
        return HAState(value)


class SlavePacketDecoder(_Decoder):
    """What a master reads: slave handshakes and acks."""

    def __init__(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        super().__init__(max_body_bytes)

    def feed(self, data: bytes) -> list[SlaveHandshake | SlaveAck]:
        """Add bytes; return every packet now complete."""
        self._buffer += data
        packets: list[SlaveHandshake | SlaveAck] = []
        while (state := self._state()) is not None:
            if state is HAState.HANDSHAKE:
                if len(self._buffer) < _SLAVE_HANDSHAKE.size:
                    break
                _, sync_last, learner, broker_id = _SLAVE_HANDSHAKE.unpack_from(self._buffer)
                if sync_last not in (0, 1) or learner not in (0, 1):
                    raise ProtocolError(
                        f"HA slave handshake flags must be 0 or 1, got {sync_last}, {learner}"
                    )
                packets.append(
                    SlaveHandshake(
                        _non_negative(broker_id, "slaveBrokerId"), bool(sync_last), bool(learner)
                    )
                )
                del self._buffer[: _SLAVE_HANDSHAKE.size]
            else:
                if len(self._buffer) < _SLAVE_ACK.size:
                    break
                _, offset = _SLAVE_ACK.unpack_from(self._buffer)
                packets.append(SlaveAck(_non_negative(offset, "ackOffset")))
                del self._buffer[: _SLAVE_ACK.size]
        return packets


class MasterPacketDecoder(_Decoder):
    """What a slave reads: the master handshake and transfers."""

    def __init__(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        super().__init__(max_body_bytes)

    def feed(self, data: bytes) -> list[MasterHandshake | Transfer]:
        """Add bytes; return every packet now complete."""
        self._buffer += data
        packets: list[MasterHandshake | Transfer] = []
        while (state := self._state()) is not None:
            head = _MASTER_HANDSHAKE if state is HAState.HANDSHAKE else _TRANSFER
            if len(self._buffer) < head.size:
                break
            if state is HAState.HANDSHAKE:
                _, size, max_offset, last_epoch = head.unpack_from(self._buffer)
                self._body_size(size, "bodySize")
                if size % _EPOCH_ENTRY.size:
                    raise ProtocolError(f"HA master handshake body of {size} bytes is not epochs")
                if len(self._buffer) < head.size + size:
                    break
                epochs = tuple(
                    EpochEntry(epoch, _non_negative(start, "epochStartOffset"))
                    for epoch, start in _EPOCH_ENTRY.iter_unpack(
                        bytes(self._buffer[head.size : head.size + size])
                    )
                )
                if epochs and epochs[-1].epoch != last_epoch:
                    raise ProtocolError(
                        f"HA master handshake: last epoch {last_epoch} is not the last entry's "
                        f"{epochs[-1].epoch}"
                    )
                packets.append(
                    MasterHandshake(_non_negative(max_offset, "maxPhyOffset"), last_epoch, epochs)
                )
            else:
                _, size, offset, epoch, epoch_start, confirm = head.unpack_from(self._buffer)
                self._body_size(size, "bodySize")
                if len(self._buffer) < head.size + size:
                    break
                packets.append(
                    Transfer(
                        _non_negative(offset, "offset"),
                        epoch,
                        _non_negative(epoch_start, "epochStartOffset"),
                        _non_negative(confirm, "confirmOffset"),
                        bytes(self._buffer[head.size : head.size + size]),
                    )
                )
            del self._buffer[: head.size + size]
        return packets
