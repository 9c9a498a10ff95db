"""HA packets: byte layouts from the spec, round trips under any chunking, and bad input."""

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import FrameTooLargeError, ProtocolError
from ferrymq.wire.ha import (
    EpochEntry,
    MasterHandshake,
    MasterPacketDecoder,
    SlaveAck,
    SlaveHandshake,
    SlavePacketDecoder,
    Transfer,
    encode_master_handshake,
    encode_slave_ack,
    encode_slave_handshake,
    encode_transfer_header,
)

offsets = st.integers(0, 2**63 - 1)
epochs = st.integers(0, 2**31 - 1)


def _transfer_bytes(packet: Transfer) -> bytes:
    head = encode_transfer_header(
        packet.log_offset,
        packet.epoch,
        packet.epoch_start_offset,
        packet.confirm_offset,
        len(packet.body),
    )
    return head + packet.body


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def test_layouts_are_the_spec_bytes() -> None:
    assert encode_slave_handshake(SlaveHandshake(7, sync_from_last_file=True)) == struct.pack(
        ">ihhq", 1, 1, 0, 7
    )
    assert encode_slave_ack(4096) == struct.pack(">iq", 2, 4096)
    handshake = MasterHandshake(900, 3, (EpochEntry(1, 0), EpochEntry(3, 500)))
    assert encode_master_handshake(handshake) == struct.pack(
        ">iiqi" + "iq" * 2, 1, 24, 900, 3, 1, 0, 3, 500
    )
    assert encode_transfer_header(100, 3, 500, 90, 5) == struct.pack(
        ">iiqiqq", 2, 5, 100, 3, 500, 90
    )


slave_packets = st.lists(
    st.one_of(
        st.builds(SlaveHandshake, offsets, st.booleans(), st.booleans()),
        st.builds(SlaveAck, offsets),
    ),
    max_size=8,
)


@given(slave_packets, st.lists(st.integers(0, 10_000), max_size=10))
def test_slave_packets_round_trip_in_any_chunking(
    packets: list[SlaveHandshake | SlaveAck], cuts: list[int]
) -> None:
    data = b"".join(
        encode_slave_handshake(p)
        if isinstance(p, SlaveHandshake)
        else encode_slave_ack(p.ack_offset)
        for p in packets
    )
    decoder = SlavePacketDecoder()
    decoded = [p for chunk in _chunks(data, cuts) for p in decoder.feed(chunk)]
    assert decoded == packets


@st.composite
def master_handshakes(draw: st.DrawFn) -> MasterHandshake:
    entries = draw(st.lists(st.tuples(epochs, offsets), max_size=30))
    history = tuple(EpochEntry(e, s) for e, s in entries)
    last = history[-1].epoch if history else draw(epochs)
    return MasterHandshake(draw(offsets), last, history)


master_packets = st.lists(
    st.one_of(
        master_handshakes(),
        st.builds(Transfer, offsets, epochs, offsets, offsets, st.binary(max_size=300)),
    ),
    max_size=6,
)


@given(master_packets, st.lists(st.integers(0, 100_000), max_size=12))
def test_master_packets_round_trip_in_any_chunking(
    packets: list[MasterHandshake | Transfer], cuts: list[int]
) -> None:
    data = b"".join(
        encode_master_handshake(p) if isinstance(p, MasterHandshake) else _transfer_bytes(p)
        for p in packets
    )
    decoder = MasterPacketDecoder()
    decoded = [p for chunk in _chunks(data, cuts) for p in decoder.feed(chunk)]
    assert decoded == packets


def test_an_epoch_list_beyond_rocketmqs_1000_entries_decodes() -> None:
    history = tuple(EpochEntry(e, e * 10) for e in range(5000))
    packet = MasterHandshake(50_000, 4999, history)
    assert MasterPacketDecoder().feed(encode_master_handshake(packet)) == [packet]


def test_a_handshake_is_not_parsed_before_all_sixteen_bytes_arrived() -> None:
    decoder = SlavePacketDecoder()
    data = encode_slave_handshake(SlaveHandshake(2))
    assert decoder.feed(data[:12]) == []  # RocketMQ parses here, reading past the bytes it has
    assert decoder.feed(data[12:]) == [SlaveHandshake(2)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (struct.pack(">iq", 0, 5), "neither HANDSHAKE nor TRANSFER"),
        (struct.pack(">iq", 4, 5), "neither HANDSHAKE nor TRANSFER"),
        (struct.pack(">iq", -1, 5), "neither HANDSHAKE nor TRANSFER"),
        (struct.pack(">iq", 2, -5), "ackOffset is negative"),
        (struct.pack(">ihhq", 1, 2, 0, 1), "flags must be 0 or 1"),
        (struct.pack(">ihhq", 1, 0, 0, -1), "slaveBrokerId is negative"),
    ],
)
def test_bad_slave_packets_are_protocol_errors(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        SlavePacketDecoder().feed(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (struct.pack(">iiqi", 1, 13, 0, 0) + bytes(13), "is not epochs"),
        (struct.pack(">iiqi", 1, -12, 0, 0), "bodySize is negative"),
        (struct.pack(">iiqi", 1, 12, 0, 9) + struct.pack(">iq", 1, 0), "last epoch 9"),
        (struct.pack(">iiqi", 1, 12, 0, 1) + struct.pack(">iq", 1, -4), "epochStartOffset"),
        (struct.pack(">iiqiqq", 2, 0, -1, 0, 0, 0), "offset is negative"),
        (struct.pack(">iiqiqq", 2, 0, 0, 0, 0, -3), "confirmOffset is negative"),
        (struct.pack(">iiqiqq", 7, 0, 0, 0, 0, 0), "neither HANDSHAKE nor TRANSFER"),
    ],
)
def test_bad_master_packets_are_protocol_errors(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        MasterPacketDecoder().feed(data)


def test_a_body_above_the_limit_is_refused_before_it_is_buffered() -> None:
    decoder = MasterPacketDecoder(max_body_bytes=1024)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(encode_transfer_header(0, 1, 0, 0, 1025))
