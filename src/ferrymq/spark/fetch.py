"""The read side's talks with ferrymq (asyncio; the Spark side runs each under `asyncio.run`).

- `list_queues`: the queues a read covers, as topic-global partitions (a topic's readable queues
  ordered by broker name, then queue id);
- `queue_bounds`: every queue's min and max offsets, concurrently;
- `read_range`: the records of one `QueueRange`, as `RecordBuffers`, with the data-loss rule:
  offsets below the queue's min offset were deleted by retention; with `failOnDataLoss` that is a
  `DataLossError` naming the queue and the offsets, otherwise they are skipped (and logged).

Across a failover every request is retried (`retry.with_failover`), and a replica that answers
that the queue ends below a range's end (a new master or a slave whose watermark still catches
up to what the old master had committed) is asked again for `failoverTimeoutMs` before the
offsets count as lost. Ranges end at offsets a broker reported, which never pass its confirm offset.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.errors import FerryError, TopicNotFoundError
from ferrymq.model import MessageQueue
from ferrymq.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError, ReadOptions
from ferrymq.spark.plan import Offsets, QueueRange
from ferrymq.spark.retry import RetryableQueryError, with_failover
from ferrymq.wire.records import RecordBuffers

__all__ = [
    "DataLossError",
    "Partition",
    "list_queues",
    "queue_bounds",
    "read_range",
    "resolve_offsets",
]

log = logging.getLogger(__name__)

_PULL_BATCH = 1024
_EMPTY_PULLS = 8
"""Pulls in a row that may return nothing inside a range (and for at least failoverTimeoutMs)
before the read gives up on it with a RetryableQueryError."""


class DataLossError(FerryError):
    """Offsets a query must read are gone (retention deleted them, or a failover truncated them)."""


@dataclass(frozen=True, slots=True)
class Partition:
    """One queue of a read, with its topic-global partition index."""

    topic: str
    partition: int
    queue: MessageQueue


async def list_queues(consumer: PullConsumer, options: ReadOptions) -> list[Partition]:
    """The queues the options name, in (topic, partition) order.

    Raises:
        OptionError: an assigned partition does not exist.
        TopicNotFoundError: a subscribed or assigned topic has no route.
    """
    if options.assign is not None:
        topics = sorted(options.assign)
    elif options.subscribe:
        topics = sorted(options.subscribe)
    else:
        async with AdminClient(options.servers) as admin:
            topics = sorted(t for t in await admin.topics() if options.topic_filter(t))
    result: list[Partition] = []
    for topic in topics:
        try:
            queues = await consumer.queues(topic)
        except TopicNotFoundError:
            if options.subscribe_pattern is not None:
                continue  # deleted since it was listed
            raise
        wanted = range(len(queues)) if options.assign is None else options.assign[topic]
        for partition in wanted:
            if partition >= len(queues):
                raise OptionError(
                    "assign", f"topic {topic} has {len(queues)} partitions; {partition} is not one"
                )
            result.append(Partition(topic, partition, queues[partition]))
    return result


async def queue_bounds(
    consumer: PullConsumer, partitions: list[Partition]
) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) -> (min offset, max offset), asked of every queue at once."""

    async def one(p: Partition) -> tuple[int, int]:
        low, high = await asyncio.gather(consumer.min_offset(p.queue), consumer.max_offset(p.queue))
        return low, high

    bounds = await asyncio.gather(*(one(p) for p in partitions))
    return {(p.topic, p.partition): b for p, b in zip(partitions, bounds, strict=True)}


def resolve_offsets(
    spec: OffsetSpec,
    partitions: list[Partition],
    bounds: dict[tuple[str, int], tuple[int, int]],
    option: str,
) -> Offsets:
    """Concrete offsets for every partition from earliest / latest / explicit offsets.

    Raises:
        OptionError: the spec names a topic or partition the read does not cover.
    """
    covered = {(p.topic, p.partition) for p in partitions}
    for topic, queues in spec.per_queue.items():
        for partition in queues:
            if (topic, partition) not in covered:
                raise OptionError(option, f"{topic}/{partition} is not a partition of this read")
    offsets: Offsets = {}
    for p in partitions:
        low, high = bounds[(p.topic, p.partition)]
        asked = spec.for_queue(p.topic, p.partition)
        value = low if asked == EARLIEST else high if asked == LATEST else asked
        offsets.setdefault(p.topic, {})[p.partition] = value
    return offsets


