"""`FerrymqReplicator`: topics of one ferrymq cluster copied into another (or into other topics).

Each task is one streaming query `readStream.format("ferrymq")` -> `writeStream.format("ferrymq")`:
exactly once, because the ferrymq sink commits each micro-batch once (prepared rows, a
replicated first-winner decision per batch) and fences older owners of the task by generation.
Keys, tags and properties go with the body (a copy gets a new message id: the sink gives every
row its own unique key).

Config (besides `name`, `connector.class`, `tasks.max`):
- `topics`: the source topics (comma-separated); tasks split them;
- `source.servers` / `target.servers`: NameServer addresses (default: the worker's cluster);
- `target.topic.format`: the target topic, `${topic}` standing for the source topic
  (default `${topic}`; copying a topic into itself on one cluster is refused);
- `target.topic.create`: create a missing target topic with the source topic's queue count
  (default true, as MirrorMaker creates remote topics);
- `startingOffsets`: `earliest` (default) or `latest`, for the task's very first start;
- `trigger.interval.ms`: the micro-batch interval (default 200: `runtime.TRIGGER_INTERVAL_MS`).

Per-queue order (`queue_map`): a message of source queue q lands in one target queue, always the
same, so each source queue's order is kept. When the target topic has the source's shape (as
many broker groups, paired in name order, each with the same queue ids) that is the queue with
q's id in the paired group; otherwise the source queues, in route order (broker name, queue id),
are dealt over the target's writable queues in route order (the n-th to queue n mod their
count), and a source queue that appears later goes to the target queue its name hashes to.

The task's identity and where it starts (`resume`):
- the sink id (the fence id) is `<connector>:<incarnation>:<task>` (characters a sink id cannot
  hold become `_`); the same for every checkpoint the task ever has;
- every micro-batch's decision carries the source positions of its rows (the next offset per
  source queue), kept per sink id by the sink's coordinator, and the task's generation;
- at start the task fences (`start_sink`: its generation is recorded, so an older owner's next
  decide is refused and that query fails with `WriterFencedError`), finishes the last decided
  batch of every older checkpoint (a commit cut short by a crash or a zombie), and then starts
  from its checkpoint when that checkpoint made the last decision, else (no checkpoint: a new
  worker, a lost disk; or a stale one: the task ran elsewhere since) from the decided positions.
  So nothing decided is read again and nothing after it is skipped;
- an offsets change (DELETE: back to `startingOffsets`; PATCH entries
  `{"partition": {"topic", "broker", "queue"}, "offset": {"offset": n}}`, `null` for earliest)
  is applied once per task, by the fence, whatever checkpoint the task starts on afterwards;
  each task takes the entries of its own topics.

GET /offsets (`connector_offsets`) reads each task's decided positions at the target cluster's
sink coordinator (SINK_QUERY_FENCE: read-only, so a running task is not fenced), as PATCH
entries of the connector's topics: the answer is a valid PATCH body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.sink import SinkClient, SinkFenceNotFoundError
from ferrymq.connect.plugin import (
    ConfigKey,
    ConfigType,
    ConnectorPlugin,
    OffsetsScope,
    TaskContext,
)
from ferrymq.connect.records import OffsetEntry, OffsetsPut
from ferrymq.connectors.runtime import TRIGGER_INTERVAL_MS
from ferrymq.errors import FerryError, TopicNotFoundError
from ferrymq.model import MessageQueue, validate_topic

__all__ = ["FerrymqReplicator", "offset_entries", "queue_map", "sink_id_for", "sink_id_of"]

log = logging.getLogger(__name__)

Positions = dict[str, dict[str, dict[str, int]]]

_ROUTE_WAIT_S: Final = 20.0
_OFFSETS_WAIT_S: Final = 5.0
"""How long GET /offsets retries the target's coordinator (then the REST API answers 503)."""


