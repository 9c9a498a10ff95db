"""Raft messages between controller nodes: types and a strict codec.

One message travels as the body of one oneway remoting request, `RequestCode.RAFT_MESSAGE`, on the
controller port (ARCHITECTURE.md section 4). The body is MessagePack: an array whose first element
names the message type, then the fields in declaration order (msgspec `array_like` tagged structs).

The messages are the ones of the Raft paper and thesis (Ongaro 2014) with etcd raft's additions:

- `VoteRequest` / `VoteResponse`: RequestVote (paper 5.2), also the pre-vote round (thesis 9.6)
  when `pre_vote` is set; `transfer` marks a campaign started by `TimeoutNow`, which voters grant
  even while they still hear from a leader (thesis 3.10).
- `AppendRequest` / `AppendResponse`: AppendEntries (paper 5.3). A rejection carries a conflict
  hint (`conflict_index`, `conflict_term`) so the leader skips a whole term per round trip.
- `Heartbeat` / `HeartbeatResponse`: empty AppendEntries carrying the commit index the follower
  may use and a read sequence number that confirms leadership for ReadIndex (thesis 6.4).
- `InstallSnapshot` / `InstallSnapshotResponse`: the snapshot in chunks (paper 7), one chunk in
  flight; the response says how many bytes the follower holds.
- `TimeoutNow`: leadership transfer (thesis 3.10).
- `ReadIndexRequest` / `ReadIndexResponse`: a follower asks the leader for a read index.

Rules:
1. Sans-IO: bytes in, messages out.
2. `decode_message` raises `ProtocolError` and nothing else on any input that is not a well-formed
   message: wrong types, negative indexes, entries that do not follow `prev_log_index`, entry
   terms above the message term, a chunk past the snapshot's size, an undecodable membership
   change. The node may then trust a message's shape (not its truth: peers are trusted to run
   Raft, as in every Raft).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated, Final

import msgspec

from ferrymq.errors import ProtocolError

__all__ = [
    "MAX_SNAPSHOT_BYTES",
    "AppendRequest",
    "AppendResponse",
    "ConfChange",
    "ConfChangeOp",
    "Entry",
    "EntryKind",
    "Heartbeat",
    "HeartbeatResponse",
    "InstallSnapshot",
    "InstallSnapshotResponse",
    "Message",
    "ReadIndexRequest",
    "ReadIndexResponse",
    "TimeoutNow",
    "VoteRequest",
    "VoteResponse",
    "decode_conf_change",
    "decode_message",
    "encode_conf_change",
    "encode_message",
]

MAX_SNAPSHOT_BYTES: Final = 1 << 40
"""Largest snapshot a message may announce (the chunks themselves are bounded by the frame)."""

_MAX_INDEX: Final = (1 << 63) - 1

Index = Annotated[int, msgspec.Meta(ge=0, le=_MAX_INDEX)]
"""A log index or a term: non-negative, fits int64."""

NodeId = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
"""A controller node id (`n1`)."""

Address = Annotated[str, msgspec.Meta(max_length=1024)]
"""`host:port` of a node's controller port."""


class EntryKind(IntEnum):
    """What a log entry holds."""

    COMMAND = 0
    """A state-machine command (opaque bytes)."""
    NOOP = 1
    """The empty entry a new leader appends to commit its term (paper 5.4.2)."""
    CONF_CHANGE = 2
    """A membership change: `ConfChange` (thesis 4.1)."""


class ConfChangeOp(IntEnum):
    """Add or remove one voting member."""

    ADD = 0
    REMOVE = 1


class ConfChange(msgspec.Struct, frozen=True, array_like=True):
    """One membership change; an ADD of an existing member updates its address."""

    op: ConfChangeOp
    node_id: NodeId
    address: Address = ""


class Entry(msgspec.Struct, frozen=True, array_like=True):
    """One log entry."""

    term: Index
    index: Index
    kind: EntryKind
    data: bytes = b""


class _Message(msgspec.Struct, frozen=True, array_like=True, tag_field="type", kw_only=True):
    term: Index
    sender: NodeId
    receiver: NodeId


class VoteRequest(_Message, tag=1, frozen=True):
    """RequestVote (paper 5.2), or a pre-vote (thesis 9.6) for `term` without adopting it."""

    last_log_index: Index
    last_log_term: Index
    pre_vote: bool = False
    transfer: bool = False


class VoteResponse(_Message, tag=2, frozen=True):
    """A (pre-)vote granted or refused."""

    granted: bool
    pre_vote: bool = False


class AppendRequest(_Message, tag=3, frozen=True):
    """AppendEntries (paper 5.3): `entries` follow (`prev_log_index`, `prev_log_term`)."""

    prev_log_index: Index
    prev_log_term: Index
    entries: tuple[Entry, ...] = ()
    commit_index: Index = 0


