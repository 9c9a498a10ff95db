"""Raft settings, shared by the pure node (counts of ticks, sizes) and the driver (seconds).

Defaults are chosen for failover within about two seconds on loopback, like etcd's (100 ms
heartbeat, 1 s election timeout):

- a tick every 50 ms; a heartbeat every 2 ticks (100 ms);
- an election timeout of 16 ticks (0.8 s), randomized per round in [0.8 s, 1.6 s): a follower
  that hears nothing for that long starts a pre-vote, so a dead leader is replaced after
  0.8-1.6 s plus one round trip; the leader steps down after 0.8 s without hearing a majority
  (check-quorum);
- election timeout / heartbeat = 8: several lost heartbeats or a slow event-loop turn do not
  start an election, and pre-vote keeps one that does from disturbing a healthy leader.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RaftConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RaftConfig:
    """Tunables of one Raft node and its driver."""

    tick_interval: float = 0.05
    """Seconds per tick: the node's only clock."""
    election_ticks: int = 16
    """Ticks without a leader before a follower campaigns (randomized up to twice this)."""
    heartbeat_ticks: int = 2
    """Ticks between a leader's heartbeats."""
    pre_vote: bool = True
    """Run a pre-vote round before a real election (thesis 9.6)."""
    check_quorum: bool = True
    """A leader that did not hear from a majority for an election timeout steps down; followers
    that heard from a leader that recently ignore vote requests (thesis 9.6, leader stickiness)."""
    max_entries_per_append: int = 256
    """Entries in one AppendRequest."""
    max_inflight_appends: int = 64
    """Unacknowledged AppendRequests to one follower while replicating (pipelining window)."""
    max_snapshot_chunk_bytes: int = 1 << 20
    """Bytes of snapshot in one InstallSnapshot chunk."""
    max_committed_per_ready: int = 1024
    """Committed entries handed out for applying in one Ready."""
    snapshot_interval: int = 1000
    """Applied entries between automatic snapshots (and log compactions); 0 turns them off."""
    max_inbox: int = 10_000
    """Messages from peers queued for the node; more are dropped (Raft tolerates loss)."""
    max_outbox_per_peer: int = 1_000
    """Messages queued for one peer's connection; more are dropped."""
    send_timeout: float = 1.0
    """Seconds a send to one peer may wait for its connection."""

    def __post_init__(self) -> None:
        if self.tick_interval <= 0:
            raise ValueError("tick_interval must be positive")
        if self.heartbeat_ticks < 1:
            raise ValueError("heartbeat_ticks must be at least 1")
        if self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("election_ticks must exceed heartbeat_ticks")
        for name in (
            "max_entries_per_append",
            "max_inflight_appends",
            "max_snapshot_chunk_bytes",
            "max_committed_per_ready",
            "max_inbox",
            "max_outbox_per_peer",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.snapshot_interval < 0:
            raise ValueError("snapshot_interval must not be negative")
