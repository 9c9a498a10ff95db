"""Where a slave's log stops agreeing with its master's: the truncation point of the handshake.

Spec: reference/rocketmq-controller-spec.md section 4.5 (`findConsistentPoint`, `doTruncate`) and
section 9 items 4-5, where ferrymq differs:

- Histories follow Kafka leader-epoch semantics (`store.epochs`), so an epoch number belongs to
  one master and one start offset; the latest epoch both histories hold with the same start is
  where they agree, up to the earlier of the two ends of that epoch.
- A slave with bytes but no epoch history, or with no epoch in common with its master, is not
  trusted: the point is 0 and it resyncs from scratch (RocketMQ trusts an empty history's log
  entirely and fails on no common epoch, needing an operator). Nothing committed is lost by
  this: a master holds every committed byte, and a slave keeps only what the master has.

Pure: no I/O.
"""

from __future__ import annotations

from ferrymq.store.epochs import EpochHistory

__all__ = ["consistent_point"]


def consistent_point(
    local: EpochHistory, local_end: int, master: EpochHistory, master_end: int
) -> int:
    """The log offset below which the slave's bytes equal the master's; it truncates there."""
    master_index = {entry.epoch: i for i, entry in enumerate(master)}
    local_entries = local.entries
    for i in range(len(local_entries) - 1, -1, -1):
        entry = local_entries[i]
        j = master_index.get(entry.epoch)
        if j is None or master.entries[j].start_offset != entry.start_offset:
            continue
        return min(local.end_of(i, local_end), master.end_of(j, master_end))
    return 0