class FerrymqReplicator(ConnectorPlugin):
    """ferrymq topics to ferrymq topics, exactly once."""

    type = "source"
    trigger_interval_ms = TRIGGER_INTERVAL_MS
    version = "1.0"
    keys = (
        ConfigKey("topics", ConfigType.LIST, "Source topics, comma-separated.", required=True),
        ConfigKey(
            "source.servers",
            ConfigType.STRING,
            "Source NameServers (default: this Connect cluster's).",
        ),
        ConfigKey(
            "target.servers",
            ConfigType.STRING,
            "Target NameServers (default: this Connect cluster's).",
        ),
        ConfigKey(
            "target.topic.format",
            ConfigType.STRING,
            "The target topic; ${topic} is the source topic.",
            default="${topic}",
        ),
        ConfigKey(
            "target.topic.create",
            ConfigType.BOOLEAN,
            "Create a missing target topic with the source's queue count.",
            default="true",
        ),
        ConfigKey(
            "startingOffsets",
            ConfigType.STRING,
            "Where the task's very first run starts (and where DELETE /offsets goes back to).",
            default="earliest",
            choices=("earliest", "latest"),
        ),
        ConfigKey(
            "trigger.interval.ms",
            ConfigType.LONG,
            "Micro-batch interval (a batch that ends early waits for the next multiple).",
            default=str(TRIGGER_INTERVAL_MS),
            minimum=100,
        ),
    )

    def validate(self, config: Mapping[str, str]) -> dict[str, list[str]]:
        """Topic names, and no topic copied into itself on one cluster."""
        errors: dict[str, list[str]] = {}
        topics = _topics(config)
        form = config.get("target.topic.format", "${topic}")
        for topic in topics:
            for name, value in (("topics", topic), ("target.topic.format", _target(form, topic))):
                try:
                    validate_topic(value)
                except ValueError as exc:
                    errors.setdefault(name, []).append(str(exc))
        same_cluster = config.get("source.servers", "") == config.get("target.servers", "")
        if same_cluster and form == "${topic}" and topics:
            errors.setdefault("target.topic.format", []).append(
                "the target is the source on the same cluster: set target.servers or a "
                "target.topic.format such as ${topic}-replica"
            )
        return errors

    def task_configs(self, config: Mapping[str, str], max_tasks: int) -> list[dict[str, str]]:
        """The topics dealt round-robin over at most `max_tasks` tasks."""
        topics = _topics(config)
        count = max(1, min(max_tasks, len(topics)))
        return [{**config, "topics": ",".join(topics[i::count])} for i in range(count)]

    def check_offsets(self, config: Mapping[str, str], entries: Sequence[OffsetEntry]) -> list[str]:
        """What is wrong with a PATCH /offsets body's entries (none: it may be written)."""
        try:
            _altered(entries, _topics(config))
        except ValueError as exc:
            return [str(exc)]
        return []

    def connector_offsets(
        self, config: Mapping[str, str], scope: OffsetsScope
    ) -> list[dict[str, Any]]:
        """GET /connectors/{c}/offsets: every task's decided source positions (a PATCH body).

        Read at the target cluster's sink coordinator, which holds them whether the tasks run
        or are stopped; a task that never started shows nothing.

        Raises:
            FerryError: the coordinator cannot be asked now (the REST API answers 503).
        """
        tasks = {int(Path(d).name) for d in scope.checkpoint_dirs if Path(d).name.isdecimal()}
        tasks |= set(range(len(self.task_configs(config, int(config.get("tasks.max") or "1")))))
        fences = [sink_id_for(scope.connector, scope.incarnation, task) for task in sorted(tasks)]
        target = config.get("target.servers") or scope.namesrv_addr
        decided = asyncio.run(_decided_positions(target, fences))
        return offset_entries(decided, _topics(config))

    def build(self, spark: Any, config: Mapping[str, str], context: TaskContext) -> Any:
        """The task's query: fence, find where to start, read its topics, write each row."""
        from pyspark.sql import functions

        from ferrymq.spark.options import WriteOptions
        from ferrymq.spark.sink import start_sink

        source = config.get("source.servers") or context.namesrv_addr
        target = config.get("target.servers") or context.namesrv_addr
        form = config.get("target.topic.format", "${topic}")
        topics = _topics(config)
        names = {t: _target(form, t) for t in topics}
        if config.get("target.topic.create", "true").lower() == "true":
            asyncio.run(_create_targets(source, target, names))
        sink_id = sink_id_of(context)
        change = context.extra.get("offsets")
        change = change if isinstance(change, OffsetsPut) else None
        starting = config.get("startingOffsets", "earliest")
        plan = asyncio.run(_plan(source, target, names, starting, change))
        options = WriteOptions(servers=target, sink_id=sink_id, generation=context.generation)
        state = asyncio.run(
            start_sink(
                options,
                change=change.request_id if change is not None else None,
                start=plan.start,
                replace=change is not None and change.offsets is None,
            )
        )
        checkpoint = Path(context.checkpoint_dir)
        resumed = _drop_stale(checkpoint, sink_id, state.run)
        positions = state.positions or {}
        initial = {t: positions[t] for t in topics if t in positions}
        log.info(
            "FerrymqReplicator %s task %d (sink %s, generation %d): %s",
            context.connector,
            context.task,
            sink_id,
            context.generation,
            "from its checkpoint" if resumed else f"from the decided positions {initial}",
        )
        rows = (
            spark.readStream.format("ferrymq")
            .option("servers", source)
            .option("subscribe", ",".join(topics))
            .option("startingOffsets", "earliest")
            .option("initialOffsets", json.dumps(initial, sort_keys=True))
            .option("includeHeaders", "true")
            .option("includeFerryColumns", "true")
            .load()
        )
        out = rows.select(
            "key",
            "value",
            "headers",
            _target_topic(functions, names).alias("topic"),
            _partition(functions, plan.queues, plan.spread).alias("partition"),
            functions.col("topic").alias("sourceTopic"),
            functions.col("brokerName").alias("sourceBroker"),
            functions.col("queueId").alias("sourceQueueId"),
            functions.col("offset").alias("sourceOffset"),
        )
        writer = (
            out.writeStream.format("ferrymq")
            .option("servers", target)
            .option("sinkId", sink_id)
            .option("generation", str(context.generation))
            .option("checkpointLocation", context.checkpoint_dir)
        )
        return self.start_query(writer, config, context)


