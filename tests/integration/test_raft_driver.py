"""Three Raft drivers in one process over real sockets and real files.

Elect, propose, stop the leader, a new leader serves, restart from disk (snapshot + log) and
catch up; garbage on the port does not hurt; reads, transfers and membership changes.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ferrymq.errors import NotLeaderError, ProposalDroppedError
from ferrymq.raft.config import RaftConfig
from ferrymq.raft.driver import RaftDriver
from ferrymq.rpc.connection import Connection, EncodedFrame, LaterResponse, RequestHandler
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand, encode_frame
from ferrymq.wire.raft import VoteRequest, encode_message

CONFIG = RaftConfig(tick_interval=0.02, election_ticks=10, heartbeat_ticks=1, snapshot_interval=20)


class Counter:
    """A tiny deterministic state machine: a list of applied commands."""

    def __init__(self) -> None:
        self.commands: list[bytes] = []

    def apply(self, index: int, command: bytes) -> object:
        self.commands.append(command)
        return len(self.commands)

    def snapshot(self) -> bytes:
        return json.dumps([c.decode() for c in self.commands]).encode()

    def restore(self, data: bytes) -> None:
        self.commands = [c.encode() for c in json.loads(data)]


@dataclass
class Member:
    node_id: str
    data_dir: Path
    server: RpcServer
    state: Counter = field(default_factory=Counter)
    driver: RaftDriver | None = None


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


class Cluster:
    def __init__(self, root: Path, stack: AsyncExitStack) -> None:
        self.root = root
        self.stack = stack
        self.members: dict[str, Member] = {}
        self.routers: dict[str, Router] = {}

    async def add_server(self, node_id: str) -> Member:
        router = Router(f"controller {node_id}")
        self.routers[node_id] = router
        server = RpcServer(self._dispatch(node_id))
        await server.start()
        self.stack.push_async_callback(server.close)
        member = Member(node_id, self.root / node_id, server)
        self.members[node_id] = member
        return member

    def _dispatch(self, node_id: str) -> RequestHandler:
        # The router of a member is rebuilt on restart, so the server looks it up per request.
        async def handle(
            conn: Connection, request: RemotingCommand
        ) -> RemotingCommand | EncodedFrame | LaterResponse | None:
            return await self.routers[node_id](conn, request)

        return handle

    @property
    def peers(self) -> dict[str, str]:
        return {m.node_id: m.server.address for m in self.members.values()}

    async def start(self, node_id: str, peers: dict[str, str] | None = None) -> RaftDriver:
        member = self.members[node_id]
        member.state = Counter()
        driver = RaftDriver(node_id, peers or self.peers, member.data_dir, member.state, CONFIG)
        router = Router(f"controller {node_id}")
        driver.register(router)
        self.routers[node_id] = router
        await driver.start()
        member.driver = driver
        return driver

    async def stop(self, node_id: str) -> None:
        driver = self.members[node_id].driver
        assert driver is not None
        await driver.stop()
        self.members[node_id].driver = None

    def running(self) -> list[RaftDriver]:
        return [m.driver for m in self.members.values() if m.driver is not None]

    async def leader(self, timeout: float = 10.0) -> RaftDriver:
        await wait_until(lambda: sum(d.is_leader for d in self.running()) == 1, timeout)
        return next(d for d in self.running() if d.is_leader)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with AsyncExitStack() as stack:
        local = Cluster(tmp_path, stack)
        for node_id in ("n1", "n2", "n3"):
            await local.add_server(node_id)
        for node_id in ("n1", "n2", "n3"):
            await local.start(node_id)
        try:
            yield local
        finally:
            for driver in local.running():
                await driver.stop()


async def test_elect_propose_fail_over_and_restart_from_disk(cluster: Cluster) -> None:
    leader = await cluster.leader()
    results = [await leader.propose(f"c{i}".encode(), timeout=5) for i in range(30)]
    assert results == list(range(1, 31))
    follower = next(d for d in cluster.running() if not d.is_leader)
    with pytest.raises(NotLeaderError) as not_leader:
        await follower.propose(b"nope", timeout=5)
    assert not_leader.value.leader_id == leader.node_id
    assert not_leader.value.leader_addr == cluster.peers[leader.node_id]
    assert not_leader.value.code == 2007

    old_leader_id = leader.node_id
    await cluster.stop(old_leader_id)
    new_leader = await cluster.leader()
    assert new_leader.node_id != old_leader_id
    assert await new_leader.propose(b"after-failover", timeout=5) == 31
    for i in range(25):  # past another snapshot on the survivors
        await new_leader.propose(f"d{i}".encode(), timeout=5)

    restarted = await cluster.start(old_leader_id)
    assert restarted.node.log.snapshot.index >= 20  # came back from its snapshot + log
    expected = cluster.members[new_leader.node_id].state.commands
    await wait_until(lambda: cluster.members[old_leader_id].state.commands == expected)
    assert len(expected) == 56
    assert expected[30] == b"after-failover"


async def test_read_index_and_leadership_transfer(cluster: Cluster) -> None:
    leader = await cluster.leader()
    await leader.propose(b"x", timeout=5)
    await leader.read_index(timeout=5)
    assert leader.applied_index >= 2  # the no-op and "x"
    target = next(d for d in cluster.running() if d is not leader)
    with pytest.raises(NotLeaderError):
        await target.read_index(timeout=5)
    await leader.transfer_leadership(target.node_id, timeout=5)
    assert leader.leader_id == target.node_id
    await wait_until(lambda: target.is_leader)
    assert await target.propose(b"y", timeout=5) == 2


async def test_membership_add_and_remove(cluster: Cluster) -> None:
    leader = await cluster.leader()
    await leader.propose(b"before", timeout=5)
    fourth = await cluster.add_server("n4")
    await leader.add_member("n4", fourth.server.address, timeout=5)
    existing = {k: v for k, v in cluster.peers.items() if k != "n4"}
    joined = await cluster.start("n4", existing)  # joins: not a member until the log says so
    await wait_until(lambda: fourth.state.commands == [b"before"])
    assert set(joined.members) == {"n1", "n2", "n3", "n4"}
    await leader.remove_member("n4", timeout=5)
    assert set(leader.members) == {"n1", "n2", "n3"}
    await leader.remove_member("n9", timeout=5)  # not a member: nothing to do
    with pytest.raises(ProposalDroppedError):
        await leader.transfer_leadership("n9", timeout=5)
    assert await leader.propose(b"after", timeout=5) == 2


async def test_garbage_on_the_port_does_not_hurt(cluster: Cluster) -> None:
    leader = await cluster.leader()
    host, port = cluster.peers[leader.node_id].rsplit(":", 1)
    garbage = [
        b"\x00\x00\x00\x05hello",  # a frame that does not decode
        b"GET / HTTP/1.1\r\n\r\n",
        encode_frame(RemotingCommand(code=RequestCode.RAFT_MESSAGE, body=b"\xc1\xc1")),
        encode_frame(
            RemotingCommand(
                code=RequestCode.RAFT_MESSAGE,
                body=encode_message(
                    VoteRequest(
                        term=10**6,
                        sender="mallory",
                        receiver="nobody",
                        last_log_index=0,
                        last_log_term=0,
                    )
                ),
            )
        ),
        struct.pack(">i", 2**31 - 1),  # announces a giant frame
    ]
    for payload in garbage:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(payload)
        await writer.drain()
        with pytest.raises((ConnectionError, TimeoutError, asyncio.IncompleteReadError)):
            async with asyncio.timeout(0.5):
                await reader.readexactly(1)
        writer.close()
    assert leader.is_leader
    assert await leader.propose(b"still-serving", timeout=5) == 1
