"""The `ferrymq` PySpark data source: `spark.read`, `spark.readStream`, `df.write`, `writeStream`.

Where things run (PySpark 4.3 Python Data Source API): the DataSource and the readers are
pickled, so they hold options and plain values only, never a connection. Every call that talks
to ferrymq opens a client inside `asyncio.run` (or one event loop for a task's read), in the
planner (batch ranges), the driver-side stream runner (offsets), or an executor (reads, writes).
Those talks go through a `QueueSource` (`FerryQueues`; a test gives a model cluster instead).

Streaming offsets name queues, `{"topic": {"broker": {"queue id": next offset}}}` (`plan.py`),
so no route change shifts them, and a query restarted from its checkpoint re-reads exactly the
ranges of the batch it had not committed:
- `initialOffset` resolves `startingOffsets` once (Spark asks twice on a first start; the
  timestamp options through the brokers' SEARCH_OFFSET_BY_TIMESTAMP, `fetch.apply_times`), then
  sets the queues `initialOffsets` names (a resumed Connect task) to their offsets, routed now or
  not, as a checkpoint's offsets are;
- `latestOffset` lists the queues again: queues and (with `subscribePattern`) topics new in the
  route join at their min offset and are read from the next micro-batch on; queues absent from
  the route now (their group left it while all its replicas were down, or the topic has fewer
  queues) keep their offsets, and are read on when they return;
- `partitions(start, end)` builds the ranges from the two offsets alone, with no listing: a range
  of a queue the route lacks when it is read waits for it for `failoverTimeoutMs`, then fails
  the query retryably; it is never dropped;
- `maxOffsetsPerTrigger` is Spark's `ReadMaxRows`, split over queues by backlog;
  `minOffsetsPerTrigger` holds a batch back (the same end as its start: Spark runs none) until
  that many messages wait or `maxTriggerDelay` has passed since the last batch, as Kafka's
  source does (PySpark has no composite read limit, so the reader applies it itself; not under
  `Trigger.AvailableNow`, which must not wait);
  `Trigger.AvailableNow` reads up to the offsets seen when its first batch is planned, then stops;
- a checkpoint written in the old positional layout is read when it maps unambiguously, or as
  `legacyOffsets` says (`plan.parse_offsets`), else refused with `LegacyOffsetsError`.

Every talk with ferrymq rides out a failover (`retry.with_failover`, for `failoverTimeoutMs`)
and then fails with `RetryableQueryError`: restarting from the checkpoint is safe.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ferrymq.client.consumer import PullConsumer
from ferrymq.errors import TopicNotFoundError
from ferrymq.rpc.loop import new_event_loop
from ferrymq.spark.clienttls import made_with
from ferrymq.spark.fetch import (
    QueueTimes,
    apply_times,
    list_queues,
    offsets_for_times,
    queue_bounds,
    queue_times,
    read_range,
    resolve_offsets,
)
from ferrymq.spark.options import (
    EARLIEST,
    OptionError,
    ReadOptions,
    parse_read_options,
    parse_write_options,
)
from ferrymq.spark.plan import (
    Bounds,
    Offsets,
    QueueKey,
    QueueRange,
    cap_rows,
    check_group_codes,
    highs,
    legacy_topics,
    next_offsets,
    offsets_json,
    parse_offsets,
    plan_ranges,
    split_ranges,
)
from ferrymq.spark.retry import with_failover
from ferrymq.spark.rows import RANGE_SCHEMA, arrow_schema, range_batch, read_schema, to_batch
from ferrymq.wire.records import RecordBuffers

__all__ = ["FerryDataSource", "FerryQueues", "QueueSource", "RangePartition"]

log = logging.getLogger(__name__)

_ROWS_PER_BATCH = 32768
_BYTES_PER_BATCH = 32 * 1024 * 1024
"""An Arrow batch ends at whichever comes first (bodies and properties). Fewer, larger batches
mean fewer per-batch steps in Spark's Arrow reader; a 500,000-row stream read into Parquet took
1.54-1.59 s with 32,768-row batches and 1.62-1.65 s with 8,192 (local[2]), a difference within
this machine's run-to-run noise (10 %)."""


class RangePartition(InputPartition):
    """A Spark input partition: one queue range."""

    def __init__(self, queue_range: QueueRange) -> None:
        super().__init__(queue_range)
        self.range = queue_range


