"""The slave's connection to its master: acks are cumulative, so a full socket keeps the newest."""

import asyncio
import struct
from typing import Any

from ferrymq.replication.slave import ReplicationSlave, SlaveConfig, _MasterLink
from ferrymq.wire.ha import encode_slave_ack


class Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def test_acks_held_while_the_socket_is_full_go_out_as_the_newest_one() -> None:
    slave = ReplicationSlave(None, None, SlaveConfig(broker_id=2), None)  # type: ignore[arg-type]
    link = _MasterLink(slave)
    transport = Transport()
    link.connection_made(transport)  # type: ignore[arg-type]
    (handshake,) = transport.writes
    assert struct.unpack(">ihhq", handshake) == (1, 0, 0, 2)
    link.ack(100)
    link.pause_writing()
    link.ack(200)
    link.ack(300)
    assert transport.writes[1:] == [encode_slave_ack(100)]
    link.resume_writing()
    assert transport.writes[1:] == [encode_slave_ack(100), encode_slave_ack(300)]
    link.resume_writing()  # nothing more held
    assert len(transport.writes) == 3


async def test_a_transfer_before_the_handshake_ends_the_link_with_the_reason() -> None:
    slave = ReplicationSlave(None, None, SlaveConfig(broker_id=2), None)  # type: ignore[arg-type]
    link = _MasterLink(slave)
    transport = Transport()
    link.connection_made(transport)  # type: ignore[arg-type]
    link.data_received(struct.pack(">iiqiqq", 2, 0, 0, 1, 0, 0))
    assert transport.aborted
    assert isinstance(link.ended.exception(), Exception)
    assert "TRANSFER before its HANDSHAKE" in str(link.ended.exception())
    link.connection_lost(None)  # the error that ended it stays the reason
    assert "TRANSFER before its HANDSHAKE" in str(link.ended.exception())
    await asyncio.sleep(0)
