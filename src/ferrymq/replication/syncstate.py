"""The master's view of its replica group: the SyncStateSet, slave acks and the confirm offset.

Spec: reference/rocketmq-controller-spec.md sections 3.4 (shrink and expand), 4.7 (confirmOffset)
and 4.8 (sync replication); ARCHITECTURE.md section 6 items 1-2, where ferrymq has one mode:

- confirm offset = min over the SyncStateSet of what each member holds (the master holds its
  whole log); while any member other than the master has not acked since it joined or
  reconnected, the confirm offset stays where it was (RocketMQ #6662). It never goes down.
- a send is committed when the confirm offset passes its end; writes are refused while the set
  has fewer than `min_in_sync_replicas` members.
- shrink: a member that has not been caught up for `max_lag_seconds` leaves the set; expand: a
  slave whose ack reaches the confirm offset joins.
- caught up (seed 001): each transfer to a slave records the master's log end at that moment
  (lastMasterMaxOffset) and the time (lastTransferTimeMs); an ack that reaches the end recorded
  at a transfer makes the slave caught up as of that transfer's time, and one that reaches the
  master's end when it arrives, as of now. Under steady load the end has always moved on by the
  time an ack arrives, so comparing with it would shrink healthy slaves out. Transfers not yet
  acked are kept in order (one per loop turn under load), at most `MAX_PENDING_TRANSFERS` per
  slave (the oldest go first: a slave that far behind is not caught up anyway).

Pure: times are passed in (monotonic seconds), changes are returned for the caller to apply or to
propose to the controller.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_PENDING_TRANSFERS", "SyncState", "SyncStateChange"]

MAX_PENDING_TRANSFERS: Final = 1024
"""Transfers remembered per slave until an ack covers them."""


@dataclass(frozen=True, slots=True)
class SyncStateChange:
    """A new SyncStateSet and why."""

    members: frozenset[int]
    reason: str


class SyncState:
    """SyncStateSet bookkeeping for one master."""

    def __init__(
        self,
        master_id: int,
        members: frozenset[int] | None = None,
        *,
        confirm_offset: int = 0,
        max_lag_seconds: float = 15.0,
        min_in_sync_replicas: int = 1,
    ) -> None:
        self.master_id = master_id
        self.members = frozenset(members or ()) | {master_id}
        self.confirm_offset = confirm_offset
        self.max_lag_seconds = max_lag_seconds
        self.min_in_sync_replicas = min_in_sync_replicas
        self._acks: dict[int, int] = {}
        self._caught_up_at: dict[int, float] = {}
        self._transfers: dict[int, deque[tuple[int, float]]] = {}
        """Per slave: (master's log end, time) of each transfer no ack has covered yet."""

    @property
    def writable(self) -> bool:
        """Whether the set is big enough to accept writes (`minInSyncReplicas`)."""
        return len(self.members) >= self.min_in_sync_replicas

    def ack_of(self, broker_id: int) -> int | None:
        """What a connected slave last said it holds."""
        return self._acks.get(broker_id)

    def acks(self) -> dict[int, int]:
        """Every connected slave that acknowledged: broker id -> log offset it holds."""
        return dict(self._acks)

    def connected(self, broker_id: int, now: float) -> None:
        """A slave (re)connected: its old ack no longer counts until it sends a new one."""
        self._acks.pop(broker_id, None)
        self._transfers[broker_id] = deque(maxlen=MAX_PENDING_TRANSFERS)
        self._caught_up_at.setdefault(broker_id, now)

    def disconnected(self, broker_id: int) -> None:
        """A slave's connection ended; as a member it holds the confirm offset until shrunk."""
        self._acks.pop(broker_id, None)
        self._transfers.pop(broker_id, None)

    def on_transfer(self, broker_id: int, master_end: int, now: float) -> None:
        """The master sent a slave bytes (or a heartbeat) while its log ended at `master_end`."""
        transfers = self._transfers.get(broker_id)
        if transfers is None:
            return
        if transfers and transfers[-1][0] == master_end:
            transfers[-1] = (master_end, now)  # the same end, later: caught up later if acked
        else:
            transfers.append((master_end, now))

    def on_ack(
        self,
        broker_id: int,
        ack_offset: int,
        master_end: int,
        now: float,
        *,
        own_end: int | None = None,
    ) -> SyncStateChange | None:
        """Record an ack; returns an expansion when this slave just qualified.

        `master_end` is the master's log end (a slave at it is caught up); `own_end`, what the
        master counts for itself in the confirm offset (default `master_end`; less with
        SYNC_FLUSH, where only its fsynced bytes count).
        """
        self._acks[broker_id] = ack_offset
        caught_up_at: float | None = None
        transfers = self._transfers.get(broker_id)
        while transfers and transfers[0][0] <= ack_offset:
            caught_up_at = transfers.popleft()[1]
        if ack_offset >= master_end:
            caught_up_at = now
        if caught_up_at is not None:
            self._caught_up_at[broker_id] = max(
                caught_up_at, self._caught_up_at.get(broker_id, caught_up_at)
            )
        self.update_confirm(master_end if own_end is None else own_end)
        if broker_id not in self.members and ack_offset >= self.confirm_offset:
            return SyncStateChange(
                self.members | {broker_id},
                f"broker {broker_id} caught up to the confirm offset {self.confirm_offset}",
            )
        return None

    def check_lag(self, master_end: int, now: float) -> SyncStateChange | None:
        """A shrink when members have lagged too long (call it periodically)."""
        lagging = []
        for broker_id in sorted(self.members - {self.master_id}):
            caught_up_at = self._caught_up_at.get(broker_id, now)
            if self._acks.get(broker_id, -1) >= master_end or caught_up_at > now:
                # (a time after `now`: the clock stepped back; count the lag from now on)
                self._caught_up_at[broker_id] = now
            elif now - caught_up_at > self.max_lag_seconds:
                lagging.append(broker_id)
        if not lagging:
            return None
        return SyncStateChange(
            self.members - set(lagging),
            f"brokers {lagging} not caught up for over {self.max_lag_seconds:g} s",
        )

    def apply(self, change: SyncStateChange, master_end: int, now: float) -> None:
        """Adopt a new set (after the controller, or static mode, accepted it)."""
        for joined in change.members - self.members:
            self._caught_up_at[joined] = now
        self.members = change.members | {self.master_id}
        self.update_confirm(master_end)

    def update_confirm(self, master_end: int) -> int:
        """Recompute the confirm offset from the members' acks; returns it."""
        lowest = master_end
        for broker_id in self.members:
            if broker_id == self.master_id:
                continue
            ack = self._acks.get(broker_id)
            if ack is None:
                return self.confirm_offset  # a member we have not heard from holds it
            lowest = min(lowest, ack)
        self.confirm_offset = max(self.confirm_offset, lowest)
        return self.confirm_offset
