"""The read side's talks with ferrymq (asyncio; the Spark side runs each under `asyncio.run`).

- `list_queues`: the routed queues a read covers, per topic (readable queues, by broker name
  then queue id); `queue_bounds`: their min and max offsets, asked concurrently, as `Bounds`;
- `resolve_offsets`: startingOffsets / endingOffsets as offsets of every covered queue (queues
  the JSON names by partition number are resolved against the route, `options.resolve_queue`);
- `queue_times` / `offsets_for_times` / `apply_times`: the timestamp options (which queues, the
  first offset stored at or after each time, asked of the brokers, and the result clamped to
  the queue's bounds, or refused when a start finds no such message);
- `read_range`: the records of one `QueueRange`, as `RecordBuffers`, with the data-loss rule:
  offsets below the queue's min offset were deleted by retention; with `failOnDataLoss` that is a
  `DataLossError` naming the queue and the offsets, otherwise they are skipped (and logged).

Across a failover every request is retried (`retry.with_failover`), and so is a read of a queue
that is not in the topic's route at that moment (its group left the route while all its replicas
were down, or the topic has fewer queues now): after `failoverTimeoutMs` the query fails with
`RetryableQueryError`, never skips the range. A replica that answers that the queue ends below a
range's end (a new master or a slave whose watermark still catches up to what the old master had
committed) is asked again for `failoverTimeoutMs` before the offsets count as lost. Ranges end at
offsets a broker reported, which never pass its confirm offset.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator
from typing import Final

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import ColumnPull, PullConsumer, PullStatus
from ferrymq.errors import ConnectError, FerryError, RemoteError, TopicNotFoundError
from ferrymq.model import MessageQueue
from ferrymq.spark.clienttls import made_with
from ferrymq.spark.options import (
    EARLIEST,
    LATEST,
    OffsetSpec,
    OptionError,
    ReadOptions,
    TimeSpec,
    resolve_queue,
)
from ferrymq.spark.plan import Bounds, Offsets, QueueKey, QueueRange, check_group_codes
from ferrymq.spark.retry import RetryableQueryError, with_failover
from ferrymq.wire.records import RecordBuffers

__all__ = [
    "DataLossError",
    "apply_times",
    "list_queues",
    "offsets_for_times",
    "queue_bounds",
    "queue_times",
    "read_range",
    "resolve_offsets",
]

QueueTimes = dict[str, dict[QueueKey, int]]
"""topic -> queue -> a time (milliseconds), or the offset found for it."""

log = logging.getLogger(__name__)

_PULL_BATCH: Final = 1024
_EMPTY_PULLS: Final = 8
"""Pulls in a row that may return nothing inside a range (and for at least failoverTimeoutMs)
before the read gives up on it with a RetryableQueryError."""


class DataLossError(FerryError):
    """Offsets a query must read are gone (retention deleted them, or a failover truncated them)."""


def _keys(queues: list[MessageQueue]) -> list[QueueKey]:
    return [QueueKey(q.broker_name, q.queue_id) for q in queues]


async def list_queues(
    consumer: PullConsumer, options: ReadOptions, *, start: Offsets | None = None
) -> dict[str, list[MessageQueue]]:
    """The routed queues the options cover, per topic, by broker name then queue id.

    `start` None: the start of a read; every subscribed or assigned topic must be routed, and
    `assign` must name routed queues. `start` given (a running stream's offsets): a topic with no
    route now is left out (its queues keep their offsets), and `assign` covers the queues of
    `start` (resolved when the stream began), whichever are routed now.

    Raises:
        OptionError: an assigned queue is not routed (or its number is ambiguous).
        TopicNotFoundError: at the start of a read, a subscribed or assigned topic has no route.
        PartitionCollisionError: two groups of a topic share a group code.
    """
    if options.assign is not None:
        topics = sorted(options.assign)
    elif options.subscribe:
        topics = sorted(options.subscribe)
    else:
        async with made_with(
            options.tls, lambda: AdminClient(options.servers, credentials=options.credentials)
        ) as admin:
            topics = sorted(t for t in await admin.topics() if options.topic_filter(t))
    result: dict[str, list[MessageQueue]] = {}
    for topic in topics:
        try:
            queues = await consumer.queues(topic)
        except TopicNotFoundError:
            if options.subscribe_pattern is not None or start is not None:
                continue  # deleted since it was listed, or no group of it is routed now
            raise
        keys = _keys(queues)
        check_group_codes(topic, (k.broker_name for k in keys))
        if options.assign is not None:
            if start is None:
                wanted = {resolve_queue("assign", topic, r, keys) for r in options.assign[topic]}
            else:
                wanted = set(start.get(topic, {}))
            queues = [q for q, k in zip(queues, keys, strict=True) if k in wanted]
        result[topic] = queues
    return result


async def queue_bounds(consumer: PullConsumer, listing: dict[str, list[MessageQueue]]) -> Bounds:
    """Every listed queue's (min offset, max offset), per topic, asked of all at once."""

    async def one(queue: MessageQueue) -> tuple[int, int]:
        low, high = await asyncio.gather(consumer.min_offset(queue), consumer.max_offset(queue))
        return low, high

    queues = [q for topic in sorted(listing) for q in listing[topic]]
    found = await asyncio.gather(*(one(q) for q in queues))
    bounds: Bounds = {topic: {} for topic in listing}
    for q, b in zip(queues, found, strict=True):
        bounds[q.topic][QueueKey(q.broker_name, q.queue_id)] = b
    return bounds


def resolve_offsets(spec: OffsetSpec, bounds: Bounds, option: str) -> Offsets:
    """Concrete offsets for every covered queue from earliest / latest / explicit offsets.

    Raises:
        OptionError: the spec names a topic or queue the read does not cover, or one queue twice.
    """
    asked: dict[tuple[str, QueueKey], int] = {}
    for topic, refs in spec.per_queue.items():
        if topic not in bounds:
            raise OptionError(option, f"topic {topic} is not a topic of this read")
        covered = sorted(bounds[topic])
        for ref, offset in refs.items():
            key = resolve_queue(option, topic, ref, covered)
            if (topic, key) in asked:
                raise OptionError(
                    option, f"{topic}: {key.broker_name} queue {key.queue_id} is named twice"
                )
            asked[(topic, key)] = offset
    offsets: Offsets = {}
    for topic, queues in bounds.items():
        offsets[topic] = {}
        for key, (low, high) in queues.items():
            wanted = asked.get((topic, key), spec.default)
            offsets[topic][key] = (
                low if wanted == EARLIEST else high if wanted == LATEST else wanted
            )
    return offsets


def queue_times(spec: TimeSpec, bounds: Bounds, option: str) -> QueueTimes:
    """The time each covered queue is positioned at (queues the spec does not name: absent).

    Raises:
        OptionError: the spec names a topic or queue the read does not cover, or one queue twice.
    """
    if spec.every_ms is not None:
        return {t: dict.fromkeys(queues, spec.every_ms) for t, queues in bounds.items()}
    times: QueueTimes = {}
    for topic, refs in spec.per_queue.items():
        if topic not in bounds:
            raise OptionError(option, f"topic {topic} is not a topic of this read")
        covered = sorted(bounds[topic])
        times[topic] = {}
        for ref, millis in refs.items():
            key = resolve_queue(option, topic, ref, covered)
            if key in times[topic]:
                raise OptionError(
                    option, f"{topic}: {key.broker_name} queue {key.queue_id} is named twice"
                )
            times[topic][key] = millis
    return times


async def offsets_for_times(consumer: PullConsumer, times: QueueTimes) -> QueueTimes:
    """Each queue's first offset stored at or after its time (SEARCH_OFFSET_BY_TIMESTAMP).

    All are asked at once; a queue whose every message is older answers its end offset.
    """
    asked = [(t, k, ms) for t in sorted(times) for k, ms in sorted(times[t].items())]
    found = await asyncio.gather(
        *(
            consumer.offset_for_time(MessageQueue(t, k.broker_name, k.queue_id), ms)
            for t, k, ms in asked
        )
    )
    offsets: QueueTimes = {t: {} for t in times}
    for (topic, key, _), offset in zip(asked, found, strict=True):
        offsets[topic][key] = offset
    return offsets


def apply_times(
    offsets: Offsets,
    times: QueueTimes,
    found: QueueTimes,
    bounds: Bounds,
    option: str,
    *,
    none_is_end: bool,
) -> None:
    """Set each timed queue of `offsets` to the offset found for its time, within its bounds.

    A queue with no message at or after its time (the offset found is the queue's end) is set to
    its end when `none_is_end`, else refused.

    Raises:
        OptionError: a start found no message at or after its time.
    """
    for topic, queues in found.items():
        for key, offset in queues.items():
            low, high = bounds[topic][key]
            if offset >= high and not none_is_end:
                raise OptionError(
                    option,
                    f"{topic}: {key.broker_name} queue {key.queue_id} holds no message stored at "
                    f"or after {times[topic][key]} ms (its end offset is {high}); set "
                    "startingOffsetsByTimestampStrategy=latest to start such queues at their end",
                )
            offsets[topic][key] = min(max(offset, low), high)


async def _require_routed(
    consumer: PullConsumer, queue: MessageQueue, *, refresh: bool = False
) -> None:
    """Return if the queue is in its topic's route now, else raise a (transient) `ConnectError`."""
    try:
        route = await consumer.routes.get(queue.topic, refresh=refresh)
    except TopicNotFoundError:
        route = None
    if route is None or queue not in route.read_queues:
        consumer.routes.invalidate(queue.topic)  # ask the NameServers again next time
        raise ConnectError(
            f"{queue.broker_name} queue {queue.queue_id} of {queue.topic}",
            "not in the topic's route now (its broker group left the route, or the topic has "
            "fewer queues); waiting for it to come back",
        )


async def _pull(
    consumer: PullConsumer, queue: MessageQueue, offset: int, max_messages: int, max_bytes: int
) -> ColumnPull:
    """One pull of a queue in the route (`_require_routed`): no pull of a queue the route lacks."""
    await _require_routed(consumer, queue)
    try:
        return await consumer.pull_columns(
            queue, offset, max_messages=max_messages, max_bytes=max_bytes
        )
    except RemoteError:
        # a queue the route lost since (its count shrank: the broker says the id is illegal)
        # makes the error transient; any other refusal stands
        await _require_routed(consumer, queue, refresh=True)
        raise


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
        RetryableQueryError: the queue's group stayed unreachable, or the queue out of the
            topic's route, for `failover_timeout` s.

    A queue that ends below `r.end` (a replica whose watermark is still catching up after a
    failover) is asked again for `failover_timeout` s before the missing offsets count as lost.
    A range from EARLIEST starts at the queue's min offset now.
    """
    queue = MessageQueue(r.topic, r.broker_name, r.queue_id)
    offset = r.start
    if offset == EARLIEST:

        async def low() -> int:
            await _require_routed(consumer, queue)
            return await consumer.min_offset(queue)

        offset = await with_failover(
            f"asking {queue} for its min offset", low, budget=failover_timeout
        )
    empty = 0
    retry_since: float | None = None
    behind_since: float | None = None
    while offset < r.end:
        result = await with_failover(
            f"reading {queue} at offset {offset}",
            functools.partial(
                _pull, consumer, queue, offset, min(_PULL_BATCH, r.end - offset), max_bytes
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