def _topics(config: Mapping[str, str]) -> list[str]:
    return sorted({t.strip() for t in config.get("topics", "").split(",") if t.strip()})


def _target(form: str, topic: str) -> str:
    return form.replace("${topic}", topic)


def _clean(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def sink_id_of(context: TaskContext) -> str:
    """`<connector>:<incarnation>:<task>`, with `_` for what a sink id cannot hold (<= 128)."""
    return sink_id_for(context.connector, context.incarnation, context.task)


def sink_id_for(connector: str, incarnation: str, task: int) -> str:
    """A task's sink (and fence) id: `sink_id_of` from its parts."""
    sink_id = f"{_clean(connector)}:{_clean(incarnation)}:{task}"
    if len(sink_id) > 128:  # still unique: the whole id's checksum stands for the cut part
        sink_id = f"{sink_id[:110]}_{zlib.crc32(sink_id.encode()):08x}:{task}"[-128:]
    return sink_id


async def _decided_positions(servers: str, fences: Sequence[str]) -> list[Positions]:
    """The positions each fence id's decisions recorded (those the coordinator knows)."""
    found: list[Positions] = []
    async with SinkClient(servers, timeout=_OFFSETS_WAIT_S, retry_for=_OFFSETS_WAIT_S) as sink:
        coordinator = await sink.coordinator(None)  # the replicator's sink names no topic
        for fence in fences:
            try:
                state = await sink.query_fence(coordinator, fence)
            except SinkFenceNotFoundError:
                continue  # the task never started
            if state.positions:
                found.append(state.positions)
    return found


def offset_entries(decided: Sequence[Positions], topics: Sequence[str]) -> list[dict[str, Any]]:
    """KIP-875 entries (`{"topic", "broker", "queue"}`, `{"offset": next}`) of `topics`.

    Sorted by topic, broker and queue id; each position once (a later task's wins).
    """
    merged: dict[tuple[str, str, int], int] = {}
    for positions in decided:
        for topic, brokers in positions.items():
            if topic not in topics:
                continue  # no longer read: a PATCH naming it would be refused
            for broker, queues in brokers.items():
                for queue, offset in queues.items():
                    merged[(topic, broker, int(queue))] = offset
    return [
        {"partition": {"topic": t, "broker": b, "queue": q}, "offset": {"offset": offset}}
        for (t, b, q), offset in sorted(merged.items())
    ]


def queue_map(source: Sequence[MessageQueue], target: Sequence[MessageQueue]) -> dict[str, int]:
    """Source queue (`broker:queue id`) -> the target queue's stable partition (module doc).

    Both lists in route order (broker name, then queue id); `target` the writable queues.
    """
    from ferrymq.spark.plan import stable_partition

    ordered = sorted(source, key=lambda q: (q.broker_name, q.queue_id))
    writable = sorted(target, key=lambda q: (q.broker_name, q.queue_id))
    if not writable:
        return {}
    groups = sorted({q.broker_name for q in ordered})
    target_groups = sorted({q.broker_name for q in writable})

    def ids(queues: Sequence[MessageQueue], broker: str) -> set[int]:
        return {q.queue_id for q in queues if q.broker_name == broker}

    same_shape = len(groups) == len(target_groups) and all(
        ids(ordered, a) == ids(writable, b) for a, b in zip(groups, target_groups, strict=True)
    )
    mapping: dict[str, int] = {}
    for index, queue in enumerate(ordered):
        if same_shape:
            group = target_groups[groups.index(queue.broker_name)]
            mapping[f"{queue.broker_name}:{queue.queue_id}"] = stable_partition(
                group, queue.queue_id
            )
        else:
            chosen = writable[index % len(writable)]
            mapping[f"{queue.broker_name}:{queue.queue_id}"] = stable_partition(
                chosen.broker_name, chosen.queue_id
            )
    return mapping


class _Plan:
    """What the query needs from both clusters: queue maps and where a first start starts."""

    def __init__(
        self, queues: dict[str, dict[str, int]], spread: dict[str, list[int]], start: Positions
    ) -> None:
        self.queues = queues
        """Per source topic, `queue_map`."""
        self.spread = spread
        """Per source topic, the target's partitions (for source queues that appear later)."""
        self.start = start


async def _routed(client: Any, topic: str, where: str) -> list[MessageQueue]:
    deadline = time.monotonic() + _ROUTE_WAIT_S
    while True:
        try:
            queues: list[MessageQueue] = await client.queues(topic)
        except TopicNotFoundError:
            queues = []
        if queues:
            return queues
        if time.monotonic() > deadline:
            raise FerryError(f"topic {topic} has no queue in the {where} cluster's route")
        client.routes.invalidate(topic)
        await asyncio.sleep(0.2)


async def _plan(
    source: str,
    target: str,
    names: dict[str, str],
    starting: str,
    change: OffsetsPut | None,
) -> _Plan:
    from ferrymq.spark.plan import stable_partition

    queues: dict[str, dict[str, int]] = {}
    spread: dict[str, list[int]] = {}
    start: Positions = {}
    async with PullConsumer(source, "ferrymq-replicator") as consumer, SinkClient(target) as sink:
        for topic, name in sorted(names.items()):
            read = await _routed(consumer, topic, "source")
            written = await _routed(sink, name, "target")
            queues[topic] = queue_map(read, written)
            spread[topic] = sorted(stable_partition(q.broker_name, q.queue_id) for q in written)
            if change is not None and change.offsets is not None:
                continue
            if starting == "latest":  # pinned at the first start, so a restart starts there too
                for queue in read:
                    offset = await consumer.max_offset(queue)
                    start.setdefault(topic, {}).setdefault(queue.broker_name, {})[
                        str(queue.queue_id)
                    ] = offset
        if change is not None and change.offsets is not None:
            mine = [e for e in change.offsets if e.partition.get("topic") in names]
            for (topic, broker, queue_id), given in _altered(mine, list(names)).items():
                if given is None:  # earliest: where the queue starts now
                    given = await consumer.min_offset(MessageQueue(topic, broker, queue_id))
                start.setdefault(topic, {}).setdefault(broker, {})[str(queue_id)] = given
    return _Plan(queues, spread, start)


def _altered(
    entries: Sequence[OffsetEntry], topics: Sequence[str]
) -> dict[tuple[str, str, int], int | None]:
    """PATCH /offsets entries: (topic, broker, queue id) -> offset (None: earliest).

    Raises:
        ValueError: an entry of another shape, or of a topic the connector does not read.
    """
    altered: dict[tuple[str, str, int], int | None] = {}
    for entry in entries:
        partition, offset = entry.partition, entry.offset
        topic, broker, queue = (partition.get(k) for k in ("topic", "broker", "queue"))
        if not isinstance(topic, str) or not isinstance(broker, str) or queue is None:
            raise ValueError(
                'a partition is {"topic": t, "broker": b, "queue": q}, not ' + json.dumps(partition)
            )
        if topic not in topics:
            raise ValueError(f"topic {topic} is not one of the connector's topics")
        if not str(queue).isdecimal():
            raise ValueError(f"queue {queue!r} of {topic}/{broker} is not a queue id")
        value = None if offset is None else offset.get("offset")
        if offset is not None and (not str(value).isdecimal()):
            raise ValueError(f'the offset of {topic}/{broker}/{queue} is {{"offset": n >= 0}}')
        altered[(topic, broker, int(str(queue)))] = None if value is None else int(str(value))
    return altered


def _checkpoint_run(checkpoint: Path) -> str | None:
    """The Spark query id a checkpoint holds (its `metadata` file), if any."""
    try:
        found = json.loads((checkpoint / "metadata").read_text().splitlines()[0]).get("id")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return found if isinstance(found, str) else None


def _drop_stale(checkpoint: Path, sink_id: str, last_run: str | None) -> bool:
    """Keep the checkpoint only if its run made the sink's last decision (or none was made).

    A checkpoint of an older run (the task ran on another worker since) would read again what
    that worker copied: Spark's files go (the runtime's `ferrymq-*` files stay) and the query
    starts from the decided positions. Returns whether the query resumes from its checkpoint.
    """
    offsets = checkpoint / "offsets"
    planned = offsets.is_dir() and any(p.name.isdecimal() for p in offsets.iterdir())
    if not planned:
        return False
    mine = f"{sink_id}/{_checkpoint_run(checkpoint)}"
    if last_run is None or last_run == mine:
        return True
    log.warning(
        "checkpoint %s is stale (run %s; the sink's last decision was made by %s): starting "
        "from the decided positions",
        checkpoint,
        mine,
        last_run,
    )
    for entry in checkpoint.iterdir():
        if entry.name.startswith("ferrymq-"):
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return False


def _target_topic(functions: Any, names: dict[str, str]) -> Any:
    column = functions.col("topic")
    if all(topic == name for topic, name in names.items()):
        return column
    pairs = [functions.lit(x) for topic, name in sorted(names.items()) for x in (topic, name)]
    return functions.try_element_at(functions.create_map(*pairs), column)


def _partition(
    functions: Any, queues: dict[str, dict[str, int]], spread: dict[str, list[int]]
) -> Any:
    """The target partition of each row: the queue map, else a hash of its source queue."""
    name = functions.concat_ws(
        ":",
        functions.col("topic"),
        functions.col("brokerName"),
        functions.col("queueId").cast("string"),
    )
    pairs = [
        functions.lit(x)
        for topic, mapping in sorted(queues.items())
        for queue, partition in sorted(mapping.items())
        for x in (f"{topic}:{queue}", partition)
    ]
    mapped = functions.try_element_at(functions.create_map(*pairs), name)
    choices = functions.try_element_at(
        functions.create_map(
            *[
                functions.lit(x)
                for topic, partitions in sorted(spread.items())
                for x in (topic, functions.array(*[functions.lit(p) for p in partitions]))
            ]
        ),
        functions.col("topic"),
    )
    hashed = functions.try_element_at(
        choices,
        functions.pmod(functions.crc32(name.cast("binary")), functions.size(choices)).cast("int")
        + 1,
    )
    return functions.coalesce(mapped, hashed).cast("int")


async def _create_targets(source: str, target: str, names: dict[str, str]) -> None:
    """Create each missing target topic with its source topic's queue count (per group)."""
    async with AdminClient(source) as source_admin, AdminClient(target) as target_admin:
        for topic, name in sorted(names.items()):
            if await target_admin.route(name) is not None:
                continue
            route = await source_admin.route(topic)
            queues = max((q.write_queue_nums for q in route.queue_datas), default=8) if route else 8
            log.info("creating the replica topic %s (%d queues per group)", name, queues)
            await target_admin.create_topic(name, queues=queues)
