"""SINK_QUERY_FENCE's codec, without I/O: the request and its answer through the remoting frame."""

import pytest

from ferrymq.errors import HeaderFieldError
from ferrymq.wire.bodies import decode_body, encode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import FrameDecoder, RemotingCommand, encode_frame
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.sink import SinkFenceQueryHeader, SinkFenceState, SinkPending


def test_a_fence_query_and_its_answer_cross_the_frame_intact() -> None:
    header = SinkFenceQueryHeader(fence_id="mirror:inc-1:0")
    assert to_ext_fields(header) == {"fenceId": "mirror:inc-1:0"}
    request = RemotingCommand(
        code=RequestCode.SINK_QUERY_FENCE, opaque=7, ext_fields=to_ext_fields(header)
    )
    state = SinkFenceState(
        generation=3,
        positions={"src": {"broker-a": {"0": 12, "1": 0}}},
        run="mirror:inc-1:0/run-2",
        change="req-1",
        pending=[SinkPending("mirror:inc-1:0/run-2", 4, {"t1": {"broker-a": 2}})],
    )
    answer = request.make_response(ResponseCode.SUCCESS, body=encode_body(state))
    decoder = FrameDecoder()
    wire = encode_frame(request) + encode_frame(answer)
    # any cut of the byte stream gives the same two commands
    got = decoder.feed(wire[:5]) + decoder.feed(wire[5:40]) + decoder.feed(wire[40:])
    assert [c.code for c in got] == [9205, 0]
    assert from_ext_fields(SinkFenceQueryHeader, got[0].ext_fields) == header
    assert got[1].opaque == 7
    assert decode_body(got[1].body, SinkFenceState) == state
    # nothing recorded yet: no positions, no run
    assert decode_body(encode_body(SinkFenceState(generation=-1)), SinkFenceState).positions is None


def test_a_fence_query_without_its_fence_id_names_the_field() -> None:
    with pytest.raises(HeaderFieldError, match="fenceId"):
        from_ext_fields(SinkFenceQueryHeader, {})
