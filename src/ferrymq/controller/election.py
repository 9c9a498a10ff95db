"""Choosing a master among live candidates.

Spec: reference/rocketmq-controller-spec.md section 1.6 (`DefaultElectPolicy.tryElect`), with the
fixes of section 9 item 8: a proper four-key sort (higher epoch, higher max log offset, lower
election priority, lower broker id) with no integer overflow and no collapsing of ties.

Rules (in order):
1. No live candidate: no master.
2. The old master, when it is a live candidate and nobody else is preferred, stays master (the
   caller answers CONTROLLER_MASTER_STILL_EXIST).
3. A preferred broker (an admin's `electMaster -b`) is chosen only if it is a live candidate;
   otherwise nobody is (no fallback to another candidate).
4. Otherwise the best candidate by `BrokerLiveInfo.election_rank`.
"""

from __future__ import annotations

from collections.abc import Collection

from ferrymq.controller.liveness import BrokerLiveInfo

__all__ = ["elect"]


def elect(
    candidates: Collection[BrokerLiveInfo],
    *,
    old_master: int | None,
    preferred: int | None = None,
) -> int | None:
    """The broker id to make master among live `candidates`, or None."""
    if not candidates:
        return None
    ids = {info.broker_id for info in candidates}
    if old_master in ids and preferred in (None, old_master):
        return old_master
    if preferred is not None:
        return preferred if preferred in ids else None
    return min(candidates, key=lambda info: info.election_rank).broker_id
