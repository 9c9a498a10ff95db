"""A connection's responses outside `data_received`: from tasks and from `LaterResponse`s.

Those finished in one loop turn go out in as few writes as can be: the first at once (a lone
sync send waits for nothing), the others together at the start of the next turn (a replication
ack that commits a window of sends costs two writes, not one per send). Later responses count
as in flight for back-pressure.
"""

import asyncio
from typing import Any

from ferrymq.rpc.connection import Connection, LaterResponse
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.frame import FrameDecoder, RemotingCommand, encode_frame


class RecordingTransport:
    """Records each write call's bytes."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 4242) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.calls.append(bytes(data))

    def writelines(self, parts: list[bytes]) -> None:
        self.calls.append(b"".join(parts))


def _opaques(data: bytes) -> list[int]:
    return [c.opaque for c in FrameDecoder().feed(data)]


async def test_responses_tasks_finish_together_go_out_in_two_writes() -> None:
    loop = asyncio.get_running_loop()
    committed: list[asyncio.Future[None]] = []

    async def handler(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        if request.code == 1:
            committed.append(loop.create_future())
            await committed[-1]  # a send waiting for its replicas
        return request.make_response(0, ext_fields={"n": str(request.opaque)}, body=b"r")

    conn = Connection(handler)
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(b"".join(encode_frame(RemotingCommand(1, opaque=i)) for i in range(5)))
    assert transport.calls == []  # all five wait
    for future in committed:  # one ack commits them all
        future.set_result(None)
    for _ in range(3):
        await asyncio.sleep(0)
    assert [_opaques(call) for call in transport.calls] == [[0], [1, 2, 3, 4]]
    # a later lone response is written at once again
    conn.data_received(encode_frame(RemotingCommand(2, opaque=9)))
    assert _opaques(transport.calls[-1]) == [9]
    assert len(transport.calls) == 3


class PausableTransport(RecordingTransport):
    """Also records pause_reading/resume_reading."""

    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def reading(self) -> bool:
        return not self.paused


async def test_a_later_response_is_sent_when_its_answer_comes() -> None:
    later: dict[int, LaterResponse] = {}
    requests: dict[int, RemotingCommand] = {}

    async def handler(conn: Connection, request: RemotingCommand) -> LaterResponse:
        requests[request.opaque] = request
        later[request.opaque] = conn.answer_later(request)
        return later[request.opaque]

    def build(opaque: int, value: str) -> RemotingCommand:
        if value == "boom":
            raise ValueError("the build failed")
        return requests[opaque].make_response(0, ext_fields={"value": value})

    conn = Connection(handler, max_in_flight=2)
    transport = PausableTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(b"".join(encode_frame(RemotingCommand(1, opaque=i)) for i in range(3)))
    assert sorted(later) == [0, 1]  # the third waits for room: two are in flight
    assert not transport.reading()
    assert transport.calls == []
    later[1].send_built(lambda: build(1, "one"))
    assert sorted(later) == [0, 1, 2]  # started once one was answered
    assert transport.reading()
    responses = FrameDecoder().feed(b"".join(transport.calls))
    assert [(r.opaque, r.ext_fields["value"]) for r in responses] == [(1, "one")]
    later[0].send_built(lambda: build(0, "boom"))
    later[2].send_built(lambda: build(2, "two"))
    later[2].send_built(lambda: build(2, "again"))  # only the first answer counts
    for _ in range(3):
        await asyncio.sleep(0)
    responses = FrameDecoder().feed(b"".join(transport.calls))
    assert {r.opaque: r.code for r in responses} == {1: 0, 0: ResponseCode.SYSTEM_ERROR, 2: 0}
    assert "the build failed" in (next(r for r in responses if r.opaque == 0).remark or "")
    assert [r.ext_fields.get("value") for r in responses if r.opaque == 2] == ["two"]


async def test_a_later_response_is_dropped_when_the_connection_closed() -> None:
    later: list[LaterResponse] = []

    async def handler(conn: Connection, request: RemotingCommand) -> LaterResponse:
        later.append(conn.answer_later(request))
        return later[-1]

    conn = Connection(handler)
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(encode_frame(RemotingCommand(1, opaque=5)))
    conn.connection_lost(None)
    later[0].send(RemotingCommand(1, opaque=5, flag=1))
    await asyncio.sleep(0)
    assert transport.calls == []
