"""`FerrymqReplicator`: topics of one ferrymq cluster copied into another (or into other topics).

Each task is one streaming query `readStream.format("ferrymq")` -> `writeStream.format("ferrymq")`:
exactly once, because the ferrymq sink commits each micro-batch once (prepared rows, a
replicated first-winner decision per batch) under a sink id that names the connector
incarnation and task, so a task moved to another worker or restarted from its checkpoint finishes
a batch instead of writing it twice. Keys, tags and properties go with the body.

Config (besides `name`, `connector.class`, `tasks.max`):
- `topics`: the source topics (comma-separated); tasks split them;
- `source.servers` / `target.servers`: NameServer addresses (default: the worker's cluster);
- `target.topic.format`: the target topic, `${topic}` standing for the source topic
  (default `${topic}`; copying a topic into itself on one cluster is refused);
- `target.topic.create`: create a missing target topic with the source topic's queue count
  (default true, as MirrorMaker creates remote topics);
- `startingOffsets`: `earliest` (default) or `latest`, for a task's first start;
- `trigger.interval.ms`: the micro-batch interval (default 1000).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from ferrymq.client.admin import AdminClient
from ferrymq.connect.plugin import ConfigKey, ConfigType, ConnectorPlugin, TaskContext
from ferrymq.model import validate_topic

__all__ = ["FerrymqReplicator"]

log = logging.getLogger(__name__)


class FerrymqReplicator(ConnectorPlugin):
    """ferrymq topics to ferrymq topics, exactly once."""

    type = "source"
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
            "Where a task's first run starts.",
            default="earliest",
            choices=("earliest", "latest"),
        ),
        ConfigKey(
            "trigger.interval.ms",
            ConfigType.LONG,
            "Micro-batch interval.",
            default="1000",
            minimum=100,
        ),
    )

    def validate(self, config: Mapping[str, str]) -> dict[str, list[str]]:
        """Topic names, and no topic copied into itself on one cluster."""
        errors: dict[str, list[str]] = {}
        topics = [t.strip() for t in config.get("topics", "").split(",") if t.strip()]
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
        topics = sorted({t.strip() for t in config["topics"].split(",") if t.strip()})
        count = max(1, min(max_tasks, len(topics)))
        return [{**config, "topics": ",".join(topics[i::count])} for i in range(count)]

    def build(self, spark: Any, config: Mapping[str, str], context: TaskContext) -> Any:
        """The task's query: read its topics, write each row to its target topic."""
        from pyspark.sql import functions

        source = config.get("source.servers") or context.namesrv_addr
        target = config.get("target.servers") or context.namesrv_addr
        form = config.get("target.topic.format", "${topic}")
        prefix, _, suffix = form.partition("${topic}")
        if config.get("target.topic.create", "true").lower() == "true":
            topics = [t.strip() for t in config["topics"].split(",") if t.strip()]
            asyncio.run(_create_targets(source, target, {t: _target(form, t) for t in topics}))
        rows = (
            spark.readStream.format("ferrymq")
            .option("servers", source)
            .option("subscribe", config["topics"])
            .option("startingOffsets", config.get("startingOffsets", "earliest"))
            .option("includeHeaders", "true")
            .load()
        )
        out = rows.select(
            "key",
            "value",
            "headers",
            functions.concat(functions.lit(prefix), "topic", functions.lit(suffix)).alias("topic"),
        )
        interval = int(config.get("trigger.interval.ms", "1000"))
        return (
            out.writeStream.format("ferrymq")
            .option("servers", target)
            .option("sinkId", f"{context.connector}:{context.incarnation}:{context.task}")
            .option("checkpointLocation", context.checkpoint_dir)
            .queryName(f"{context.connector}-{context.task}")
            .trigger(processingTime=f"{interval} milliseconds")
            .start()
        )


def _target(form: str, topic: str) -> str:
    return form.replace("${topic}", topic)


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
