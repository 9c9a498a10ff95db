"""Three `ferry controller` processes with ACL 2.0 from their --config (issue 23).

A user created on the controllers outlives a kill -9 of the leader: the restarted node (its
Raft log on disk, then caught up) authenticates her; unsigned or wrongly signed requests are
refused NO_PERMISSION by every node, as is a Normal user's read of every password (even with
authorization off); the peers' Raft messages sign as the inner user.
"""

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import Credentials
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import GetMetaDataResponseHeader
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields

from .procs import Server, start

pytestmark = pytest.mark.system

ROOT = Credentials("root", "root-pw")
ALICE = Credentials("alice", "alice-pw")
CONFIG = "\n".join(
    [
        "authenticationEnabled=true",
        'initAuthenticationUser={"username": "root", "password": "root-pw"}',
        'innerClientAuthenticationCredentials={"accessKey": "root", "secretKey": "root-pw"}',
        "electionGracePeriodMillis=500",
    ]
)


async def _until(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g} s"
        await asyncio.sleep(0.1)


async def _code(rpc: RpcClient, address: str, code: int, body: bytes = b"") -> RemotingCommand:
    return await rpc.call(address, RemotingCommand(code=code, body=body), 5)


async def test_users_outlive_a_leader_kill_and_strangers_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "controller.properties"
    config.write_text(CONFIG)
    prefix = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
    addrs = {f"n{i}": f"{prefix}.{i}:9878" for i in (1, 2, 3)}
    peers = ",".join(f"{n}={a}" for n, a in addrs.items())

    def run(node_id: str) -> Server:
        args = ["controller", "--id", node_id, "--peers", peers]
        args += ["--data-dir", str(tmp_path / node_id), "--config", str(config)]
        return start(args, tmp_path, node_id)

    servers = {node_id: run(node_id) for node_id in addrs}
    try:
        async with RpcClient(credentials=ROOT) as root, RpcClient(credentials=ALICE) as alice:
            leader: list[str] = []

            async def one_leader() -> bool:
                found = []
                for node_id, address in addrs.items():
                    if servers[node_id].process.poll() is not None:
                        continue
                    answer = await _code(root, address, RequestCode.CONTROLLER_GET_METADATA_INFO)
                    assert answer.code == ResponseCode.SUCCESS, answer.remark
                    if from_ext_fields(GetMetaDataResponseHeader, answer.ext_fields).is_leader:
                        found.append(node_id)
                leader[:] = found
                return len(found) == 1

            await _until(one_leader, "a serving leader")
            first = leader[0]
            user = json.dumps({"username": "alice", "password": "alice-pw"}).encode()
            made = await _code(root, addrs[first], RequestCode.AUTH_CREATE_USER, user)
            assert made.code == ResponseCode.SUCCESS, made.remark

            servers[first].kill()
            await _until(one_leader, "a new leader")
            servers[first] = run(first)

            async def knows_alice() -> bool:
                answer = await _code(alice, addrs[first], RequestCode.CONTROLLER_GET_METADATA_INFO)
                return answer.code == ResponseCode.SUCCESS

            await _until(knows_alice, "the restarted node authenticating alice")
            secrets = await _code(alice, addrs[leader[0]], RequestCode.CONTROLLER_GET_AUTH)
            assert secrets.code == ResponseCode.NO_PERMISSION, "every password, to a Normal user"
            listed = await _code(root, addrs[leader[0]], RequestCode.AUTH_LIST_USER)
            assert {u["username"] for u in json.loads(listed.body)} == {"alice", "root"}
        async with RpcClient() as unsigned, RpcClient(credentials=Credentials("alice", "x")) as bad:
            for address in addrs.values():
                for rpc in (unsigned, bad):
                    answer = await _code(rpc, address, RequestCode.CONTROLLER_GET_METADATA_INFO)
                    assert answer.code == ResponseCode.NO_PERMISSION, answer.remark
    finally:
        for server in servers.values():
            server.stop()
    for server in servers.values():
        assert "root-pw" not in server.log.read_text()
