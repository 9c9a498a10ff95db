"""A 3-node etcd 3.4 cluster on loopback, the peer `ferry bench controller` measures beside ours.

etcd (Debian package `etcd-server`) runs with its defaults (100 ms heartbeats, 1 s election
timeout), each node its own process on free ports with its own data directory. The bench talks to
it through etcd's JSON gateway (`/v3/kv/put`, `/v3/maintenance/status`) with httpx, so both
systems are driven by a Python client over one loopback connection per node.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ferrymq.cmd.measure import free_port

__all__ = ["EtcdCluster", "EtcdNode"]


@dataclass
class EtcdNode:
    """One etcd member."""

    name: str
    client_url: str
    peer_url: str
    data_dir: Path
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    member_id: str = ""
    args: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        """Whether its process is alive."""
        return self.process is not None and self.process.returncode is None


class EtcdCluster:
    """Start, query, kill and restart the members of one etcd cluster."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
        self.binary = binary
        self.nodes = [
            EtcdNode(
                f"e{i}",
                f"http://127.0.0.1:{free_port()}",
                f"http://127.0.0.1:{free_port()}",
                workdir / f"etcd-e{i}",
                workdir / f"etcd-e{i}.log",
            )
            for i in range(1, size + 1)
        ]
        initial = ",".join(f"{n.name}={n.peer_url}" for n in self.nodes)
        for node in self.nodes:
            node.args = [
                "--name",
                node.name,
                "--data-dir",
                str(node.data_dir),
                "--listen-client-urls",
                node.client_url,
                "--advertise-client-urls",
                node.client_url,
                "--listen-peer-urls",
                node.peer_url,
                "--initial-advertise-peer-urls",
                node.peer_url,
                "--initial-cluster",
                initial,
                "--initial-cluster-token",
                "ferry-bench",
                "--initial-cluster-state",
                "new",
            ]
        self.http = httpx.AsyncClient(timeout=2.0)

    @property
    def pids(self) -> list[int]:
        """PIDs of the running members."""
        return [n.process.pid for n in self.nodes if n.process and n.running]

    async def start(self, node: EtcdNode | None = None, *, timeout: float = 30.0) -> None:
        """Start every member (or one, after a kill: it rejoins from its data directory)."""
        for member in [node] if node else self.nodes:
            with member.log_path.open("ab") as log_file:
                member.process = await asyncio.create_subprocess_exec(
                    self.binary,
                    *member.args,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=log_file,
                )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                await self.leader()
                if node is None or await self._healthy(node):
                    return
            except (httpx.HTTPError, RuntimeError):
                pass
            if loop.time() > deadline:
                raise RuntimeError(f"etcd did not get ready; see {self.nodes[0].log_path}")
            await asyncio.sleep(0.1)

    async def _status(self, node: EtcdNode) -> dict[str, object]:
        response = await self.http.post(f"{node.client_url}/v3/maintenance/status", json={})
        response.raise_for_status()
        status: dict[str, object] = response.json()
        header = status.get("header")
        if isinstance(header, dict):
            node.member_id = str(header.get("member_id", ""))
        return status

    async def _healthy(self, node: EtcdNode) -> bool:
        status = await self._status(node)
        return bool(status.get("leader"))

    async def leader(self) -> EtcdNode:
        """The member that leads now.

        Raises:
            RuntimeError: no running member names a leader.
        """
        leader_id = ""
        for node in self.nodes:
            if not node.running:
                continue
            try:
                status = await self._status(node)
            except httpx.HTTPError:
                continue
            leader_id = str(status.get("leader", "")) or leader_id
        for node in self.nodes:
            if node.member_id and node.member_id == leader_id and node.running:
                return node
        raise RuntimeError("no etcd leader")

    async def put(self, node: EtcdNode, key: bytes, value: bytes, timeout: float = 2.0) -> None:
        """One linearizable write through `node` (a follower forwards it to the leader).

        Raises:
            httpx.HTTPError: it failed or timed out.
        """
        response = await self.http.post(
            f"{node.client_url}/v3/kv/put",
            json={
                "key": base64.b64encode(key).decode(),
                "value": base64.b64encode(value).decode(),
            },
            timeout=timeout,
        )
        response.raise_for_status()
        if "error" in response.text[:64]:
            raise httpx.HTTPError(response.text[:200])

    def kill(self, node: EtcdNode) -> None:
        """SIGKILL one member."""
        if node.process is not None and node.running:
            node.process.kill()

    async def close(self) -> None:
        """Stop every member and the HTTP client."""
        for node in self.nodes:
            if node.process is not None and node.running:
                node.process.terminate()
                try:
                    await asyncio.wait_for(node.process.wait(), 10)
                except TimeoutError:
                    node.process.kill()
                    await node.process.wait()
        await self.http.aclose()
