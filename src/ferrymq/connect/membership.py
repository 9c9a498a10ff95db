"""Worker membership and liveness: the group `connect-<cluster>` on the config topic's broker.

Each worker heartbeats to the master of the config topic's broker group every
`heartbeatIntervalMs` with its member data (advertised URL, config offset, the assignment
generation it has applied, its process's run id) and a session timeout of seconds: the broker
drops a silent member after `sessionTimeoutMs` and a member whose connection closed at once (a
kill -9 closes it). The same round trip reads the member list, which every worker keeps as its
view of who is live.

`MemberView` (pure) turns successive readings into decisions with injected time:
- a worker is *absent since* the first reading that lacks it, and *present* again when listed;
- a broker master change (or a broker whose table is younger than the grace: `masterSinceMs`)
  restarts every absence clock, so an empty table on a new master is not taken for departures;
- `heartbeat_lost` is true when this worker has not completed a heartbeat for the session
  timeout: it must stop its own tasks (its place in the group is gone).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

__all__ = ["MemberData", "MemberView", "encode_member_data", "parse_member_data"]


class MemberData(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a worker tells the others through its heartbeat."""

    url: str
    offset: int = 0
    """Its config offset."""
    gen: int = 0
    """The assignment generation it has applied (its revoked tasks are stopped)."""
    run: str = ""
    """The worker process's run id (random at each start): a new one is a restart, whose tasks
    the leader gives again under a new generation (empty from workers of older versions)."""


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(MemberData).decode


def encode_member_data(data: MemberData) -> str:
    """The heartbeat's member-data text."""
    return _encode(data).decode()


def parse_member_data(text: str) -> MemberData | None:
    """A member's data, or None when it is not a Connect worker's."""
    try:
        return _decode(text)
    except msgspec.DecodeError:
        return None


@dataclass(slots=True)
class MemberView:
    """Live members and absence clocks, from successive member-list readings."""

    members: dict[str, MemberData] = field(default_factory=dict)
    absent_since: dict[str, float] = field(default_factory=dict)
    """Workers once seen (or named by the log) and not listed now: since when (seconds)."""
    broker_addr: str = ""
    last_heartbeat_ok: float | None = None

    def observe(
        self,
        listed: Iterable[tuple[str, str]],
        broker_addr: str,
        master_since_s: float,
        now: float,
        *,
        grace_s: float,
    ) -> None:
        """Take a reading: (client id, member data) pairs at time `now`.

        `broker_addr` answered, and its table is `master_since_s` old.
        """
        members: dict[str, MemberData] = {}
        for client_id, text in listed:
            data = parse_member_data(text)
            if data is not None:
                members[client_id] = data
        fresh_table = broker_addr != self.broker_addr or master_since_s < grace_s
        self.broker_addr = broker_addr
        for worker in list(self.absent_since):
            if worker in members:
                del self.absent_since[worker]
            elif fresh_table:
                self.absent_since[worker] = now
        for worker in self.members:
            if worker not in members and worker not in self.absent_since:
                self.absent_since[worker] = now
        self.members = members

    def expect(self, workers: Iterable[str], now: float) -> None:
        """Start absence clocks for workers the log names (a leader, task owners) not listed."""
        for worker in workers:
            if worker and worker not in self.members:
                self.absent_since.setdefault(worker, now)

    def absent_for(self, worker: str, now: float) -> float:
        """Seconds the worker has been absent (0 when listed or never expected)."""
        since = self.absent_since.get(worker)
        return 0.0 if since is None else max(0.0, now - since)

    def heartbeat_ok(self, now: float) -> None:
        """This worker's heartbeat reached the broker."""
        self.last_heartbeat_ok = now

    def heartbeat_lost(self, now: float, session_timeout_s: float) -> bool:
        """Whether this worker has been out of the group for a session timeout."""
        return self.last_heartbeat_ok is not None and now - self.last_heartbeat_ok > (
            session_timeout_s
        )
