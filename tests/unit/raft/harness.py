"""A fake link between pure Raft nodes for rule-by-rule tests (h11's ConnectionPair, for Raft).

Messages are delivered in order and at once unless a test holds or cuts them; `advance` is
called as the driver would (after "persisting" and "sending").
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from ferrymq.raft.config import RaftConfig
from ferrymq.raft.log import HardState, Snapshot
from ferrymq.raft.node import RaftNode, ReadState, Role
from ferrymq.wire.raft import Entry, EntryKind, Message

CONFIG = RaftConfig(election_ticks=10, heartbeat_ticks=1, snapshot_interval=0)


def members(*ids: str) -> dict[str, str]:
    return {node_id: f"127.0.0.1:{9000 + i}" for i, node_id in enumerate(ids)}


def node(
    node_id: str,
    ids: Iterable[str] = ("a", "b", "c"),
    *,
    config: RaftConfig = CONFIG,
    seed: int = 0,
    term: int = 0,
    vote: str | None = None,
    log_terms: Iterable[int] = (),
    snapshot: Snapshot | None = None,
) -> RaftNode:
    """A node whose log holds NOOP-like entries of `log_terms` (index 1, 2, ...)."""
    entries = [Entry(t, i, EntryKind.COMMAND, b"e%d" % i) for i, t in enumerate(log_terms, start=1)]
    if snapshot is not None:
        entries = [Entry(e.term, e.index + snapshot.index, e.kind, e.data) for e in entries]
    return RaftNode(
        node_id,
        config,
        random.Random(seed),
        members=members(*ids),
        hard_state=HardState(term, vote, 0),
        snapshot=snapshot,
        entries=entries,
    )


def drain(n: RaftNode) -> list[Message]:
    """Take a node's Ready as the driver would (persist, send, apply) and return its messages."""
    messages: list[Message] = []
    for _ in range(100):
        if not n.has_ready():
            return messages
        ready = n.ready()
        messages.extend(ready.messages)
        n.advance(ready)
    raise AssertionError("Ready loop did not settle")


class Net:
    """Pure nodes joined by an instant, in-order link that can be cut."""

    def __init__(self, *nodes: RaftNode) -> None:
        self.nodes = {n.node_id: n for n in nodes}
        self.cut: set[str] = set()
        self.filter: Callable[[Message], bool] = lambda m: True
        self.transform: Callable[[Message], Message] = lambda m: m
        self.applied: dict[str, list[Entry]] = {n: [] for n in self.nodes}
        self.read_states: dict[str, list[ReadState]] = {n: [] for n in self.nodes}
        self.delivered: list[Message] = []

    def settle(self, max_rounds: int = 1000) -> None:
        """Deliver messages until no node has anything to do."""
        for _ in range(max_rounds):
            moved = False
            for node_id, n in self.nodes.items():
                while n.has_ready():
                    moved = True
                    ready = n.ready()
                    self.applied[node_id].extend(ready.committed)
                    self.read_states[node_id].extend(ready.read_states)
                    n.advance(ready)
                    for message in ready.messages:
                        self.deliver(message)
            if not moved:
                return
        raise AssertionError("network did not settle")

    def deliver(self, message: Message) -> None:
        if message.sender in self.cut or message.receiver in self.cut:
            return
        if not self.filter(message):
            return
        message = self.transform(message)
        target = self.nodes.get(message.receiver)
        if target is not None:
            self.delivered.append(message)
            target.step(message)

    def tick(self, times: int = 1, only: Iterable[str] | None = None) -> None:
        chosen = list(only) if only is not None else list(self.nodes)
        for _ in range(times):
            for node_id in chosen:
                self.nodes[node_id].tick()
            self.settle()

    def elect(self, node_id: str) -> RaftNode:
        """Let `node_id` time out first and win."""
        n = self.nodes[node_id]
        for _ in range(3 * CONFIG.election_ticks):
            n.tick()
            self.settle()
            if n.role is Role.LEADER:
                return n
        raise AssertionError(f"{node_id} did not win: {n.role}")

    def leader(self) -> RaftNode:
        leaders = [n for n in self.nodes.values() if n.is_leader]
        assert len(leaders) == 1, [n.node_id for n in leaders]
        return leaders[0]
