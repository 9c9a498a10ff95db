"""Nemeses: faults that start, last a while, and heal, each recorded in the history.

A nemesis is a pair of steps, `begin(target)` and `end(target)`, in one table (`NEMESES`), aimed
at a role that is resolved when the fault begins (the master moves): `master` (the controllers'
choice now, else whoever says it is master), `slave` (a seeded choice among the others),
`controller-leader`, `controller-follower` (a seeded choice), `connect-leader` (the Connect
workers' leader, as they report it), `connect-follower` (a seeded choice among the other running
workers), `namesrv`, or a node name. With
several broker groups `master@broker-b` and `slave@broker-b` name another group's roles (plain
`master` and `slave`: the first group's). Faults that involve a broker's peers (strand, split,
partition-cluster) take them from its own group. Adding a fault is one table entry. In controller
mode killing or pausing the master is a failover, and `partition-cluster` cuts the master off from
the controllers and its slaves while clients still reach it (it must stop taking writes once its
lease runs out). `clock-bump` and `clock-strobe`
(the ClockNemesis, `skew.py`) move one node's clock and reset it at the end.

Every `begin` is recorded as an `info` event (`f` = the nemesis name) before or as it happens,
every `end` as an `ok`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from ferrymq.chaos import disk
from ferrymq.chaos.cluster import Cluster, Node
from ferrymq.chaos.net import Net
from ferrymq.chaos.recorder import Recorder
from ferrymq.chaos.skew import ClockNemesis
from ferrymq.chaos.workload import CLIENT_IPS
from ferrymq.errors import FerryError

__all__ = ["NEMESES", "Faults", "Nemesis"]

log = logging.getLogger(__name__)

_FREEZE_TRIES: Final = 200
_STRAND_WAIT_S: Final = 10.0
_LEADER_WAIT_S: Final = 5.0


@dataclass
class Faults:
    """What a nemesis acts on, and what is currently broken (so the end of a run can heal it)."""

    cluster: Cluster
    net: Net
    recorder: Recorder
    rng: random.Random
    down: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    full: set[str] = field(default_factory=set)
    clocks: ClockNemesis = field(init=False)
    size_ms: int | None = None
    """The size the schedule's current step gives its clock fault (None: seeded)."""

    def __post_init__(self) -> None:
        self.clocks = ClockNemesis(self.cluster.rpc, self.rng)

    async def resolve(self, target: str) -> Node | None:
        """The node a target names now."""
        role, _, group = target.partition("@")
        if role == "master":
            return (
                await self.cluster.master(group or None)
                or self.cluster.group_brokers(group or None)[0]
            )
        if role == "slave":
            slaves = [s for s in await self.cluster.slaves(group or None) if s.running]
            return self.rng.choice(slaves) if slaves else None
        if target == "namesrv":
            return self.cluster.namesrv
        if target == "controller-leader":
            return await self.cluster.controller_leader()
        if target == "controller-follower":
            followers = await self.cluster.controller_followers()
            return self.rng.choice(followers) if followers else None
        if target == "connect-leader":
            return await self._connect_leader()
        if target == "connect-follower":
            leader = await self._connect_leader()
            workers = [
                w for w in self.cluster.workers if w is not leader and w.running and not w.paused
            ]
            return self.rng.choice(workers) if workers else None
        try:
            return self.cluster.node(target)
        except KeyError:
            return None

    async def _connect_leader(self) -> Node | None:
        """The Connect leader; waits up to `_LEADER_WAIT_S` while an election runs."""
        if not self.cluster.workers:
            return None
        deadline = asyncio.get_running_loop().time() + _LEADER_WAIT_S
        while True:
            leader = await self.cluster.connect_leader()
            if leader is not None or asyncio.get_running_loop().time() > deadline:
                return leader
            await asyncio.sleep(0.5)

    def others(self, node: Node) -> list[str]:
        """Every other address: the other nodes and the clients."""
        return [n.ip for n in self.cluster.nodes if n is not node] + list(CLIENT_IPS)

    async def heal_all(self) -> None:
        """End every fault still in force: heal the network, free disks, resume, restart."""
        self.net.heal()
        for name in sorted(self.full):
            node = self.cluster.node(name)
            assert node.store_dir is not None
            disk.free_disk(node.store_dir)
        self.full.clear()
        for name in sorted(self.paused):
            self.cluster.node(name).resume()
        self.paused.clear()
        for node in self.cluster.nodes:
            if not node.running:
                await self.cluster.restart(node)
        self.down.clear()
        for address in sorted(self.clocks.skewed):
            try:
                await self.clocks.reset(address)
            except FerryError as exc:
                log.warning("clock of %s not reset: %s", address, exc)


