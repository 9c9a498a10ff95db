"""Writing to ferrymq from Spark, exactly once: `df.write` and `df.writeStream.format("ferrymq")`.

Input columns (Kafka's sink shape): `value` (binary or string, required), `key` (binary or
string: the KEYS property), `topic` (unless the `topic` option is set, which wins), `partition`,
`headers` (array<struct<key:string,value:binary|string>>: message properties), `tags` (string).
The queue of a row (`partition_queue`): its `partition`, else a CRC-32 hash of its key, else
round robin. A partition >= 1024 is a stable partition number (what a read's `partition` column
shows: `plan.stable_partition`), the queue of that broker group and queue id whatever the route,
so rows read and written back with their partition land in the queue they came from; it must be
a writable queue of the topic's route now. A partition below 1024 is, as in Kafka, an index into
the topic's writable queues ordered by broker name, then queue id: which queue that is depends on
the route at the time of the write.

Exactly once, whatever Spark replays (design):
- every `write()` task is one transaction: a fresh transaction id; its rows are prepared on the
  brokers of their queues (SINK_PREPARE), invisible, each with its own unique key; the commit
  message lists the rows it prepared per broker group;
- the driver's `commit(messages, batchId)` proposes those transactions as the batch's winner to
  the sink's coordinator broker (SINK_DECIDE): the first proposal recorded for (sink id, batch
  id) wins, in the coordinator's replicated log, and is returned to every later proposer; then
  it asks every broker group holding rows of the winner or of the proposal to commit the
  winner's rows there (SINK_COMMIT), which each does once and answers `duplicate` afterwards.
  Spark calls `commit` before it writes `commits/<batchId>` to the checkpoint; a driver killed
  in between replays the batch (same batch id, new task transactions): the coordinator returns
  the first winner, brokers that committed it say `duplicate`, the others commit it now, and the
  replay's own prepared rows are dropped. Transactions of failed or zombie tasks are never in a
  winner (Spark reports only successful tasks) and expire on the brokers
  (`sinkPreparedTimeout`).
- Why a per-batch winner rather than a per-sink "last committed batch" watermark alone: with
  rows on several broker groups a crash can leave a batch committed on some groups and not on
  others, and the replay's rows are different transactions; only the recorded first winner lets
  the replay finish the same commit instead of committing a second copy.
- Across a failover (the group of a prepare, decide or commit has no master for a while) the
  client retries for `failoverTimeoutMs` (prepares too: a row prepared twice under its
  transaction counts once), then the task or the commit fails with `RetryableQueryError`, and a
  restart from the checkpoint finishes the batch as above.
- Batches are numbered under a sink id: `<sinkId>/<query id>` with the `sinkId` option, else
  the streaming query id. The query id lives in the checkpoint and is new with a new one, so a
  new checkpoint (an offsets change, a lost checkpoint on another machine), whose batch ids start
  at 0 again, never meets the decisions of another checkpoint's batches (which would swallow
  them). A batch write uses `<sinkId>/<fresh id>` (or a fresh id) and batch id 0. The
  coordinator is the first broker group of the `topic` option's route, else the first of the
  cluster.
- Fencing: the `generation` option (a Connect task's) goes with every decide, recorded under the
  `sinkId` (the fence id: the same for every checkpoint of the task). Once a newer generation
  has decided a batch or fenced (`start_sink`), a decide of an older one is refused, nothing of
  its batch is committed (its prepared rows expire), and its query fails with
  `WriterFencedError`. A commit is never refused: it only finishes a batch already decided.
- Source positions: rows that carry `sourceTopic`, `sourceBroker`, `sourceQueueId` and
  `sourceOffset` (a ferrymq read's `topic`, `brokerName`, `queueId`, `offset`) have their batch's
  next offset per source queue recorded with its decision; `start_sink` gives them back to a
  new owner, which starts there (connectors/replicator.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from ferrymq.client.sink import SinkClient, SinkFencedError
from ferrymq.errors import FerryError, RemoteError
from ferrymq.model import MessageQueue, validate_topic
from ferrymq.spark.clienttls import made_with
from ferrymq.spark.options import OptionError, WriteOptions
from ferrymq.spark.plan import (
    check_group_codes,
    group_code,
    is_stable_partition,
    partition_queue,
)
from ferrymq.spark.retry import retryable
from ferrymq.wire import properties as props
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.msgid import UniqueIdGenerator
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import BatchItem
from ferrymq.wire.sink import Positions, SinkFenceState

__all__ = [
    "SOURCE_COLUMNS",
    "FerryBatchWriter",
    "FerryCommit",
    "FerryStreamWriter",
    "WriterFencedError",
    "commit_batch",
    "queue_of_partition",
    "start_sink",
]

log = logging.getLogger(__name__)

_CHUNK_ROWS: Final = 2048
_CHUNK_BYTES: Final = 1 << 20
_PREPARES_IN_FLIGHT: Final = 4
"""A task's prepares in flight at once, at most one per queue (a queue's rows stay in order):
the next chunk is built while the brokers store the previous ones."""

SOURCE_COLUMNS: Final = ("sourceTopic", "sourceBroker", "sourceQueueId", "sourceOffset")
"""Input columns naming each row's source queue and offset (recorded as source positions)."""