class FerryDataSource(DataSource):
    """`format("ferrymq")`: read and write ferrymq topics (options: see `ferrymq.spark.options`)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "ferrymq"

    def schema(self) -> StructType:
        """The read columns (Kafka's, plus headers and ferrymq columns when asked)."""
        options = parse_read_options(dict(self.options), streaming=None)
        if options.rows_as_ranges:
            return RANGE_SCHEMA
        return read_schema(
            include_headers=options.include_headers,
            include_ferry_columns=options.include_ferry_columns,
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader (offsets resolved now, in the planner)."""
        return FerryBatchReader(parse_read_options(dict(self.options), streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A micro-batch reader."""
        return FerryStreamReader(parse_read_options(dict(self.options), streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer (exactly once per write); `mode("append")` only, as Kafka's sink.

        Raises:
            OptionError: `mode("overwrite")` (a topic is a log). A write with no mode fails in
                Spark before this is called (UNSUPPORTED_DATA_SOURCE_SAVE_MODE, docs/spark.md).
        """
        from ferrymq.spark.sink import FerryBatchWriter

        if overwrite:
            raise OptionError(
                "mode",
                "overwrite is not possible: a topic is a log that is only appended to; use "
                '.mode("append")',
            )
        return FerryBatchWriter(parse_write_options(dict(self.options)), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A streaming writer (exactly once per micro-batch)."""
        from ferrymq.spark.sink import FerryStreamWriter

        return FerryStreamWriter(parse_write_options(dict(self.options)), schema)


# ---------------------------------------------------------------------- reading


async def _collect(
    chunks: AsyncIterator[RecordBuffers], rows: int, max_bytes: int
) -> tuple[list[RecordBuffers], bool]:
    """Pulls from `chunks` of at least `rows` records or `max_bytes` (fewer at the end).

    Returns them and whether `chunks` ended. Bytes count bodies and properties. One trip into
    the event loop per Arrow batch, not per pull.
    """
    collected: list[RecordBuffers] = []
    count = size = 0
    async for chunk in chunks:
        collected.append(chunk)
        count += chunk.count
        size += len(chunk.bodies) + len(chunk.properties)
        if count >= rows or size >= max_bytes:
            return collected, False
    return collected, True


def read_partition(
    options: ReadOptions, queue_range: QueueRange, schema: StructType
) -> Iterator[Any]:
    """Arrow record batches of one range (runs in an executor's Python worker)."""
    arrow = arrow_schema(schema)
    # a bare loop, not asyncio.Runner: Runner.run installs a SIGINT handler on every call, and
    # getting the old one back reprs the running task (milliseconds, measured per call)
    loop = new_event_loop()
    consumer = made_with(
        options.tls,
        lambda: PullConsumer(options.servers, options.group, credentials=options.credentials),
    )
    chunks = read_range(
        consumer,
        queue_range,
        fail_on_data_loss=options.fail_on_data_loss,
        max_bytes=options.fetch_max_bytes,
        failover_timeout=options.failover_timeout_s,
    )
    try:
        while True:
            pulls, done = loop.run_until_complete(
                _collect(chunks, _ROWS_PER_BATCH, _BYTES_PER_BATCH)
            )
            if pulls:
                yield to_batch(pulls, queue_range, arrow)
            if done:
                break
    finally:
        try:
            loop.run_until_complete(chunks.aclose())
            loop.run_until_complete(consumer.close())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


class QueueSource(Protocol):
    """What the readers ask of ferrymq: the route and bounds of queues, and a range's rows."""

    def bounds(self, options: ReadOptions, start: Offsets | None) -> Bounds:
        """The covered queues' (min, max) offsets now (`fetch.list_queues` says which)."""
        ...

    def routes(self, options: ReadOptions, topics: Sequence[str]) -> dict[str, list[QueueKey]]:
        """Each topic's readable queues now (none for a topic without a route)."""
        ...

    def read(
        self, options: ReadOptions, queue_range: QueueRange, schema: StructType
    ) -> Iterator[Any]:
        """The range's rows (Arrow batches), in queue offset order."""
        ...

    def times(self, options: ReadOptions, times: QueueTimes) -> QueueTimes:
        """Each queue's first offset stored at or after its time (its end if none)."""
        ...


class FerryQueues:
    """The `QueueSource` of a real cluster (stateless, so a reader holding it pickles)."""

    def bounds(self, options: ReadOptions, start: Offsets | None) -> Bounds:
        """The covered queues' (min, max) offsets now (retried across a failover)."""

        async def attempt() -> Bounds:
            async with made_with(
                options.tls,
                lambda: PullConsumer(
                    options.servers, options.group, credentials=options.credentials
                ),
            ) as consumer:
                listing = await list_queues(consumer, options, start=start)
                return await queue_bounds(consumer, listing)

        return asyncio.run(
            with_failover(
                "listing the queues and offsets to read", attempt, budget=options.failover_timeout_s
            )
        )

    def routes(self, options: ReadOptions, topics: Sequence[str]) -> dict[str, list[QueueKey]]:
        """Each topic's readable queues now (retried across a failover)."""

        async def attempt() -> dict[str, list[QueueKey]]:
            found: dict[str, list[QueueKey]] = {}
            async with made_with(
                options.tls,
                lambda: PullConsumer(
                    options.servers, options.group, credentials=options.credentials
                ),
            ) as consumer:
                for topic in topics:
                    try:
                        queues = await consumer.queues(topic)
                    except TopicNotFoundError:
                        queues = []
                    found[topic] = [QueueKey(q.broker_name, q.queue_id) for q in queues]
            return found

        return asyncio.run(
            with_failover("listing routes", attempt, budget=options.failover_timeout_s)
        )

    def read(
        self, options: ReadOptions, queue_range: QueueRange, schema: StructType
    ) -> Iterator[Any]:
        """The range's rows as Arrow batches (`read_partition`)."""
        return read_partition(options, queue_range, schema)

    def times(self, options: ReadOptions, times: QueueTimes) -> QueueTimes:
        """Each queue's first offset stored at or after its time (retried across a failover)."""

        async def attempt() -> QueueTimes:
            async with made_with(
                options.tls,
                lambda: PullConsumer(
                    options.servers, options.group, credentials=options.credentials
                ),
            ) as consumer:
                return await offsets_for_times(consumer, times)

        return asyncio.run(
            with_failover(
                "finding offsets by timestamp", attempt, budget=options.failover_timeout_s
            )
        )


def _start_offsets(options: ReadOptions, bounds: Bounds, queues: QueueSource) -> Offsets:
    """`startingOffsets`, then the starting timestamp options over it (they win, as in Kafka)."""
    offsets = resolve_offsets(options.starting, bounds, "startingOffsets")
    if options.starting_time is not None:
        option = (
            "startingTimestamp"
            if options.starting_time.every_ms is not None
            else "startingOffsetsByTimestamp"
        )
        timed = queue_times(options.starting_time, bounds, option)
        found = queues.times(options, timed)
        apply_times(offsets, timed, found, bounds, option, none_is_end=options.starting_time_latest)
    return offsets


FERRY_QUEUES = FerryQueues()


class FerryBatchReader(DataSourceReader):
    """`spark.read.format("ferrymq")`: the ranges between startingOffsets and endingOffsets."""

    def __init__(
        self, options: ReadOptions, schema: StructType, queues: QueueSource = FERRY_QUEUES
    ) -> None:
        self._options = options
        self._schema = schema
        self._queues = queues
        bounds = queues.bounds(options, None)
        start = _start_offsets(options, bounds, queues)
        end = resolve_offsets(options.ending, bounds, "endingOffsets")
        if options.ending_time is not None:
            option = (
                "endingTimestamp"
                if options.ending_time.every_ms is not None
                else "endingOffsetsByTimestamp"
            )
            timed = queue_times(options.ending_time, bounds, option)
            apply_times(end, timed, queues.times(options, timed), bounds, option, none_is_end=True)
        for topic, routed in bounds.items():
            for key, (_, high) in routed.items():
                end[topic][key] = min(end[topic][key], high)
        ranges = plan_ranges(start, end, from_earliest=False)
        self._ranges = split_ranges(ranges, options.min_partitions)

    def partitions(self) -> Sequence[InputPartition]:
        """One Spark partition per queue range (none: PySpark plans one `InputPartition(None)`)."""
        return [RangePartition(r) for r in self._ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The range's messages as Arrow batches (nothing for PySpark's stand-in partition)."""
        if isinstance(partition, RangePartition):
            yield from self._queues.read(self._options, partition.range, self._schema)


class FerryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("ferrymq")`: micro-batches of queue ranges."""

    def __init__(
        self,
        options: ReadOptions,
        schema: StructType,
        queues: QueueSource = FERRY_QUEUES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = options
        self._schema = schema
        self._queues = queues
        self._initial: dict[str, Any] | None = None
        self._available_now = False
        self._target: Offsets | None = None
        self._latest: dict[str, Any] | None = None
        self._mapped: set[str] = set()
        self._clock = clock
        self._last_batch_s: float | None = None
        """When the last micro-batch was let through (`minOffsetsPerTrigger`)."""

    def _offsets(self, data: Mapping[str, Any]) -> Offsets:
        """Offsets from Spark's JSON; the old positional layout mapped by the route now."""
        legacy = legacy_topics(data)
        routes = self._queues.routes(self._options, legacy) if legacy else {}
        offsets = parse_offsets(data, routes, self._options.legacy_offsets)
        for topic in legacy:
            if topic not in self._mapped:
                self._mapped.add(topic)
                log.info(
                    "ferrymq source: checkpoint offsets of %s in the old positional layout "
                    "read as %s (legacyOffsets=%s)",
                    topic,
                    offsets_json({topic: offsets[topic]})[topic],
                    self._options.legacy_offsets.value,
                )
        return offsets

    def initialOffset(self) -> dict[str, Any]:
        """StartingOffsets resolved (once: Spark asks twice on a first start)."""
        if self._initial is None:
            bounds = self._queues.bounds(self._options, None)
            offsets = _start_offsets(self._options, bounds, self._queues)
            for topic, queues in (self._options.initial or {}).items():
                if topic not in offsets:
                    log.warning("ferrymq source: initialOffsets of %s ignored: not read", topic)
                    continue
                offsets[topic].update(queues)
            self._initial = offsets_json(offsets)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        """MaxOffsetsPerTrigger as Spark's ReadMaxRows."""
        limit = self._options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        """End an AvailableNow run at what every queue holds when its first batch is planned."""
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """Where the next micro-batch ends."""
        begin = self._offsets(start)
        bounds = self._queues.bounds(self._options, begin)
        if self._available_now and self._target is None:
            self._target = highs(bounds)
        end, joined = next_offsets(begin, bounds, self._target)
        for topic, key, low in joined:
            log.info(
                "ferrymq source: new queue %s/%s/%d from offset %d",
                topic,
                key.broker_name,
                key.queue_id,
                low,
            )
        if isinstance(limit, ReadMaxRows):
            end = cap_rows(begin, end, limit.max_rows)
        if self._held_back(begin, end):
            end = begin
        for topic, queues in end.items():
            check_group_codes(topic, (key.broker_name for key in queues))
        self._latest = offsets_json(end)
        return self._latest

    def _held_back(self, begin: Offsets, end: Offsets) -> bool:
        """Whether `minOffsetsPerTrigger` holds this batch back.

        Held back: fewer new messages than the minimum, and less than `maxTriggerDelay` since
        the last batch (or since the query started).
        """
        now = self._clock()
        if self._last_batch_s is None:
            self._last_batch_s = now
        wanted = self._options.min_offsets_per_trigger
        if wanted is None or self._available_now:
            return False
        waiting = sum(
            offset - begin.get(topic, {}).get(key, offset)
            for topic, queues in end.items()
            for key, offset in queues.items()
        )
        if waiting >= wanted or now - self._last_batch_s >= self._options.max_trigger_delay_s:
            if waiting > 0:
                self._last_batch_s = now
            return False
        return True

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The last end offsets seen (shown in query progress)."""
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The queue ranges between two offsets, from the offsets alone (the same on a replay)."""
        begin, stop = self._offsets(start), self._offsets(end)
        if begin == stop:
            return []
        from_earliest = self._options.starting.default == EARLIEST
        ranges = plan_ranges(begin, stop, from_earliest=from_earliest)
        return [RangePartition(r) for r in split_ranges(ranges, self._options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The range's messages as Arrow batches (nothing for a stand-in partition).

        With `rowsAs=ranges`, one row naming the range instead: its writer reads the messages.
        """
        if isinstance(partition, RangePartition):
            if self._options.rows_as_ranges:
                yield range_batch(partition.range)
                return
            yield from self._queues.read(self._options, partition.range, self._schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing: the checkpoint holds the offsets."""
