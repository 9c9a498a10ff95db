"""The HA replication packets between a slave and its master: codec and incremental decoders.

Spec: reference/rocketmq-controller-spec.md section 4.1-4.2 (RocketMQ AutoSwitch HA). All
integers big-endian. One TCP connection from the slave to the master's HA port:

    slave -> master  HANDSHAKE  state=1 i32 | syncFromLastFile i16 | asyncLearner i16 | brokerId i64
                     ACK        state=2 i32 | ack offset i64
    master -> slave  HANDSHAKE  state=1 i32 | bodySize i32 | maxPhyOffset i64 | lastEpoch i32
                                | bodySize/12 x (epoch i32, startOffset i64)
                     TRANSFER   state=2 i32 | bodySize i32 | offset i64 | epoch i32
                                | epochStartOffset i64 | confirmOffset i64 | body

ferrymq's own addition, when the master's broker has ACL on (RocketMQ's HA handshake carries no
credentials): the master opens with a challenge and the slave answers it after its HANDSHAKE;
the master serves nothing before a valid answer (`replication.haauth`):

    master -> slave  AUTH       state=64 i32 | nonce 32 bytes
    slave -> master  AUTH       state=64 i32 | accessKeyLen i16 | accessKey (UTF-8) | proof 32 bytes

Where ferrymq is stricter than RocketMQ (section 9, item 12): a decoder needs a packet's full
size before it parses it (RocketMQ reads a 16-byte handshake after checking for 12), any state
other than HANDSHAKE and TRANSFER, a negative offset or size, or a body that is not whole epoch
entries is a `ProtocolError` naming the field; the epoch list has no count cap, only the byte
limit every packet body has.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from ferrymq.errors import FrameTooLargeError, ProtocolError

__all__ = [
    "AUTH_STATE",
    "DEFAULT_MAX_BODY_BYTES",
    "NONCE_BYTES",
    "PROOF_BYTES",
    "AuthChallenge",
    "EpochEntry",
    "HAState",
    "MasterHandshake",
    "MasterPacketDecoder",
    "SlaveAck",
    "SlaveAuth",
    "SlaveHandshake",
    "SlavePacketDecoder",
    "Transfer",
    "encode_auth_challenge",
    "encode_master_handshake",
    "encode_slave_ack",
    "encode_slave_auth",
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

AUTH_STATE: Final = 64
"""ferrymq's own packet state: the HA authentication challenge and its answer."""
NONCE_BYTES: Final = 32
PROOF_BYTES: Final = 32
MAX_ACCESS_KEY_BYTES: Final = 256
_AUTH_CHALLENGE: Final = struct.Struct(f">i{NONCE_BYTES}s")
_SLAVE_AUTH_HEAD: Final = struct.Struct(">ih")


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


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    """The master's nonce, which the slave's proof must cover."""

    nonce: bytes


@dataclass(frozen=True, slots=True)
class SlaveAuth:
    """The slave's account and its HMAC over the master's nonce."""

    access_key: str
    proof: bytes = field(repr=False)


def encode_auth_challenge(nonce: bytes) -> bytes:
    """The master's 36-byte challenge."""
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"an HA nonce has {NONCE_BYTES} bytes")
    return _AUTH_CHALLENGE.pack(AUTH_STATE, nonce)


def encode_slave_auth(packet: SlaveAuth) -> bytes:
    """The slave's answer: its access key and proof."""
    key = packet.access_key.encode()
    if not key or len(key) > MAX_ACCESS_KEY_BYTES or len(packet.proof) != PROOF_BYTES:
        raise ValueError("an HA access key has 1-256 bytes and a proof 32")
    return _SLAVE_AUTH_HEAD.pack(AUTH_STATE, len(key)) + key + packet.proof


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

    def _state(self) -> int | None:
        if len(self._buffer) < _STATE.size:
            return None
        (value,) = _STATE.unpack_from(self._buffer)
        if value not in (HAState.HANDSHAKE, HAState.TRANSFER, AUTH_STATE):
            raise ProtocolError(
                f"HA packet state {value} is neither HANDSHAKE nor TRANSFER (nor AUTH)"
            )
        return int(value)


class SlavePacketDecoder(_Decoder):
    """What a master reads: slave handshakes and acks."""

    def __init__(self, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        super().__init__(max_body_bytes)

    def feed(self, data: bytes) -> list[SlaveHandshake | SlaveAck | SlaveAuth]:
        """Add bytes; return every packet now complete."""
        self._buffer += data
        packets: list[SlaveHandshake | SlaveAck | SlaveAuth] = []
        while (state := self._state()) is not None:
            if state == AUTH_STATE:
                if len(self._buffer) < _SLAVE_AUTH_HEAD.size:
                    break
                _, key_size = _SLAVE_AUTH_HEAD.unpack_from(self._buffer)
                if not 0 < key_size <= MAX_ACCESS_KEY_BYTES:
                    raise ProtocolError(f"HA slave auth accessKeyLen {key_size} not in 1..256")
                size = _SLAVE_AUTH_HEAD.size + key_size + PROOF_BYTES
                if len(self._buffer) < size:
                    break
                start = _SLAVE_AUTH_HEAD.size
                try:
                    key = bytes(self._buffer[start : start + key_size]).decode()
                except UnicodeDecodeError:
                    raise ProtocolError("HA slave auth accessKey is not UTF-8") from None
                packets.append(SlaveAuth(key, bytes(self._buffer[start + key_size : size])))
                del self._buffer[:size]
            elif state == HAState.HANDSHAKE:
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

    def feed(self, data: bytes) -> list[MasterHandshake | Transfer | AuthChallenge]:
        """Add bytes; return every packet now complete."""
        self._buffer += data
        packets: list[MasterHandshake | Transfer | AuthChallenge] = []
        while (state := self._state()) is not None:
            if state == AUTH_STATE:
                if len(self._buffer) < _AUTH_CHALLENGE.size:
                    break
                packets.append(AuthChallenge(_AUTH_CHALLENGE.unpack_from(self._buffer)[1]))
                del self._buffer[: _AUTH_CHALLENGE.size]
                continue
            head = _MASTER_HANDSHAKE if state == HAState.HANDSHAKE else _TRANSFER
            if len(self._buffer) < head.size:
                break
            if state == HAState.HANDSHAKE:
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