class AppendResponse(_Message, tag=4, frozen=True):
    """The follower's answer.

    On success `match_index` is the last index known to match the leader. On rejection it is the
    `prev_log_index` that did not match, and the hint says where to probe next: the follower's
    last index whose term is at most the leader's `prev_log_term` (`conflict_index`) and its term.
    """

    success: bool
    match_index: Index
    conflict_index: Index = 0
    conflict_term: Index = 0


class Heartbeat(_Message, tag=5, frozen=True):
    """Leader liveness; `commit_index` is at most what the follower is known to hold."""

    commit_index: Index
    read_seq: Index = 0


class HeartbeatResponse(_Message, tag=6, frozen=True):
    """Echoes the heartbeat's `read_seq` (a ReadIndex leadership confirmation)."""

    read_seq: Index = 0


class InstallSnapshot(_Message, tag=7, frozen=True):
    """One chunk of the leader's snapshot (paper 7), with the membership at its index."""

    snapshot_index: Index
    snapshot_term: Index
    members: dict[NodeId, Address]
    total_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_SNAPSHOT_BYTES)]
    chunk_offset: Index
    chunk: bytes
    done: bool


class InstallSnapshotResponse(_Message, tag=8, frozen=True):
    """How many bytes of the snapshot the follower holds; `done` once it installed it."""

    snapshot_index: Index
    next_offset: Index
    done: bool = False


class TimeoutNow(_Message, tag=9, frozen=True):
    """Leadership transfer: campaign now (thesis 3.10)."""


class ReadIndexRequest(_Message, tag=10, frozen=True):
    """A follower asks the leader for a linearizable read index; `context` names the read."""

    context: bytes


class ReadIndexResponse(_Message, tag=11, frozen=True):
    """The read index for `context`: the follower may serve the read once it applied it."""

    context: bytes
    read_index: Index


Message = (
    VoteRequest
    | VoteResponse
    | AppendRequest
    | AppendResponse
    | Heartbeat
    | HeartbeatResponse
    | InstallSnapshot
    | InstallSnapshotResponse
    | TimeoutNow
    | ReadIndexRequest
    | ReadIndexResponse
)
"""Every Raft message."""

_encoder: Final = msgspec.msgpack.Encoder()
_message_decoder: Final[msgspec.msgpack.Decoder[Message]] = msgspec.msgpack.Decoder(Message)
_conf_change_decoder: Final = msgspec.msgpack.Decoder(ConfChange)


def encode_message(message: Message) -> bytes:
    """The MessagePack bytes of `message`."""
    return _encoder.encode(message)


def decode_message(data: bytes) -> Message:
    """Decode and check one message.

    Raises:
        ProtocolError: the bytes are not a well-formed Raft message; the message says why.
    """
    try:
        message = _message_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"bad Raft message: {exc}") from None
    if isinstance(message, AppendRequest):
        _check_append(message)
    elif isinstance(message, InstallSnapshot):
        _check_snapshot_chunk(message)
    return message


def _check_append(message: AppendRequest) -> None:
    if message.prev_log_term > message.term:
        raise ProtocolError("bad Raft AppendRequest: prev_log_term above the message term")
    expected_index = message.prev_log_index + 1
    previous_term = message.prev_log_term
    for entry in message.entries:
        if entry.index != expected_index:
            raise ProtocolError(
                f"bad Raft AppendRequest: entry index {entry.index}, expected {expected_index}"
            )
        if not previous_term <= entry.term <= message.term:
            raise ProtocolError(
                f"bad Raft AppendRequest: entry {entry.index} has term {entry.term}"
            )
        if entry.kind is EntryKind.CONF_CHANGE:
            decode_conf_change(entry.data)
        expected_index += 1
        previous_term = entry.term
    if expected_index - 1 > _MAX_INDEX:
        raise ProtocolError("bad Raft AppendRequest: index overflow")


def _check_snapshot_chunk(message: InstallSnapshot) -> None:
    end = message.chunk_offset + len(message.chunk)
    if end > message.total_bytes:
        raise ProtocolError("bad Raft InstallSnapshot: chunk ends past the snapshot's size")
    if message.done != (end == message.total_bytes):
        raise ProtocolError("bad Raft InstallSnapshot: done flag disagrees with the chunk's end")
    if message.snapshot_term > message.term:
        raise ProtocolError("bad Raft InstallSnapshot: snapshot term above the message term")


def encode_conf_change(change: ConfChange) -> bytes:
    """The bytes of a membership change, as a CONF_CHANGE entry carries them."""
    return _encoder.encode(change)


def decode_conf_change(data: bytes) -> ConfChange:
    """Decode a CONF_CHANGE entry's data.

    Raises:
        ProtocolError: the bytes are not a membership change.
    """
    try:
        return _conf_change_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"bad Raft membership change: {exc}") from None