def _lost(r: QueueRange, start: int, end: int, fail: bool, why: str) -> None:
    message = (
        f"topic {r.topic} partition {r.partition} ({r.broker_name} queue {r.queue_id}): "
        f"queue offsets [{start}, {end}) are no longer stored ({why}); "
    )
    if fail:
        raise DataLossError(
            message + "they were never read by this query. Set failOnDataLoss=false to skip "
            "what was lost and go on."
        )
    log.warning("%sskipping them (failOnDataLoss=false)", message)


def _within(records: RecordBuffers, start: int, end: int) -> RecordBuffers:
    """The records at queue offsets `[start, end)` (a pull's are in queue offset order)."""
    return records.slice(*records.within(start, end))


async def read_range(
    consumer: PullConsumer,
    r: QueueRange,
    *,
    fail_on_data_loss: bool,
    max_bytes: int,
    failover_timeout: float,
) -> AsyncGenerator[RecordBuffers]:
    """The records of `r` in queue order, a pull's worth at a time (exactly offsets `[start, end)`).

    Raises:
        DataLossError: some offsets of the range are gone and `fail_on_data_loss`.
        RetryableQueryError: the queue's group stayed unreachable for `failover_timeout` s.

    A queue that ends below `r.end` (a replica whose watermark is still catching up after a
    failover) is asked again for `failover_timeout` s before the missing offsets count as lost.
    """
    queue = MessageQueue(r.topic, r.broker_name, r.queue_id)
    offset = r.start
    empty = 0
    retry_since: float | None = None
    behind_since: float | None = None
    while offset < r.end:
        result = await with_failover(
            f"reading {queue} at offset {offset}",
            functools.partial(
                consumer.pull_columns,
                queue,
                offset,
                max_messages=min(_PULL_BATCH, r.end - offset),
                max_bytes=max_bytes,
            ),
            budget=failover_timeout,
        )
        if result.min_offset > offset:
            gone_until = min(result.min_offset, r.end)
            _lost(r, offset, gone_until, fail_on_data_loss, "deleted by retention")
            offset = gone_until
            continue
        if result.status is PullStatus.FOUND:
            empty = 0
            retry_since = None
            behind_since = None
            records = _within(result.records, offset, r.end)
            if records:
                yield records
            offset = max(result.next_offset, offset + 1)
            continue
        if result.status is PullStatus.NO_MATCHED_MSG:
            # PULL_RETRY_IMMEDIATELY: the replica asked is catching up (a failover, a slave
            # below its watermark); past both limits the query may be restarted, nothing is lost
            empty += 1
            now = time.monotonic()
            retry_since = now if retry_since is None else retry_since
            if empty > _EMPTY_PULLS and now - retry_since >= failover_timeout:
                raise RetryableQueryError(
                    f"reading {queue} at offset {offset}",
                    FerryError(
                        f"the broker kept answering PULL_RETRY_IMMEDIATELY for {empty} pulls"
                    ),
                )
            await asyncio.sleep(min(0.05 * empty, 1.0))
            continue
        # NO_NEW_MSG or OFFSET_ILLEGAL inside the range: the records are not there
        if result.next_offset > offset:
            gone_until = min(result.next_offset, r.end)
            _lost(r, offset, gone_until, fail_on_data_loss, "their log segment was deleted")
            offset = gone_until
            continue
        now = time.monotonic()
        if behind_since is None or now - behind_since < failover_timeout:
            # after a failover the replica's watermark may not have reached the range end yet
            behind_since = now if behind_since is None else behind_since
            await asyncio.sleep(0.2)
            continue
        _lost(
            r,
            offset,
            r.end,
            fail_on_data_loss,
            f"the queue now ends at offset {result.max_offset}, maybe truncated by a failover",
        )
        return
