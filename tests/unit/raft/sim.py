"""A deterministic, seeded simulation of a Raft cluster of pure nodes, checked after every step.

One thread, no asyncio, no clock: a priority queue of events in virtual milliseconds, all drawn
from one `random.Random(seed)`, so a seed replays bit for bit.

What it does to the cluster:
- nodes tick at slightly different rates (clock drift);
- the network delays (and so reorders), drops and duplicates messages, and partitions nodes
  (random splits, one node cut off, one-way cuts), then heals;
- nodes crash and restart from their simulated disk, which keeps exactly what the driver would
  have fsynced: a Ready's snapshot, entries and hard state are durable once processed, and a crash
  in the middle of persisting keeps the snapshot (or not), a prefix of the entries (after cutting
  the conflicting suffix) and the old hard state, and sends nothing;
- clients propose to the leaders, ask for ReadIndex reads, transfer leadership, and add and remove
  members one at a time (from a pool of ids larger than the initial cluster);
- the driver's automatic snapshots happen every few applied entries, snapshot chunks are tiny, and
  appends carry few entries, so compaction, InstallSnapshot and pipelining all run often.

What it checks, after every event (Raft paper figure 3 and thesis 6.4):
- election safety: at most one leader per term;
- log matching: an (index, term) always names the same entry, with the same previous term;
- leader completeness: a new leader's log holds every entry committed so far;
- state machine safety: every node applies the same entry at each index (a digest chain), and a
  snapshot restores the state every node had at its index;
- commit monotonic per node between restarts, and one committed term per index;
- ReadIndex: a read's index is at least every commit that happened before the read was asked;
- liveness: once faults stop, all nodes are up and the network is whole, a leader is elected and
  a new proposal is applied everywhere within a bounded virtual time.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import random
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from ferrymq.errors import NotLeaderError, ProposalDroppedError
from ferrymq.raft.config import RaftConfig
from ferrymq.raft.log import HardState, Snapshot
from ferrymq.raft.node import RaftNode, Ready, Role
from ferrymq.wire.raft import ConfChange, ConfChangeOp, Entry, Message

__all__ = ["InvariantError", "SimResult", "Simulation", "run"]

_SNAP: struct.Struct = struct.Struct(">QI")


class InvariantError(AssertionError):
    """A Raft safety or liveness property failed; the message names the seed."""


@dataclass
class Disk:
    """What survives a crash: exactly what a persist made durable."""

    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot | None = None
    entries: list[Entry] = field(default_factory=list)

    def write_snapshot(self, snapshot: Snapshot, *, reset_log: bool) -> None:
        self.snapshot = snapshot
        if reset_log:
            self.entries = []
        else:
            self.entries = [e for e in self.entries if e.index > snapshot.index]

    def append(self, entries: tuple[Entry, ...] | list[Entry], count: int | None = None) -> None:
        if not entries:
            return
        first = entries[0].index
        self.entries = [e for e in self.entries if e.index < first]
        kept = entries if count is None else entries[:count]
        self.entries.extend(kept)


class StateMachine:
    """A digest chain over every applied entry; its snapshot is the digest plus padding."""

    def __init__(self) -> None:
        self.index = 0
        self.digest = 0

    def apply(self, entry: Entry) -> int:
        self.digest = zlib.crc32(bytes([entry.kind]) + entry.data, self.digest)
        self.index = entry.index
        return self.digest

    def snapshot(self) -> bytes:
        return _SNAP.pack(self.index, self.digest) + b"p" * (self.index % 40)

    def restore(self, data: bytes) -> None:
        self.index, self.digest = _SNAP.unpack_from(data)


@dataclass
class SimNode:
    node_id: str
    disk: Disk = field(default_factory=Disk)
    node: RaftNode | None = None
    state: StateMachine = field(default_factory=StateMachine)
    tick_period: int = 10
    last_commit: int = 0
    last_role: Role = Role.FOLLOWER
    boots: int = 0


@dataclass(frozen=True)
class SimResult:
    seed: int
    events: int
    elections: int
    committed: int
    snapshots_installed: int
    crashes: int
    reads: int
    membership_changes: int


class Simulation:
    """One seeded run."""

    def __init__(self, seed: int, *, mutate: Callable[[RaftNode], None] | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        rng = self.rng
        self.mutate = mutate
        size = rng.choice((3, 3, 5))
        self.pool = [f"n{i}" for i in range(1, size + 3)]
        self.initial = {node_id: f"127.0.0.1:{9000 + i}" for i, node_id in enumerate(self.pool)}
        self.initial = dict(list(self.initial.items())[:size])
        self.addresses = {node_id: f"127.0.0.1:{9000 + i}" for i, node_id in enumerate(self.pool)}
        self.config = RaftConfig(
            election_ticks=10,
            heartbeat_ticks=rng.choice((1, 2, 3)),
            max_entries_per_append=rng.choice((1, 3, 64)),
            max_inflight_appends=rng.choice((1, 4, 64)),
            max_snapshot_chunk_bytes=rng.choice((8, 16, 1 << 20)),
            max_committed_per_ready=rng.choice((2, 1024)),
            snapshot_interval=rng.choice((4, 8, 25)),
            pre_vote=rng.random() < 0.85,
            check_quorum=rng.random() < 0.85,
        )
        self.drop_rate = rng.choice((0.0, 0.02, 0.1, 0.25))
        self.duplicate_rate = rng.choice((0.0, 0.05))
        self.max_delay = rng.choice((3, 8, 30))
        self.crash_mid_persist_rate = rng.choice((0.0, 0.05))
        self.nodes = {
            node_id: SimNode(node_id, tick_period=rng.choice((9, 10, 10, 11)))
            for node_id in self.pool
        }
        self.up: dict[str, bool] = {node_id: node_id in self.initial for node_id in self.pool}
        self.cut: set[tuple[str, str]] = set()  # (from, to) pairs that cannot talk
        self.now = 0
        self.queue: list[tuple[int, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.events = 0
        # What the checker has seen.
        self.leaders: dict[int, str] = {}
        self.entries_seen: dict[tuple[int, int], tuple[int, bytes, int]] = {}
        self.committed_terms: dict[int, int] = {}
        self.digests: dict[int, int] = {}
        self.max_committed = 0
        self.pending_reads: dict[bytes, tuple[str, int]] = {}
        self.read_counter = itertools.count()
        self.proposal_counter = itertools.count()
        self.marker: tuple[int, int] | None = None
        self.stats = {"elections": 0, "snapshots": 0, "crashes": 0, "reads": 0, "changes": 0}
        for node_id in self.initial:
            self._boot(node_id)

    # ------------------------------------------------------------------ scheduling

    def _at(self, delay: int, action: Callable[[], None]) -> None:
        heapq.heappush(self.queue, (self.now + delay, next(self.seq), action))

    def run(self, chaos_ms: int = 2500, calm_ms: int = 4000) -> SimResult:
        rng = self.rng
        for node_id in self.pool:
            self._at(rng.randrange(1, 11), functools.partial(self._tick, node_id))
        self._at(50, self._client)
        self._at(rng.randrange(100, 400), self._fault)
        self.chaos_end = chaos_ms
        while self.queue and self.now < chaos_ms:
            self._step_event()
        self._calm()
        deadline = chaos_ms + calm_ms
        while self.queue and self.now < deadline:
            self._step_event()
            if self._liveness_reached():
                break
        else:
            self._fail(
                f"liveness: no leader applied a proposal everywhere by {deadline} ms "
                f"(roles {self._roles()})"
            )
        return SimResult(
            seed=self.seed,
            events=self.events,
            elections=self.stats["elections"],
            committed=max(self.committed_terms, default=0),
            snapshots_installed=self.stats["snapshots"],
            crashes=self.stats["crashes"],
            reads=self.stats["reads"],
            membership_changes=self.stats["changes"],
        )

    def _step_event(self) -> None:
        self.now, _, action = heapq.heappop(self.queue)
        action()
        self.events += 1
        self._check_every_step()

    # ------------------------------------------------------------------ node lifecycle

    def _boot(self, node_id: str) -> None:
        sim = self.nodes[node_id]
        disk = sim.disk
        node = RaftNode(
            node_id,
            self.config,
            random.Random(self.rng.random()),
            members=self.initial,
            hard_state=disk.hard_state,
            snapshot=disk.snapshot,
            entries=list(disk.entries),
        )
        if self.mutate is not None:
            self.mutate(node)
        sim.node = node
        sim.state = StateMachine()
        if disk.snapshot is not None:
            sim.state.restore(disk.snapshot.data)
        sim.last_commit = node.commit_index
        sim.last_role = Role.FOLLOWER
        sim.boots += 1
        self.up[node_id] = True

    def _crash(self, node_id: str) -> None:
        self.nodes[node_id].node = None
        self.up[node_id] = False
        self.stats["crashes"] += 1

    def _tick(self, node_id: str) -> None:
        sim = self.nodes[node_id]
        if sim.node is not None:
            sim.node.tick()
            self._process(node_id)
        self._at(sim.tick_period, lambda: self._tick(node_id))

    # ------------------------------------------------------------------ the driver's cycle

    def _process(self, node_id: str) -> None:
        sim = self.nodes[node_id]
        for _ in range(1000):
            node = sim.node
            if node is None or not node.has_ready():
                break
            ready = node.ready()
            self._check_ready(sim, node, ready)
            if ready.must_persist and self.rng.random() < self.crash_mid_persist_rate:
                self._persist_partially(sim, ready)
                self._crash(node_id)
                return
            self._persist(sim, ready)
            for message in ready.messages:
                self._send(message)
            self._apply(sim, node, ready)
            node.advance(ready)
            if (
                self.config.snapshot_interval
                and node.applied_index - node.log.snapshot.index >= self.config.snapshot_interval
            ):
                snapshot = node.compact(node.applied_index, sim.state.snapshot())
                sim.disk.write_snapshot(snapshot, reset_log=False)
            self._observe(sim, node)
        else:
            self._fail(f"{node_id}: Ready loop did not settle")

    def _persist(self, sim: SimNode, ready: Ready) -> None:
        if ready.snapshot is not None:
            sim.disk.write_snapshot(ready.snapshot, reset_log=True)
        sim.disk.append(ready.entries)
        if ready.hard_state is not None:
            sim.disk.hard_state = ready.hard_state

    def _persist_partially(self, sim: SimNode, ready: Ready) -> None:
        if ready.snapshot is not None:
            if self.rng.random() < 0.5:
                return
            sim.disk.write_snapshot(ready.snapshot, reset_log=True)
        if ready.entries:
            sim.disk.append(ready.entries, self.rng.randrange(len(ready.entries) + 1))

    def _apply(self, sim: SimNode, node: RaftNode, ready: Ready) -> None:
        if ready.snapshot is not None:
            expected = self.digests.get(ready.snapshot.index)
            sim.state.restore(ready.snapshot.data)
            if expected is not None and expected != sim.state.digest:
                self._fail(f"{sim.node_id}: snapshot at {ready.snapshot.index} has another state")
            self.stats["snapshots"] += 1
        for entry in ready.committed:
            if entry.index != sim.state.index + 1:
                self._fail(
                    f"{sim.node_id}: applies {entry.index} after {sim.state.index} (gap or repeat)"
                )
            digest = sim.state.apply(entry)
            known = self.digests.setdefault(entry.index, digest)
            if known != digest:
                self._fail(f"{sim.node_id}: state machine safety: index {entry.index} differs")
        for read in ready.read_states:
            asked = self.pending_reads.pop(read.context, None)
            if asked is None:
                continue
            _, floor = asked
            if read.index < floor:
                self._fail(
                    f"{sim.node_id}: ReadIndex {read.index} below a commit ({floor}) made "
                    "before the read was asked"
                )
            self.stats["reads"] += 1

    # ------------------------------------------------------------------ network

    def _send(self, message: Message) -> None:
        rng = self.rng
        if (message.sender, message.receiver) in self.cut or rng.random() < self.drop_rate:
            return
        copies = 2 if rng.random() < self.duplicate_rate else 1
        for _ in range(copies):
            delay = rng.randint(1, self.max_delay)
            self._at(delay, functools.partial(self._deliver, message))

    def _deliver(self, message: Message) -> None:
        if (message.sender, message.receiver) in self.cut:
            return
        sim = self.nodes.get(message.receiver)
        if sim is None or sim.node is None:
            return
        sim.node.step(message)
        self._process(message.receiver)

    # ------------------------------------------------------------------ clients and faults

    def _leaders(self) -> list[tuple[str, RaftNode]]:
        return [
            (node_id, sim.node)
            for node_id, sim in self.nodes.items()
            if sim.node is not None and sim.node.is_leader
        ]

    def _client(self) -> None:
        if self.now >= self.chaos_end:
            return
        rng = self.rng
        for node_id, node in self._leaders():
            roll = rng.random()
            try:
                if roll < 0.7:
                    for _ in range(rng.randint(1, 3)):
                        node.propose(b"c%d" % next(self.proposal_counter))
                elif roll < 0.85:
                    context = b"r%d" % next(self.read_counter)
                    self.pending_reads[context] = (node_id, self.max_committed)
                    node.read_index(context)
                elif roll < 0.92:
                    self._change_membership(node)
                else:
                    others = sorted(m for m in node.members if m != node_id)
                    if others:
                        node.transfer_leader(rng.choice(others))
            except (NotLeaderError, ProposalDroppedError):
                pass
            self._process(node_id)
        if self.now < self.chaos_end:
            self._at(rng.randint(5, 40), self._client)

    def _change_membership(self, node: RaftNode) -> None:
        rng = self.rng
        members = node.members
        outside = [n for n in self.pool if n not in members]
        if (len(members) <= 3 or rng.random() < 0.5) and outside:
            joining = rng.choice(outside)
            node.propose_conf_change(ConfChange(ConfChangeOp.ADD, joining, self.addresses[joining]))
            self.stats["changes"] += 1
            if not self.up[joining]:
                self._boot(joining)
        elif len(members) > 1:
            leaving = rng.choice(sorted(members))
            node.propose_conf_change(ConfChange(ConfChangeOp.REMOVE, leaving))
            self.stats["changes"] += 1

    def _fault(self) -> None:
        if self.now >= self.chaos_end:
            return
        rng = self.rng
        roll = rng.random()
        booted = [n for n in self.pool if self.nodes[n].boots > 0]
        leaders = [node_id for node_id, _ in self._leaders()]
        if leaders and roll < 0.2:
            # Leader-targeted faults make elections follow each other closely (figure 8 needs it).
            target = rng.choice(leaders)
            if rng.random() < 0.5:
                self._crash(target)
            else:
                self.cut = {(target, n) for n in booted} | {(n, target) for n in booted}
        elif roll < 0.35:
            self._partition(booted)
        elif roll < 0.45:
            self.cut = set()
        elif roll < 0.6:
            live = [n for n in booted if self.up[n]]
            if live:
                victim = rng.choice(live)
                self._crash(victim)
        elif roll < 0.8:
            down = [n for n in booted if not self.up[n]]
            if down:
                self._boot(rng.choice(down))
        else:
            a, b = rng.sample(booted, 2) if len(booted) >= 2 else (booted[0], booted[0])
            self.cut.add((a, b))  # one-way cut
        if self.now < self.chaos_end:
            self._at(rng.randint(30, 300), self._fault)

    def _partition(self, booted: list[str]) -> None:
        rng = self.rng
        shuffled = list(booted)
        rng.shuffle(shuffled)
        split = rng.randint(1, max(1, len(shuffled) - 1))
        left, right = shuffled[:split], shuffled[split:]
        self.cut = {(a, b) for a in left for b in right} | {(b, a) for a in left for b in right}

    def _calm(self) -> None:
        """End of chaos: heal the network, restart every member, stop losing messages."""
        self.cut = set()
        self.drop_rate = 0.0
        self.duplicate_rate = 0.0
        self.crash_mid_persist_rate = 0.0
        for node_id in self.pool:
            if self.nodes[node_id].boots > 0 and not self.up[node_id]:
                self._boot(node_id)

    def _liveness_reached(self) -> bool:
        """Propose a marker on the leader (again if it was lost); true once all members apply it."""
        leaders = self._leaders()
        if len(leaders) != 1:
            return False
        node_id, node = leaders[0]
        marker = self.marker
        if marker is None or (marker[1] < node.term and node.log.term_at(marker[0]) != marker[1]):
            if node.lead_transferee is not None:
                return False
            try:
                index = node.propose(b"final")
            except (NotLeaderError, ProposalDroppedError):
                return False
            self.marker = (index, node.term)
            self._process(node_id)
            return False
        index, term = marker
        if self.committed_terms.get(index) != term:
            return False
        return all(
            self.nodes[member].node is not None and self.nodes[member].state.index >= index
            for member in node.members
        )

    # ------------------------------------------------------------------ invariants

    def _fail(self, what: str) -> None:
        raise InvariantError(f"seed {self.seed} at {self.now} ms: {what}")

    def _roles(self) -> dict[str, str]:
        return {
            n: (s.node.role.value + f"@{s.node.term}" if s.node else "down")
            for n, s in self.nodes.items()
            if s.boots
        }

    def _check_ready(self, sim: SimNode, node: RaftNode, ready: Ready) -> None:
        for entry in ready.entries:
            previous = node.log.term_at(entry.index - 1)
            if previous is None:
                continue
            key = (entry.index, entry.term)
            seen = self.entries_seen.setdefault(key, (entry.kind, entry.data, previous))
            if seen != (entry.kind, entry.data, previous):
                self._fail(
                    f"{sim.node_id}: log matching: ({entry.index}, {entry.term}) names two entries"
                )

    def _observe(self, sim: SimNode, node: RaftNode) -> None:
        if node.commit_index < sim.last_commit:
            self._fail(f"{sim.node_id}: commit went from {sim.last_commit} to {node.commit_index}")
        log = node.log
        for index in range(max(sim.last_commit + 1, log.first_index), node.commit_index + 1):
            term = log.term_at(index)
            assert term is not None
            known = self.committed_terms.setdefault(index, term)
            if known != term:
                self._fail(f"{sim.node_id}: index {index} committed with terms {known} and {term}")
        if log.snapshot.index:
            known = self.committed_terms.setdefault(log.snapshot.index, log.snapshot.term)
            if known != log.snapshot.term:
                self._fail(f"{sim.node_id}: snapshot {log.snapshot.index} of another term")
        self.max_committed = max(self.max_committed, node.commit_index)
        sim.last_commit = node.commit_index
        if node.role is Role.LEADER and sim.last_role is not Role.LEADER:
            self.stats["elections"] += 1
            self._check_leader_completeness(sim, node)
        sim.last_role = node.role

    def _check_leader_completeness(self, sim: SimNode, node: RaftNode) -> None:
        log = node.log
        for index, term in self.committed_terms.items():
            if index <= log.snapshot.index:
                continue
            if log.term_at(index) != term:
                self._fail(
                    f"{sim.node_id}: leader completeness: leader of term {node.term} lacks "
                    f"committed ({index}, {term})"
                )

    def _check_every_step(self) -> None:
        for node_id, sim in self.nodes.items():
            node = sim.node
            if node is None or node.role is not Role.LEADER:
                continue
            holder = self.leaders.setdefault(node.term, node_id)
            if holder != node_id:
                self._fail(f"election safety: {holder} and {node_id} both lead term {node.term}")


def run(seed: int, *, mutate: Callable[[RaftNode], None] | None = None) -> SimResult:
    """Run one seeded simulation; raises `InvariantError` naming the seed on a failure."""
    return Simulation(seed, mutate=mutate).run()


def replace_config(node: RaftNode, **changes: object) -> None:
    """Change a node's config in place (for mutation tests)."""
    node._config = dataclasses.replace(node._config, **changes)  # type: ignore[arg-type]  # test hook


if __name__ == "__main__":  # pragma: no cover - `python -m tests.unit.raft.sim FIRST COUNT`
    import sys

    first, count = (int(a) for a in sys.argv[1:3])
    for s in range(first, first + count):
        print(run(s))  # noqa: T201
