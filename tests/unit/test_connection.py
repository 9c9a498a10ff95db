"""A connection's writes outside `data_received`: responses from tasks and `LaterResponse`s,
requests from callers; and the timeouts of calls.

A lone one (nothing else in flight its way: a sync send) goes out at once; those made in one
loop turn with others in flight go out together at the start of the next turn (a replication ack
that commits a window of sends costs one write, not one per send), or sooner once 16 wait.
Later responses count as in flight for back-pressure.
"""

import asyncio
from typing import Any

import pytest

from ferrymq.errors import RequestTimeoutError
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


async def test_responses_tasks_finish_together_go_out_in_one_write() -> None:
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
    assert [_opaques(call) for call in transport.calls] == [[0, 1, 2, 3, 4]]
    # a later lone response is written at once
    conn.data_received(encode_frame(RemotingCommand(1, opaque=9)))
    assert len(transport.calls) == 1
    committed[-1].set_result(None)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [_opaques(call) for call in transport.calls] == [[0, 1, 2, 3, 4], [9]]


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
    assert transport.calls == []  # others in flight: written with this turn's others
    await asyncio.sleep(0)
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


def _connected() -> tuple[Connection, RecordingTransport]:
    conn = Connection()
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def test_a_lone_call_is_written_at_once_and_a_window_together_at_the_next_turn() -> None:
    conn, transport = _connected()
    lone = asyncio.ensure_future(conn.call(RemotingCommand(10), 5))
    await asyncio.sleep(0)
    assert len(transport.calls) == 1  # nothing else in flight: no wait for a turn
    (request,) = FrameDecoder().feed(transport.calls[0])
    conn.data_received(encode_frame(request.make_response(0)))
    assert (await lone).code == 0

    calls = [asyncio.ensure_future(conn.call(RemotingCommand(10, ext_fields={"n": str(i)}), 5))
             for i in range(5)]  # fmt: skip
    await asyncio.sleep(0)  # the five calls write: the first alone in flight, at once
    assert [len(FrameDecoder().feed(c)) for c in transport.calls[1:]] == [1]
    await asyncio.sleep(0)  # the next turn: one write of the other four, in order
    assert [len(FrameDecoder().feed(c)) for c in transport.calls[1:]] == [1, 4]
    requests = FrameDecoder().feed(b"".join(transport.calls[1:]))
    assert [r.ext_fields["n"] for r in requests] == ["0", "1", "2", "3", "4"]
    conn.data_received(b"".join(encode_frame(r.make_response(0, remark=r.ext_fields["n"]))
                                for r in reversed(requests)))  # fmt: skip
    assert [(await c).remark for c in calls] == ["0", "1", "2", "3", "4"]


async def test_deferred_writes_go_out_every_16_commands_and_a_direct_write_keeps_its_place() -> (
    None
):
    conn, transport = _connected()
    calls = [asyncio.ensure_future(conn.call(RemotingCommand(10, opaque=0, body=b"x"), 5))
             for _ in range(40)]  # fmt: skip
    await asyncio.sleep(0)
    assert [len(FrameDecoder().feed(c)) for c in transport.calls] == [1, 16, 16]
    conn.write(RemotingCommand(99))  # after the seven still waiting, not before them
    await asyncio.sleep(0)
    frames = FrameDecoder().feed(b"".join(transport.calls))
    assert len(frames) == 41
    assert [f.code for f in frames[-2:]] == [10, 99]
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)


async def test_calls_time_out_by_their_own_deadlines_with_one_timer() -> None:
    conn, transport = _connected()
    loop = asyncio.get_running_loop()
    started = loop.time()
    slow = asyncio.ensure_future(conn.call(RemotingCommand(10), 0.6))
    fast = asyncio.ensure_future(conn.call(RemotingCommand(11), 0.1))  # earlier deadline, later
    answered = asyncio.ensure_future(conn.call(RemotingCommand(12), 0.1))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    requests = {r.code: r for r in FrameDecoder().feed(b"".join(transport.calls))}
    conn.data_received(encode_frame(requests[12].make_response(0)))
    assert (await answered).code == 0
    with pytest.raises(RequestTimeoutError):
        await fast
    assert 0.08 <= loop.time() - started < 0.5  # not held back to the slow call's deadline
    assert not slow.done()
    with pytest.raises(RequestTimeoutError):
        await slow
    assert loop.time() - started >= 0.58
    assert conn._deadline_timer is None  # nothing left to time
    assert conn._pending == {}


async def test_answered_calls_leave_the_deadline_heap_in_bounded_time() -> None:
    conn, transport = _connected()
    decoder = FrameDecoder()
    for _ in range(3000):
        call = asyncio.ensure_future(conn.call(RemotingCommand(10), 30))
        await asyncio.sleep(0)
        (request,) = decoder.feed(transport.calls[-1])
        conn.data_received(encode_frame(request.make_response(0)))
        await call
    # answered calls are dropped lazily: the heap is rebuilt once they outnumber the slack
    assert len(conn._deadlines) <= 1025
    conn.connection_lost(None)
    assert conn._deadlines == []
    assert conn._deadline_timer is None