class WriterFencedError(FerryError):
    """A newer generation owns the sink: this writer is a zombie; its query stops."""


@dataclass
class FerryCommit(WriterCommitMessage):
    """What one task prepared: its transaction and its rows per broker group."""

    sink_id: str
    transaction_id: str
    rows: dict[str, int] = field(default_factory=dict)
    fence_id: str | None = None
    """What generations and positions are recorded under (None: the sink id)."""
    positions: Positions = field(default_factory=dict)
    """The next offset after this task's rows, per source queue (with `SOURCE_COLUMNS`)."""


def _check_columns(schema: StructType, options: WriteOptions) -> None:
    names = set(schema.names)
    if "value" not in names:
        raise OptionError("value", "the rows to write need a value column (binary or string)")
    if options.topic is None and "topic" not in names:
        raise OptionError("topic", "set the topic option or give the rows a topic column")


def queue_of_partition(topic: str, partition: int, queues: list[MessageQueue]) -> MessageQueue:
    """The writable queue a row's `partition` names (`queues`: the topic's, in route order).

    Raises:
        OptionError: no such queue in the route now.
        PartitionCollisionError: two groups of the route share the number's group code.
    """
    if is_stable_partition(partition):
        check_group_codes(topic, (q.broker_name for q in queues))
        code, queue_id = partition_queue(partition)
        for queue in queues:
            if group_code(queue.broker_name) == code and queue.queue_id == queue_id:
                return queue
        groups = sorted({q.broker_name for q in queues if group_code(q.broker_name) == code})
        where = f"broker group {groups[0]}" if groups else "no broker group of the route now"
        raise OptionError(
            "partition",
            f"topic {topic}: partition {partition} is queue {queue_id} of the broker group with "
            f"code {code} ({where}), not a writable queue of the topic's route now",
        )
    if not 0 <= partition < len(queues):
        raise OptionError(
            "partition",
            f"topic {topic} has {len(queues)} writable queues; partition {partition} is neither "
            "one of their positions nor a stable partition number (>= 1024)",
        )
    return queues[partition]


