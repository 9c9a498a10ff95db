"""Raft message codec: round trips of every message, and only ProtocolError on bad bytes."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import NotLeaderError, ProposalDroppedError, ProtocolError
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.raft import (
    AppendRequest,
    AppendResponse,
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    decode_conf_change,
    decode_message,
    encode_conf_change,
    encode_message,
)

indexes = st.integers(0, 2**63 - 1)
small = st.integers(0, 1000)
ids = st.text(min_size=1, max_size=12)
heads = {"term": small, "sender": ids, "receiver": ids}
conf_changes = st.builds(ConfChange, st.sampled_from(ConfChangeOp), ids, st.text(max_size=30))


@st.composite
def append_requests(draw: st.DrawFn) -> AppendRequest:
    term = draw(small)
    prev_term = draw(st.integers(0, term))
    prev_index = draw(st.integers(0, 2**40))
    terms = sorted(draw(st.lists(st.integers(prev_term, term), max_size=5)))
    entries = []
    for offset, entry_term in enumerate(terms, start=1):
        kind = draw(st.sampled_from(EntryKind))
        data = (
            encode_conf_change(draw(conf_changes))
            if kind is EntryKind.CONF_CHANGE
            else draw(st.binary(max_size=20))
        )
        entries.append(Entry(entry_term, prev_index + offset, kind, data))
    return AppendRequest(
        term=term,
        sender=draw(ids),
        receiver=draw(ids),
        prev_log_index=prev_index,
        prev_log_term=prev_term,
        entries=tuple(entries),
        commit_index=draw(indexes),
    )


@st.composite
def snapshot_chunks(draw: st.DrawFn) -> InstallSnapshot:
    term = draw(small)
    chunk = draw(st.binary(max_size=30))
    offset = draw(st.integers(0, 1000))
    total = offset + len(chunk) + draw(st.sampled_from([0, 0, 7]))
    return InstallSnapshot(
        term=term,
        sender=draw(ids),
        receiver=draw(ids),
        snapshot_index=draw(indexes),
        snapshot_term=draw(st.integers(0, term)),
        members=draw(st.dictionaries(ids, st.text(max_size=20), max_size=4)),
        total_bytes=total,
        chunk_offset=offset,
        chunk=chunk,
        done=offset + len(chunk) == total,
    )


messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(
        VoteRequest,
        last_log_index=indexes,
        last_log_term=indexes,
        pre_vote=st.booleans(),
        transfer=st.booleans(),
        **heads,
    ),
    st.builds(VoteResponse, granted=st.booleans(), pre_vote=st.booleans(), **heads),
    append_requests(),
    st.builds(
        AppendResponse,
        success=st.booleans(),
        match_index=indexes,
        conflict_index=indexes,
        conflict_term=indexes,
        **heads,
    ),
    st.builds(Heartbeat, commit_index=indexes, read_seq=indexes, **heads),
    st.builds(HeartbeatResponse, read_seq=indexes, **heads),
    snapshot_chunks(),
    st.builds(
        InstallSnapshotResponse,
        snapshot_index=indexes,
        next_offset=indexes,
        done=st.booleans(),
        **heads,
    ),
    st.builds(TimeoutNow, **heads),
    st.builds(ReadIndexRequest, context=st.binary(max_size=16), **heads),
    st.builds(ReadIndexResponse, context=st.binary(max_size=16), read_index=indexes, **heads),
)


@given(messages)
def test_every_message_round_trips(message: Message) -> None:
    assert decode_message(encode_message(message)) == message


@given(messages, st.data())
def test_a_truncated_message_is_a_protocol_error(message: Message, data: st.DataObject) -> None:
    encoded = encode_message(message)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ProtocolError):
        decode_message(encoded[:cut])


@given(st.binary(max_size=200))
def test_random_bytes_raise_protocol_error_or_decode(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_message(data)


@given(messages, st.data())
def test_flipped_bytes_raise_nothing_but_protocol_error(
    message: Message, data: st.DataObject
) -> None:
    encoded = bytearray(encode_message(message))
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(ProtocolError):
        decode_message(bytes(encoded))


def _append(**changes: object) -> bytes:
    fields: dict[str, object] = {
        "term": 3,
        "sender": "a",
        "receiver": "b",
        "prev_log_index": 4,
        "prev_log_term": 2,
        "entries": (Entry(2, 5, EntryKind.COMMAND, b"x"), Entry(3, 6, EntryKind.NOOP)),
        "commit_index": 4,
    }
    fields.update(changes)
    # Encode without the constructor's checks: a peer can send anything.
    return msgspec.msgpack.encode(AppendRequest(**fields))  # type: ignore[arg-type]  # test input


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"entries": (Entry(2, 6, EntryKind.COMMAND),)}, "expected 5"),
        ({"entries": (Entry(4, 5, EntryKind.COMMAND),)}, "has term 4"),
        ({"entries": (Entry(1, 5, EntryKind.COMMAND),)}, "has term 1"),
        ({"prev_log_term": 9}, "prev_log_term above"),
        ({"entries": (Entry(3, 5, EntryKind.CONF_CHANGE, b"\xc1"),)}, "membership change"),
        ({"sender": ""}, "length"),
        ({"term": -1}, ">= 0"),
    ],
)
def test_malformed_appends_are_refused(changes: dict[str, object], reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode_message(_append(**changes))


def test_snapshot_chunks_must_fit_the_snapshot() -> None:
    base = {
        "term": 2,
        "sender": "a",
        "receiver": "b",
        "snapshot_index": 9,
        "snapshot_term": 2,
        "members": {},
        "total_bytes": 4,
        "chunk_offset": 2,
        "chunk": b"abc",
        "done": True,
    }
    with pytest.raises(ProtocolError, match="past the snapshot"):
        decode_message(encode_message(InstallSnapshot(**base)))  # type: ignore[arg-type]  # test input
    base |= {"chunk": b"ab", "done": False}
    with pytest.raises(ProtocolError, match="done flag"):
        decode_message(encode_message(InstallSnapshot(**base)))  # type: ignore[arg-type]  # test input


@given(conf_changes)
def test_membership_changes_round_trip(change: ConfChange) -> None:
    assert decode_conf_change(encode_conf_change(change)) == change


def test_raft_codes_are_ferrymq_s_own_and_errors_answer_rocketmq_codes() -> None:
    assert int(RequestCode.RAFT_MESSAGE) == 1900
    assert not 1001 <= RequestCode.RAFT_MESSAGE <= 1018
    error = NotLeaderError("n2", "127.0.0.1:9878")
    assert error.code == ResponseCode.CONTROLLER_NOT_LEADER
    assert "n2 at 127.0.0.1:9878" in error.remark
    assert ProposalDroppedError("x").code == ResponseCode.CONTROLLER_JRAFT_INTERNAL_ERROR
