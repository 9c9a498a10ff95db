"""A connection's responses: those tasks finish in one loop turn go out in as few writes as can be.

The first is written at once (a lone sync send waits for nothing), the others together at the
start of the next turn (a replication ack that commits a window of sends costs two writes, not
one per send).
"""

import asyncio
from typing import Any

from ferrymq.rpc.connection import Connection
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