Step = Callable[[Faults, Node], Awaitable[str]]
"""A nemesis step: does its work on a node, returns a detail line for the history."""


@dataclass(frozen=True)
class Nemesis:
    """A fault: how it begins and how it heals."""

    name: str
    begin: Step
    end: Step


async def _kill(faults: Faults, node: Node) -> str:
    node.kill()
    faults.down.add(node.name)
    return "SIGKILL"


async def _restart(faults: Faults, node: Node) -> str:
    await faults.cluster.restart(node)
    faults.down.discard(node.name)
    return f"started (start {node.starts})"


async def _pause(faults: Faults, node: Node) -> str:
    node.pause()
    faults.paused.add(node.name)
    return "SIGSTOP"


async def _resume(faults: Faults, node: Node) -> str:
    node.resume()
    faults.paused.discard(node.name)
    return "SIGCONT"


async def _isolate(faults: Faults, node: Node) -> str:
    faults.net.isolate(node.ip, faults.others(node))
    return f"{node.ip} cut off from {', '.join(faults.others(node))}"


def _peers(faults: Faults, node: Node) -> list[Node]:
    """The other brokers of the node's group."""
    return [b for b in faults.cluster.group_brokers(node.group) if b is not node]


def _servers(faults: Faults, node: Node) -> list[str]:
    """The controllers and the group's other brokers (not the NameServer, not the clients)."""
    return [n.ip for n in [*faults.cluster.controllers, *_peers(faults, node)]]


async def _cut_from_cluster(faults: Faults, node: Node) -> str:
    """The node loses the controllers and its peers; clients and the NameServer still reach it."""
    servers = _servers(faults, node)
    faults.net.isolate(node.ip, servers)
    return f"{node.ip} cut off from {', '.join(servers)} (clients still reach it)"


async def _strand(faults: Faults, node: Node) -> str:
    """Leave a lagging slave as the only live replica: the controller must not make it master.

    The slave is cut off from the other brokers (the controllers still hear it), so the master
    drops it from the SyncStateSet and goes on acknowledging with the rest; then the master and
    the other slave die. No in-sync replica is alive: the group must stay without a master (a
    controller that elects the stranded slave loses every write it missed).
    """
    cluster = faults.cluster
    peers = _peers(faults, node)
    faults.net.isolate(node.ip, [b.ip for b in peers])
    deadline = asyncio.get_running_loop().time() + _STRAND_WAIT_S
    dropped = False
    while asyncio.get_running_loop().time() < deadline:
        master = await cluster.master(node.group)
        runtime = await cluster.runtime(master) if master is not None else None
        if runtime is not None and runtime.sync_state_set is not None:
            size = len([m for m in runtime.sync_state_set.split(",") if m])
            if size < len(peers) + 1:
                dropped = True
                break
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # acknowledged writes the stranded slave does not have
    for peer in peers:
        peer.kill()
        faults.down.add(peer.name)
    return (
        f"{node.ip} cut off from its peers ({'left' if dropped else 'still in'} the "
        f"SyncStateSet), then killed {', '.join(p.name for p in peers)}"
    )


async def _unstrand(faults: Faults, node: Node) -> str:
    faults.net.heal()
    restarted = [n for n in faults.cluster.brokers if not n.running]
    for peer in restarted:
        await faults.cluster.restart(peer)
        faults.down.discard(peer.name)
    return f"healed, restarted {', '.join(p.name for p in restarted)}"


async def _split(faults: Faults, node: Node) -> str:
    """The node and another broker of its group on one side; NameServer, clients on the other."""
    partner = faults.rng.choice(_peers(faults, node))
    minority = [node.ip, partner.ip]
    majority = [ip for ip in faults.others(node) if ip != partner.ip]
    faults.net.partition([minority, majority])
    return f"{minority} | {majority}"