def _sink_client(options: WriteOptions) -> SinkClient:
    """The sink's client to the cluster, with the options' TLS and credentials."""
    return made_with(
        options.tls,
        lambda: SinkClient(
            options.servers,
            group=options.group,
            retry_for=options.failover_timeout_s,
            credentials=options.credentials,
        ),
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_KEYS_ITEM: Final = f"{props.KEYS}{props.NAME_VALUE_SEPARATOR}"
_UNIQ_ITEM: Final = f"{props.UNIQ_KEY}{props.NAME_VALUE_SEPARATOR}"


def _key_properties(key: str | None, unique: str) -> bytes:
    """`encode_properties({KEYS: key, UNIQ_KEY: unique})` (no KEYS item when `key` is None).

    The properties of a row without headers or tags, formatted directly: the same bytes, and the
    same error for a key holding a separator.
    """
    end = props.PROPERTY_SEPARATOR
    if key is None:
        return f"{_UNIQ_ITEM}{unique}{end}".encode()
    if props.NAME_VALUE_SEPARATOR in key or end in key:
        return encode_properties({props.KEYS: key, props.UNIQ_KEY: unique})  # raises
    return f"{_KEYS_ITEM}{key}{end}{_UNIQ_ITEM}{unique}{end}".encode()


@dataclass(slots=True)
class _Chunk:
    """A queue's rows waiting for their prepare, and their bytes (bodies and properties)."""

    items: list[BatchItem] = field(default_factory=list)
    size: int = 0


class _Stager:
    """Turns Arrow batches into prepared rows of one transaction (runs in a Spark task)."""

    def __init__(
        self, options: WriteOptions, sink_id: str, batch_id: int, fence_id: str | None = None
    ) -> None:
        self.options = options
        self.sink_id = sink_id
        self.fence_id = fence_id
        self.batch_id = batch_id
        self.positions: Positions = {}
        self.transaction_id = uuid.uuid4().hex
        context = TaskContext.get()
        self._turn = itertools.count(context.partitionId() if context else 0)
        self._ids = UniqueIdGenerator(bytes([127, 0, 0, 1]), os.getpid())
        self._pending: dict[MessageQueue, _Chunk] = {}
        self._inflight: dict[MessageQueue, asyncio.Task[None]] = {}
        self.rows: dict[str, int] = {}

    def run(self, batches: Iterator[Any]) -> FerryCommit:
        with asyncio.Runner() as runner, retryable("preparing a task's rows"):
            options = self.options
            client = _sink_client(options)
            try:
                for batch in batches:
                    runner.run(self._add(client, batch))
                for queue in list(self._pending):
                    runner.run(self._flush(client, queue))
                runner.run(self._drain())
            finally:
                runner.run(self._cancel())
                runner.run(client.close())
        return FerryCommit(
            self.sink_id, self.transaction_id, self.rows, self.fence_id, self.positions
        )

    def _queue(
        self, queues: list[MessageQueue], topic: str, partition: int | None, key: object
    ) -> MessageQueue:
        """The queue of a row, among its topic's writable `queues` (route order)."""
        if partition is not None:
            return queue_of_partition(topic, partition, queues)
        if key is not None:
            data = key if isinstance(key, bytes) else str(key).encode()
            return queues[zlib.crc32(data) % len(queues)]
        return queues[next(self._turn) % len(queues)]

    async def _add(self, client: SinkClient, batch: Any) -> None:
        columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        count = batch.num_rows
        values = columns["value"]
        keys = columns.get("key", [None] * count)
        topics = columns.get("topic", [None] * count)
        partitions = columns.get("partition", [None] * count)
        headers = columns.get("headers", [None] * count)
        tags = columns.get("tags", [None] * count)
        if all(name in columns for name in SOURCE_COLUMNS):
            self._note_positions(*(columns[name] for name in SOURCE_COLUMNS))
        now_ms = time.time_ns() // 1_000_000
        next_id = self._ids.next_id
        routes: dict[str, list[MessageQueue]] = {}
        """Each topic's writable queues, looked up (and its name checked) once a batch."""
        pending = self._pending
        for i in range(count):
            topic = self.options.topic or topics[i]
            queues = routes.get(topic)
            if queues is None:
                if not topic:
                    raise OptionError("topic", "a row has no topic (and no topic option is set)")
                validate_topic(topic)
                queues = routes[topic] = await client.queues(topic)
            value = values[i]
            if value is None:
                raise OptionError("value", "a row's value is null")
            body = value.encode() if isinstance(value, str) else bytes(value)
            key = keys[i]
            if headers[i] or tags[i]:
                properties: dict[str, str] = {}
                for header in headers[i] or ():
                    if header["value"] is not None:
                        properties[header["key"]] = _text(header["value"])
                if tags[i]:
                    properties[props.TAGS] = tags[i]
                if key is not None:
                    properties[props.KEYS] = _text(key)
                properties[props.UNIQ_KEY] = next_id(now_ms)
                encoded = encode_properties(properties)
            else:
                encoded = _key_properties(None if key is None else _text(key), next_id(now_ms))
            queue = self._queue(queues, topic, partitions[i], key)
            chunk = pending.get(queue)
            if chunk is None:
                chunk = pending[queue] = _Chunk()
            chunk.items.append(BatchItem(body, encoded))
            chunk.size += len(body) + len(encoded)
            if len(chunk.items) >= _CHUNK_ROWS or chunk.size >= _CHUNK_BYTES:
                await self._flush(client, queue)

    def _note_positions(
        self, topics: list[Any], brokers: list[Any], queue_ids: list[Any], offsets: list[Any]
    ) -> None:
        """Each source queue's next offset after the rows (rows without a source are skipped)."""
        positions = self.positions
        for topic, broker, queue_id, offset in zip(
            topics, brokers, queue_ids, offsets, strict=True
        ):
            if topic is None or broker is None or queue_id is None or offset is None:
                continue
            queues = positions.setdefault(str(topic), {}).setdefault(str(broker), {})
            key = str(queue_id)
            queues[key] = max(queues.get(key, 0), int(offset) + 1)

    async def _flush(self, client: SinkClient, queue: MessageQueue) -> None:
        """Start the prepare of the queue's pending rows (after its previous one has ended)."""
        chunk = self._pending.pop(queue, None)
        if chunk is None or not chunk.items:
            return
        previous = self._inflight.pop(queue, None)
        if previous is not None:
            await previous
        while len(self._inflight) >= _PREPARES_IN_FLIGHT:
            await self._inflight.pop(next(iter(self._inflight)))  # the oldest
        self._inflight[queue] = asyncio.create_task(self._prepare(client, queue, chunk.items))

    async def _prepare(
        self, client: SinkClient, queue: MessageQueue, items: list[BatchItem]
    ) -> None:
        await client.prepare(queue, self.sink_id, self.batch_id, self.transaction_id, items)
        self.rows[queue.broker_name] = self.rows.get(queue.broker_name, 0) + len(items)

    async def _drain(self) -> None:
        """Wait for every prepare in flight (the first failure raises)."""
        while self._inflight:
            await self._inflight.pop(next(iter(self._inflight)))

    async def _cancel(self) -> None:
        """Stop the prepares still in flight after a failure (their rows are never committed)."""
        tasks = list(self._inflight.values())
        self._inflight.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def commit_batch(
    options: WriteOptions, sink_id: str, batch_id: int, messages: list[FerryCommit]
) -> int:
    """Decide the batch's winner and commit it on every broker group; returns rows made visible.

    Raises:
        RetryableQueryError: brokers stayed unavailable through the client's retries (retrying
            the commit is safe).
        FerryError: a broker refused.
    """
    proposal = {m.transaction_id: dict(m.rows) for m in messages if m.rows}
    fence_id = next((m.fence_id for m in messages if m.fence_id), None)
    positions: Positions = {}
    for message in messages:
        for topic, brokers in message.positions.items():
            for broker, queues in brokers.items():
                mine = positions.setdefault(topic, {}).setdefault(broker, {})
                for queue_id, offset in queues.items():
                    mine[queue_id] = max(mine.get(queue_id, 0), offset)
    with retryable(f"committing sink {sink_id} batch {batch_id}"):
        try:
            return await _commit(options, sink_id, batch_id, proposal, fence_id, positions)
        except SinkFencedError as exc:
            raise WriterFencedError(
                f"ferrymq sink {fence_id or sink_id}: batch {batch_id} of this writer "
                f"(generation {options.generation}) was not committed: {exc.remark}"
            ) from exc


async def _commit(
    options: WriteOptions,
    sink_id: str,
    batch_id: int,
    proposal: dict[str, dict[str, int]],
    fence_id: str | None,
    positions: Positions,
) -> int:
    async with _sink_client(options) as client:
        coordinator = await client.coordinator(options.topic)
        winner = await client.decide(
            coordinator,
            sink_id,
            batch_id,
            proposal,
            generation=options.generation,
            fence_id=fence_id,
            positions=positions or None,
        )
        if winner != proposal:
            log.info("sink %s batch %d: finishing the first decided commit", sink_id, batch_id)
        brokers = {b for rows in (*winner.values(), *proposal.values()) for b in rows}
        return await _commit_winner(client, options, sink_id, batch_id, winner, brokers, fence_id)


async def _commit_winner(
    client: SinkClient,
    options: WriteOptions,
    sink_id: str,
    batch_id: int,
    winner: dict[str, dict[str, int]],
    brokers: set[str],
    fence_id: str | None,
) -> int:
    visible = 0
    for broker in sorted(brokers):
        mine = {txn: rows[broker] for txn, rows in winner.items() if broker in rows}
        count, _ = await client.commit(
            broker, sink_id, batch_id, mine, generation=options.generation, fence_id=fence_id
        )
        visible += count
    return visible


async def start_sink(
    options: WriteOptions,
    *,
    change: str | None = None,
    start: Positions | None = None,
    replace: bool = False,
) -> SinkFenceState:
    """A new owner of `options.sink_id` starts: fence, then finish what older runs decided.

    Records `options.generation` at the coordinator (from then on an older generation's decide
    is refused), with `start` as the positions of a very first start, or those an offsets
    `change` not applied yet sets (`replace`) or alters. Then commits the last decided batch of
    every recent run on every broker group holding its rows (a duplicate where it is done), so
    every batch the returned positions count is visible. A batch that cannot be finished (its
    prepared rows expired after `sinkPreparedTimeout`, or it is too old for the broker to
    remember) is logged and skipped.

    Raises:
        WriterFencedError: a newer generation owns the sink.
        RetryableQueryError: brokers stayed unavailable through the retries.
    """
    sink_id, generation = options.sink_id, options.generation
    if sink_id is None or generation is None:
        raise OptionError("sinkId", "a sink owner needs both sinkId and generation")
    with retryable(f"starting sink {sink_id}"):
        async with _sink_client(options) as client:
            coordinator = await client.coordinator(options.topic)
            try:
                state = await client.fence(
                    coordinator, sink_id, generation, change=change, start=start, replace=replace
                )
            except SinkFencedError as exc:
                raise WriterFencedError(f"ferrymq sink {sink_id}: {exc.remark}") from exc
            for pending in state.pending:
                brokers = {b for rows in pending.transactions.values() for b in rows}
                try:
                    await _commit_winner(
                        client,
                        options,
                        pending.sink_id,
                        pending.batch_id,
                        pending.transactions,
                        brokers,
                        sink_id,
                    )
                except RemoteError as exc:
                    if exc.code != ResponseCode.TRANSACTION_FAILED:
                        raise
                    log.error(
                        "sink %s: decided batch %d of %s cannot be finished: %s",
                        sink_id,
                        pending.batch_id,
                        pending.sink_id,
                        exc,
                    )
            return state


def _commits(messages: list[Any]) -> list[FerryCommit]:
    return [m for m in messages if isinstance(m, FerryCommit)]


class FerryBatchWriter(DataSourceArrowWriter):
    """`df.write.format("ferrymq")`: one exactly-once batch under a fresh sink id."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        _check_columns(schema, options)
        self._options = options
        write_id = f"batch-{uuid.uuid4().hex}"
        self._sink_id = f"{options.sink_id}/{write_id}" if options.sink_id else write_id

    def write(self, iterator: Iterator[Any]) -> FerryCommit:
        """Prepare this task's rows."""
        return _Stager(self._options, self._sink_id, 0, self._options.sink_id).run(iterator)

    def commit(self, messages: list[Any]) -> None:
        """Make every task's rows visible at once."""
        asyncio.run(commit_batch(self._options, self._sink_id, 0, _commits(messages)))

    def abort(self, messages: list[Any]) -> None:
        """Nothing to undo: the prepared rows expire on the brokers."""
        log.warning("write to ferrymq aborted: its prepared rows will expire uncommitted")


class FerryStreamWriter(DataSourceStreamArrowWriter):
    """`writeStream.format("ferrymq")`: every micro-batch exactly once."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        _check_columns(schema, options)
        self._options = options

    def write(self, iterator: Iterator[Any]) -> FerryCommit:
        """Prepare this task's rows under (sink id, batch id)."""
        context = TaskContext.get()
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
        query_id = context.getLocalProperty("sql.streaming.queryId") if context else None
        if batch_id is None or query_id is None:
            raise OptionError("sinkId", "not running in a streaming query: use df.write instead")
        fence_id = self._options.sink_id
        sink_id = f"{fence_id}/{query_id}" if fence_id else query_id
        return _Stager(self._options, sink_id, int(batch_id), fence_id).run(iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 (Spark's name)
        """Make the micro-batch's rows visible, once, even when Spark replays it."""
        commits = _commits(messages)
        if commits:
            asyncio.run(commit_batch(self._options, commits[0].sink_id, batchId, commits))

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 (Spark's name)
        """Nothing to undo: the prepared rows expire on the brokers."""
        log.warning("micro-batch %d aborted: its prepared rows will expire uncommitted", batchId)
