"""Broker liveness as one controller node sees it: heartbeats, closed channels, election data.

Spec: reference/rocketmq-controller-spec.md section 1.7 (`DefaultBrokerHeartbeatManager`) and
section 9 items 8-9, which this follows instead:
- the table is local to a node and never replicated; only the leader acts on it (elections);
- time is a monotonic clock reading passed in as `now` (seconds); nothing here reads a clock;
- a heartbeat replaces the broker's epoch, max log offset and priority (RocketMQ only raises them,
  so a slave that truncated still looked ahead);
- a closed channel marks the broker dead at once but keeps its last heartbeat time, which the
  master lease needs; an entry is dropped once it can no longer matter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ferrymq.controller.config import INT32_MAX

__all__ = ["BrokerKey", "BrokerLiveInfo", "Liveness"]

BrokerKey = tuple[str, int]
"""(broker_name, broker_id)."""


@dataclass(slots=True, kw_only=True)
class BrokerLiveInfo:
    """What the last heartbeat of one broker said, and when it came."""

    cluster_name: str
    broker_name: str
    broker_id: int
    broker_addr: str
    last_heartbeat: float
    """Monotonic seconds on this node."""
    heartbeat_timeout: float
    epoch: int = -1
    """The last epoch in the broker's epoch file."""
    max_log_offset: int = -1
    confirm_log_offset: int = -1
    election_priority: int = INT32_MAX
    """Lower is preferred (`brokerElectionPriority`)."""
    channel_closed: bool = False

    def is_alive(self, now: float) -> bool:
        """Heard within its timeout, and its connection has not closed since."""
        return not self.channel_closed and now - self.last_heartbeat <= self.heartbeat_timeout

    @property
    def election_rank(self) -> tuple[int, int, int, int]:
        """Sort key of a candidate: higher epoch, then more data, then priority, then id."""
        return (-self.epoch, -self.max_log_offset, self.election_priority, self.broker_id)


class Liveness:
    """The heartbeat table of one controller node."""

    def __init__(self) -> None:
        self._brokers: dict[BrokerKey, BrokerLiveInfo] = {}
        self._first_seen: dict[str, float] = {}

    def heartbeat(self, info: BrokerLiveInfo) -> None:
        """Record a heartbeat (its `last_heartbeat` is the time it arrived)."""
        self._brokers[(info.broker_name, info.broker_id)] = info
        self._first_seen.setdefault(info.broker_name, info.last_heartbeat)

    def close_channel(self, keys: Iterable[BrokerKey]) -> list[BrokerLiveInfo]:
        """Mark brokers whose connection closed as dead; returns those that were alive."""
        closed = []
        for key in keys:
            info = self._brokers.get(key)
            if info is not None and not info.channel_closed:
                info.channel_closed = True
                closed.append(info)
        return closed

    def info(self, broker_name: str, broker_id: int) -> BrokerLiveInfo | None:
        """The last heartbeat of a broker, if this node has one."""
        return self._brokers.get((broker_name, broker_id))

    def is_alive(self, broker_name: str, broker_id: int, now: float) -> bool:
        """Whether the broker is alive (section 1.7 `isBrokerActive`)."""
        info = self._brokers.get((broker_name, broker_id))
        return info is not None and info.is_alive(now)

    def first_seen(self, broker_name: str) -> float | None:
        """When this node first heard from any broker of the group."""
        return self._first_seen.get(broker_name)

    def brokers(self) -> Iterator[BrokerLiveInfo]:
        """Every broker this node has heard from."""
        return iter(self._brokers.values())

    def forget(self, broker_name: str, broker_ids: Iterable[int] | None = None) -> None:
        """Drop brokers (all of the group when `broker_ids` is None), after CleanBrokerData."""
        if broker_ids is None:
            for key in [k for k in self._brokers if k[0] == broker_name]:
                del self._brokers[key]
            self._first_seen.pop(broker_name, None)
            return
        for broker_id in broker_ids:
            self._brokers.pop((broker_name, broker_id), None)

    def step_back(self, now: float) -> None:
        """Heartbeats dated after `now` (the clock stepped back) count as heard at `now`.

        Without this a broker heard just before a step back of X seconds would look alive for X
        more seconds (no failover when it dies). Dating them `now` only ever delays a decision
        past the real silence, never shortens the wait past a master's lease.
        """
        for info in self._brokers.values():
            info.last_heartbeat = min(info.last_heartbeat, now)
        for name, first in self._first_seen.items():
            self._first_seen[name] = min(first, now)

    def expire(self, now: float, keep_for: float) -> list[BrokerLiveInfo]:
        """Drop entries dead for longer than `keep_for` seconds past their timeout."""
        gone = [
            info
            for info in self._brokers.values()
            if now - info.last_heartbeat > info.heartbeat_timeout + keep_for
        ]
        for info in gone:
            del self._brokers[(info.broker_name, info.broker_id)]
        return gone
