"""Commit-log retention: expired segments are deleted, fenced topics' live tails never are.

ARCHITECTURE.md section 5, issue 18. A segment expires after `fileReservedTime` hours; the
broker deletes expired ones at the `deleteWhen` hours, at once while the disk is fuller than
`diskMaxUsedSpaceRatio`, and on an admin's DELETE_EXPIRED_COMMITLOG (both settings as they are
now: UPDATE_BROKER_CONFIG changes them on a running broker).

A fenced topic's records must outlive any retention (its writer may be gone for days), so
(`fence.py` rule 7):
1. The store never deletes a segment holding a byte of a fenced topic's committed live tail
   (`Store.keep_log_offset` = `FencedTopics.keep_log_offset`), whatever asks for the deletion
   and on every role. A slave therefore waits for the master's copies, which it replicates.
2. Before deleting, a master copies forward every fenced topic whose live tail starts in a
   segment the deletion would take: it re-appends the records of [live start, end), visible and
   held ones, with no await in between (nothing interleaves, and the fence's view steps through
   the copies at once), then waits until the copies are committed and flushed. The live start
   has then moved to the copies, so the old segment goes; when they are not committed in time it
   stays (rule 1) and a later pass deletes it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from ferrymq.broker.fence import FenceRecord, copy_properties, parse_record
from ferrymq.broker.fenced import FencedTopics
from ferrymq.broker.state import BrokerState
from ferrymq.errors import FerryError, StoreError
from ferrymq.store.store import Store
from ferrymq.wire import properties as props
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import BatchItem, MessageRecord, pack_host

__all__ = ["copy_forward", "delete_expired"]

log = logging.getLogger(__name__)

_BORN: Final = pack_host("127.0.0.1", 0)
_FLUSH_WAIT_S: Final = 10.0


async def delete_expired(state: BrokerState, *, force: bool = False) -> int:
    """Delete what retention allows now, copying fenced live tails forward first on a master.

    `force` deletes the oldest segment even if it has not expired (as `Store.delete_expired`).
    Returns the number of segments deleted.
    """
    store = state.store
    reserved_hours = state.config.file_reserved_time
    max_used_ratio = state.config.disk_max_used_space_ratio / 100
    lease = state.lease
    leased = lease is None or lease.covers(state.clock())  # a deposed master copies nothing
    if state.fences.is_master and leased and state.fences.names():
        below = store.expired_log_offset(
            force=force, reserved_hours=reserved_hours, max_used_ratio=max_used_ratio
        )
        if below > store.min_log_offset:
            end = copy_forward(state, below)
            if end is not None:
                await _wait_durable(state, end)
    return store.delete_expired(
        force=force, reserved_hours=reserved_hours, max_used_ratio=max_used_ratio
    )


def copy_forward(state: BrokerState, below_log_offset: int) -> int | None:
    """Copy the live tail of every fenced topic that starts below `below_log_offset`.

    Synchronous: every copy is appended in this call. Returns where the copies end (None: no
    topic needed them).
    """
    store = state.store
    fences = state.fences
    end: int | None = None
    for topic in fences.names():
        start = fences.current(topic).live_start_queue_offset
        start_log_offset = store.log_offset_of(topic, 0, start)
        if start_log_offset is None or start_log_offset >= below_log_offset:
            continue
        tail = fences.stored(topic, start)
        offsets = [record.queue_offset for record, _ in tail]
        if offsets != list(range(start, start + len(offsets))):
            log.error(
                "fenced topic %s: its live tail from queue offset %d is not whole (%s...); not "
                "copied, and its segments are kept",
                topic,
                start,
                offsets[:8],
            )
            continue
        try:
            end = _copy(store, fences, topic, [record for record, _ in tail], state.wall_ms())
        except (FerryError, OSError) as exc:  # a full disk: the guard keeps the originals
            log.error("fenced topic %s: could not copy its live tail forward: %s", topic, exc)
            continue
        log.info(
            "fenced topic %s: copied its live tail (%d records from queue offset %d) forward",
            topic,
            len(tail),
            start,
        )
    if end is not None:
        replication = state.replication
        if replication is not None:
            replication.appended()
        if replication is None or not replication.config.sync:
            state.schedule_dispatch()
    return end


def _copy(
    store: Store, fences: FencedTopics, topic: str, tail: list[MessageRecord], now_ms: int
) -> int:
    """Append copies of `tail` to its topic in puts of at most half a segment; their end."""
    store.dispatch()  # held records reserve their queue offsets first
    block_start = store.queues.get_or_create(topic, 0).next_queue_offset
    budget = store.commitlog.segment_bytes // 2
    chunks: list[list[tuple[BatchItem, FenceRecord]]] = [[]]
    used = 0
    for index, original in enumerate(tail):
        properties = dict(original.properties)
        properties.pop(props.PROPERTY_CRC32, None)
        last = index == len(tail) - 1
        copied = copy_properties(properties, original.queue_offset, block_start if last else None)
        item = BatchItem(original.body, encode_properties(copied), original.flag)
        size = len(item.body) + len(item.properties) + len(topic) + 128
        if chunks[-1] and used + size > budget:
            chunks.append([])
            used = 0
        chunks[-1].append((item, parse_record(copied)))
        used += size
    end = store.max_log_offset
    for chunk in chunks:
        result = store.put(
            topic, 0, [item for item, _ in chunk], born_host=_BORN, born_timestamp_ms=now_ms
        )
        for queue_offset, (_, record) in enumerate(chunk, start=result.first_queue_offset):
            fences.appended(topic, queue_offset, record)
        end = result.end_log_offset
    return end


async def _wait_durable(state: BrokerState, end_log_offset: int) -> None:
    """Wait until the copies below `end_log_offset` are committed and flushed (bounded)."""
    replication = state.replication
    if (
        replication is not None
        and replication.config.sync
        and not await replication.wait_committed(end_log_offset)
    ):
        log.warning(
            "the copied live tails are not committed yet; their old segments stay until they are"
        )
        return
    try:
        flushed = asyncio.wrap_future(state.store.wait_flushed(end_log_offset))
        await asyncio.wait_for(asyncio.shield(flushed), _FLUSH_WAIT_S)
    except (TimeoutError, StoreError) as exc:
        log.warning("the copied live tails are not flushed yet (%s); retried later", exc)
    state.store.dispatch()
