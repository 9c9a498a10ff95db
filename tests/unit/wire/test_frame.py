"""Remoting frames: both header serializations, the incremental decoder, and bad input."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import FrameTooLargeError, ProtocolError
from ferrymq.wire.broker import encode_send_ok
from ferrymq.wire.codes import LanguageCode, RequestCode, ResponseCode, SerializeType
from ferrymq.wire.frame import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    RemotingCommand,
    decode_frame,
    encode_frame,
    encode_frame_parts,
)
from ferrymq.wire.msgid import offset_msg_id

_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)

commands = st.builds(
    RemotingCommand,
    code=st.integers(-32768, 32767),
    opaque=st.integers(-(2**31), 2**31 - 1),
    flag=st.integers(0, 3),
    remark=st.none() | _text.filter(bool),
    ext_fields=st.dictionaries(_text, _text, max_size=6),
    body=st.binary(max_size=200),
    language=st.sampled_from(LanguageCode),
    version=st.integers(0, 32767),
    serialize_type=st.sampled_from(SerializeType),
)


@given(commands)
def test_every_command_round_trips_in_its_serialize_type(cmd: RemotingCommand) -> None:
    assert decode_frame(encode_frame(cmd)[4:]) == cmd


@given(st.lists(commands, min_size=1, max_size=5), st.data())
def test_any_chunking_of_a_stream_yields_the_same_commands(
    cmds: list[RemotingCommand], data: st.DataObject
) -> None:
    stream = b"".join(encode_frame(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out += decoder.feed(stream[start:end])
    assert out == cmds
    assert decoder.buffered_bytes == 0


@given(st.binary(max_size=300))
def test_random_bytes_raise_only_protocol_error(data: bytes) -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    try:
        for cmd in decoder.feed(data):
            assert isinstance(cmd, RemotingCommand)
    except ProtocolError:
        pass


@given(commands, st.data())
def test_truncated_or_mangled_payloads_raise_only_protocol_error(
    cmd: RemotingCommand, data: st.DataObject
) -> None:
    payload = encode_frame(cmd)[4:]
    cut = data.draw(st.integers(0, len(payload)))
    flip = data.draw(st.integers(0, max(0, cut - 1)))
    mangled = bytearray(payload[:cut])
    if mangled:
        mangled[flip] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_frame(bytes(mangled))
    except ProtocolError:
        return
    assert isinstance(decoded, RemotingCommand)


def test_json_header_is_written_as_fastjson_writes_it() -> None:
    cmd = RemotingCommand(
        code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
        opaque=7,
        ext_fields={"topic": "T"},
        language=LanguageCode.JAVA,
    )
    head, body = encode_frame_parts(cmd)
    header = (
        b'{"code":105,"extFields":{"topic":"T"},"flag":0,"language":"JAVA","opaque":7,'
        b'"serializeTypeCurrentRPC":"JSON","version":479}'
    )
    assert head == struct.pack(">ii", 4 + len(header), len(header)) + header
    assert body == b""


def test_binary_header_matches_rocketmq_serializable_layout() -> None:
    cmd = RemotingCommand(
        code=10,
        language=LanguageCode.JAVA,
        version=479,
        opaque=9,
        flag=FLAG_RESPONSE,
        remark="ok",
        ext_fields={"k": "vv"},
        body=b"B",
        serialize_type=SerializeType.ROCKETMQ,
    )
    header = (
        struct.pack(">hbhii", 10, 0, 479, 9, 1)
        + struct.pack(">i", 2)
        + b"ok"
        + struct.pack(">i", 2 + 1 + 4 + 2)
        + struct.pack(">h", 1)
        + b"k"
        + struct.pack(">i", 2)
        + b"vv"
    )
    frame = struct.pack(">ii", 4 + len(header) + 1, 1 << 24 | len(header)) + header + b"B"
    assert encode_frame(cmd) == frame
    assert FrameDecoder().feed(frame) == [cmd]


def test_cpp_client_header_with_numbers_newline_and_empty_remark_decodes() -> None:
    header = (
        b'{"code":10,"language":"CPP","version":63,"opaque":3,"flag":0,"remark":"",'
        b'"extFields":{"topic":"T","defaultTopicQueueNums":4,"flag":0,"unitMode":false,'
        b'"AccessKey":""}}\n'
    )
    frame = struct.pack(">ii", 4 + len(header) + 2, len(header)) + header + b"hi"
    (cmd,) = FrameDecoder().feed(frame)
    assert cmd.language is LanguageCode.CPP
    assert cmd.version == 63
    assert cmd.ext_fields == {
        "topic": "T",
        "defaultTopicQueueNums": "4",
        "flag": "0",
        "unitMode": "false",
        "AccessKey": "",
    }
    assert cmd.body == b"hi"


def test_response_keeps_opaque_and_serialize_type_and_sets_the_flag() -> None:
    request = RemotingCommand(code=11, opaque=42, serialize_type=SerializeType.ROCKETMQ)
    response = request.make_response(0, remark="fine")
    assert (response.opaque, response.serialize_type) == (42, SerializeType.ROCKETMQ)
    assert response.is_response
    assert not response.is_oneway
    assert RemotingCommand(code=1, flag=FLAG_ONEWAY).is_oneway


def test_oversized_frame_is_refused_and_the_decoder_stays_refused() -> None:
    decoder = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameTooLargeError) as info:
        decoder.feed(struct.pack(">i", 101))
    assert (info.value.frame_bytes, info.value.limit_bytes) == (101, 100)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(encode_frame(RemotingCommand(code=1)))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (struct.pack(">i", 3), "below the minimum"),
        (struct.pack(">ii", 4, 2 << 24), "unknown serialize type"),
        (struct.pack(">ii", 8, 50) + b"{}{}", "exceeds the frame"),
        (struct.pack(">ii", 6, 2) + b"[]", "bad JSON remoting header"),
        (struct.pack(">ii", 12, 8) + b'{"code":', "bad JSON remoting header"),
        (struct.pack(">ii", 28, 24) + b'{"code":1,"language":"X"}'[:24], "bad JSON"),
        (struct.pack(">ii", 7, 1 << 24 | 3) + b"abc", "too short"),
    ],
)
def test_malformed_frames_name_what_is_wrong(payload: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        FrameDecoder().feed(payload)


def test_unknown_language_is_a_protocol_error() -> None:
    header = b'{"code":1,"language":"COBOL"}'
    frame = struct.pack(">ii", 4 + len(header), len(header)) + header
    with pytest.raises(ProtocolError, match="unknown language 'COBOL'"):
        FrameDecoder().feed(frame)


def test_unknown_request_codes_still_decode() -> None:
    frame = encode_frame(RemotingCommand(code=31999))
    assert FrameDecoder().feed(frame)[0].code == 31999


@given(
    opaque=st.integers(0, 2**31 - 1),
    log_offset=st.integers(0, 2**63 - 1),
    queue_id=st.integers(0, 2**31 - 1),
    queue_offset=st.integers(0, 2**63 - 1),
    host=st.sampled_from(
        [b"\x7f\x00\x00\x01\x00\x00\x2a\x9f", bytes(range(16)) + b"\x00\x00\x01\x00"]
    ),
)
def test_a_send_ok_frame_is_the_general_encoding_of_its_response(
    opaque: int, log_offset: int, queue_id: int, queue_offset: int, host: bytes
) -> None:
    request = RemotingCommand(code=RequestCode.SEND_MESSAGE_V2, opaque=opaque)
    msg_id = offset_msg_id(host, log_offset)
    general = request.make_response(
        ResponseCode.SUCCESS,
        ext_fields={"msgId": msg_id, "queueId": str(queue_id), "queueOffset": str(queue_offset)},
    )
    frame = encode_send_ok(opaque, msg_id, queue_id, queue_offset)
    assert frame == encode_frame(general)
    (decoded,) = FrameDecoder().feed(frame)
    assert (decoded.opaque, decoded.code, decoded.flag) == (opaque, 0, 1)
    assert decoded.ext_fields["queueOffset"] == str(queue_offset)
