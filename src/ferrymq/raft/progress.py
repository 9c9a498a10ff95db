"""What a leader knows about each follower's log, and how it sends to it (etcd raft's tracker).

A follower is in one of three states:
- PROBE: the leader does not know where the follower's log matches; one AppendRequest at a time
  (until its answer or the next heartbeat answer), stepping `next_index` back on rejections by
  the follower's conflict hint.
- REPLICATE: the logs match up to `match_index`; AppendRequests are pipelined, at most
  `max_inflight_appends` unanswered, `next_index` advanced optimistically.
- SNAPSHOT: the entries the follower needs are compacted; snapshot chunks go one at a time.

Rules:
1. `match_index` never goes down; a stale answer never moves `next_index` backwards past it.
2. Pure: no I/O, no clock.
"""

from __future__ import annotations

import collections
from enum import StrEnum

__all__ = ["Progress", "ProgressState"]


class ProgressState(StrEnum):
    """How the leader sends to one follower."""

    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    """The leader's view of one member."""

    __slots__ = (
        "inflight",
        "match_index",
        "next_index",
        "pending_snapshot_index",
        "probe_sent",
        "read_seq",
        "recent_active",
        "snapshot_offset",
        "snapshot_sent",
        "state",
    )

    def __init__(self, next_index: int, match_index: int = 0) -> None:
        self.match_index = match_index
        self.next_index = next_index
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight: collections.deque[int] = collections.deque()
        self.pending_snapshot_index = 0
        self.snapshot_offset = 0
        self.snapshot_sent = False
        self.recent_active = True
        self.read_seq = 0

    def is_paused(self, max_inflight: int) -> bool:
        """Whether nothing more may be sent until an answer comes."""
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) >= max_inflight
        return self.snapshot_sent

    def maybe_update(self, index: int) -> bool:
        """The follower holds the leader's entries up to `index`; whether `match_index` moved."""
        updated = index > self.match_index
        if updated:
            self.match_index = index
            self.probe_sent = False
        self.next_index = max(self.next_index, index + 1)
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        return updated

    def maybe_decrease_to(self, rejected_index: int, probe_hint: int) -> bool:
        """The follower rejected `prev_log_index == rejected_index`; whether to resend.

        A rejection of an index at or below `match_index`, or of an AppendRequest other than the
        latest probe, is stale and ignored.
        """
        if self.state is ProgressState.REPLICATE:
            if rejected_index <= self.match_index:
                return False
            self.next_index = self.match_index + 1
            return True
        if self.next_index - 1 != rejected_index:
            return False
        self.next_index = max(min(rejected_index, probe_hint + 1), self.match_index + 1)
        self.probe_sent = False
        return True

    def become_probe(self) -> None:
        """Go back to one-at-a-time probing from just after what is known to match."""
        if self.state is ProgressState.SNAPSHOT:
            self.next_index = max(self.match_index, self.pending_snapshot_index) + 1
        else:
            self.next_index = self.match_index + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight.clear()

    def become_replicate(self) -> None:
        """Pipeline appends from just after `match_index`."""
        self.state = ProgressState.REPLICATE
        self.next_index = self.match_index + 1
        self.inflight.clear()

    def become_snapshot(self, snapshot_index: int) -> None:
        """Send the snapshot at `snapshot_index` from its first byte."""
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot_index = snapshot_index
        self.snapshot_offset = 0
        self.snapshot_sent = False
        self.inflight.clear()
