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
- The sink id is the `sinkId` option, else the streaming query id (stable across restarts: it
  lives in the checkpoint); a batch write uses a fresh id and batch id 0. The coordinator is the
  first broker group of the `topic` option's route, else the first of the cluster.
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

from ferrymq.client.sink import SinkClient
from ferrymq.model import MessageQueue, validate_topic
from ferrymq.spark.options import OptionError, WriteOptions
from ferrymq.spark.plan import (
    check_group_codes,
    group_code,
    is_stable_partition,
    partition_queue,
)
from ferrymq.spark.retry import retryable
from ferrymq.wire import properties as props
from ferrymq.wire.msgid import UniqueIdGenerator
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import BatchItem

__all__ = [
    "FerryBatchWriter",
    "FerryCommit",
    "FerryStreamWriter",
    "commit_batch",
    "queue_of_partition",
]

log = logging.getLogger(__name__)

_CHUNK_ROWS: Final = 2048
_CHUNK_BYTES: Final = 1 << 20


@dataclass
class FerryCommit(WriterCommitMessage):
    """What one task prepared: its transaction and its rows per broker group."""

    sink_id: str
    transaction_id: str
    rows: dict[str, int] = field(default_factory=dict)


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


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Stager:
    """Turns Arrow batches into prepared rows of one transaction (runs in a Spark task)."""

    def __init__(self, options: WriteOptions, sink_id: str, batch_id: int) -> None:
        self.options = options
        self.sink_id = sink_id
        self.batch_id = batch_id
        self.transaction_id = uuid.uuid4().hex
        context = TaskContext.get()
        self._turn = itertools.count(context.partitionId() if context else 0)
        self._ids = UniqueIdGenerator(bytes([127, 0, 0, 1]), os.getpid())
        self._pending: dict[MessageQueue, list[BatchItem]] = {}
        self._pending_bytes: dict[MessageQueue, int] = {}
        self.rows: dict[str, int] = {}

    def run(self, batches: Iterator[Any]) -> FerryCommit:
        with asyncio.Runner() as runner, retryable("preparing a task's rows"):
            client = SinkClient(
                self.options.servers,
                group=self.options.group,
                retry_for=self.options.failover_timeout_s,
            )
            try:
                for batch in batches:
                    runner.run(self._add(client, batch))
                for queue in list(self._pending):
                    runner.run(self._flush(client, queue))
            finally:
                runner.run(client.close())
        return FerryCommit(self.sink_id, self.transaction_id, self.rows)

    async def _queue(
        self, client: SinkClient, topic: str, partition: int | None, key: object
    ) -> MessageQueue:
        queues = await client.queues(topic)
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
        now_ms = time.time_ns() // 1_000_000
        for i in range(count):
            topic = self.options.topic or topics[i]
            if not topic:
                raise OptionError("topic", "a row has no topic (and no topic option is set)")
            validate_topic(topic)
            value = values[i]
            if value is None:
                raise OptionError("value", "a row's value is null")
            body = value.encode() if isinstance(value, str) else bytes(value)
            properties: dict[str, str] = {}
            for header in headers[i] or ():
                if header["value"] is not None:
                    properties[header["key"]] = _text(header["value"])
            if tags[i]:
                properties[props.TAGS] = tags[i]
            if keys[i] is not None:
                properties[props.KEYS] = _text(keys[i])
            properties[props.UNIQ_KEY] = self._ids.next_id(now_ms)
            queue = await self._queue(client, topic, partitions[i], keys[i])
            item = BatchItem(body, encode_properties(properties))
            self._pending.setdefault(queue, []).append(item)
            size = self._pending_bytes.get(queue, 0) + len(body) + len(item.properties)
            self._pending_bytes[queue] = size
            if len(self._pending[queue]) >= _CHUNK_ROWS or size >= _CHUNK_BYTES:
                await self._flush(client, queue)

    async def _flush(self, client: SinkClient, queue: MessageQueue) -> None:
        items = self._pending.pop(queue, [])
        self._pending_bytes.pop(queue, None)
        if not items:
            return
        await client.prepare(queue, self.sink_id, self.batch_id, self.transaction_id, items)
        self.rows[queue.broker_name] = self.rows.get(queue.broker_name, 0) + len(items)


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
    with retryable(f"committing sink {sink_id} batch {batch_id}"):
        return await _commit(options, sink_id, batch_id, proposal)


async def _commit(
    options: WriteOptions, sink_id: str, batch_id: int, proposal: dict[str, dict[str, int]]
) -> int:
    async with SinkClient(
        options.servers, group=options.group, retry_for=options.failover_timeout_s
    ) as client:
        coordinator = await client.coordinator(options.topic)
        winner = await client.decide(coordinator, sink_id, batch_id, proposal)
        if winner != proposal:
            log.info("sink %s batch %d: finishing the first decided commit", sink_id, batch_id)
        brokers = {b for rows in (*winner.values(), *proposal.values()) for b in rows}
        visible = 0
        for broker in sorted(brokers):
            mine = {txn: rows[broker] for txn, rows in winner.items() if broker in rows}
            count, _ = await client.commit(broker, sink_id, batch_id, mine)
            visible += count
        return visible


def _commits(messages: list[Any]) -> list[FerryCommit]:
    return [m for m in messages if isinstance(m, FerryCommit)]


class FerryBatchWriter(DataSourceArrowWriter):
    """`df.write.format("ferrymq")`: one exactly-once batch under a fresh sink id."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        _check_columns(schema, options)
        self._options = options
        self._sink_id = options.sink_id or f"batch-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[Any]) -> FerryCommit:
        """Prepare this task's rows."""
        return _Stager(self._options, self._sink_id, 0).run(iterator)

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
        sink_id = self._options.sink_id or query_id
        if batch_id is None or sink_id is None:
            raise OptionError("sinkId", "not running in a streaming query: use df.write instead")
        return _Stager(self._options, sink_id, int(batch_id)).run(iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 (Spark's name)
        """Make the micro-batch's rows visible, once, even when Spark replays it."""
        commits = _commits(messages)
        if commits:
            asyncio.run(commit_batch(self._options, commits[0].sink_id, batchId, commits))

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803 (Spark's name)
        """Nothing to undo: the prepared rows expire on the brokers."""
        log.warning("micro-batch %d aborted: its prepared rows will expire uncommitted", batchId)