async def _one_way(faults: Faults, node: Node) -> str:
    """Packets from the node to everyone else are dropped (replies to it still arrive)."""
    for ip in faults.others(node):
        faults.net.drop(node.ip, ip)
    return f"{node.ip} -> * dropped"


async def _heal(faults: Faults, node: Node) -> str:
    faults.net.heal()
    return "healed"


async def _power_loss(faults: Faults, node: Node, *, torn: bool) -> str:
    """Cut the power at a moment when the node has written bytes it has not fsynced yet.

    SIGSTOP freezes the node at an instant (the moment of the power cut); if everything it
    wrote is already durable, it runs on for a few milliseconds and is frozen again, up to a
    bound. Then SIGKILL, and the disk loses what the ledger does not cover.
    """
    assert node.store_dir is not None
    store_dir, ledger = node.store_dir, faults.cluster.ledger_path
    tries = 0
    for tries in range(1, _FREEZE_TRIES + 1):  # noqa: B007  # the count is reported
        node.pause()
        written = await asyncio.to_thread(disk.written_end, store_dir)
        durable = await asyncio.to_thread(disk.durable_log_offset, ledger, store_dir)
        if written > durable:
            break
        node.resume()
        await asyncio.sleep(faults.rng.uniform(0.001, 0.01))
    node.kill()
    faults.down.add(node.name)
    cut = await asyncio.to_thread(disk.power_loss, store_dir, ledger, faults.rng, torn=torn)
    return (
        f"durable {cut.durable}, written {cut.written}, cut at {cut.cut} "
        f"(frozen {tries} times): {cut.detail}"
    )


async def _lose_unsynced(faults: Faults, node: Node) -> str:
    return await _power_loss(faults, node, torn=False)


async def _tear_tail(faults: Faults, node: Node) -> str:
    return await _power_loss(faults, node, torn=True)


async def _flip_bits(faults: Faults, node: Node) -> str:
    node.kill()
    faults.down.add(node.name)
    assert node.store_dir is not None
    cut = await asyncio.to_thread(disk.flip_bits, node.store_dir, faults.rng)
    if cut is None:
        return "nothing past the checkpoint to flip"
    return f"{cut.detail} (recovery re-checks from {cut.durable}, log ends at {cut.written})"


async def _fill(faults: Faults, node: Node) -> str:
    assert node.store_dir is not None
    filled = await asyncio.to_thread(disk.fill_disk, node.store_dir)
    faults.full.add(node.name)
    return f"filled {filled} bytes"


async def _free(faults: Faults, node: Node) -> str:
    assert node.store_dir is not None
    disk.free_disk(node.store_dir)
    faults.full.discard(node.name)
    return "freed"


async def _bump_clock(faults: Faults, node: Node) -> str:
    return await faults.clocks.bump(node.addr, faults.size_ms)


async def _strobe_clock(faults: Faults, node: Node) -> str:
    return await faults.clocks.strobe(node.addr, faults.size_ms)


async def _reset_clock(faults: Faults, node: Node) -> str:
    if not node.running:
        faults.clocks.forget(node.addr)
        return "not running (its next start has the real clock)"
    return await faults.clocks.reset(node.addr)


NEMESES: dict[str, Nemesis] = {
    n.name: n
    for n in (
        Nemesis("kill", _kill, _restart),
        Nemesis("pause", _pause, _resume),
        Nemesis("partition-isolate", _isolate, _heal),
        Nemesis("partition-split", _split, _heal),
        Nemesis("partition-one-way", _one_way, _heal),
        Nemesis("partition-cluster", _cut_from_cluster, _heal),
        Nemesis("strand-slave", _strand, _unstrand),
        Nemesis("power-loss", _lose_unsynced, _restart),
        Nemesis("torn-tail", _tear_tail, _restart),
        Nemesis("bitflip", _flip_bits, _restart),
        Nemesis("disk-full", _fill, _free),
        Nemesis("clock-bump", _bump_clock, _reset_clock),
        Nemesis("clock-strobe", _strobe_clock, _reset_clock),
    )
}
"""Every fault `ferry chaos` can inject, by name."""
