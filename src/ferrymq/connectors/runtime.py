"""The Connect task runtime on Spark: one SparkSession per worker, one streaming query per task.

The session starts lazily, on the worker's first task (a worker with only paused or stopped
connectors starts no JVM), with `ferrymq.spark.session.local_session` on `SPARK_MASTER`
(`local[<2 x cores>,4]`: failed tasks retried) by default or `--spark-master` when the work
outgrows one machine. Every Spark call runs on one dedicated thread: Spark finds a Python data
source's sink through the session of the calling thread, and the event loop must never block on
the JVM.

The runtime owns what a plugin's query must not choose: the checkpoint
(`<storePathRootDir>/<cluster>/<connector>/<incarnation>/<task>`, created afresh when an offsets
change is applied), the query name (`plugin.query_name`: `<connector>-<task>`), the trigger
interval (`trigger.interval.ms`, else the plugin's default: `ConnectorPlugin.trigger_interval`),
and the task's fencing generation, all passed in `TaskContext` (a plugin starts its writer with
`ConnectorPlugin.start_query`, which applies them). A task's state comes from its query: active
or not, its exception, its last progress (batch id, rows/s).

A session from `session_factory` belongs to the caller (tests share one between in-process
workers): `close` stops the runner's queries but not that session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ferrymq.connect.plugin import Plugins, TaskContext, query_name, task_checkpoint_dir
from ferrymq.connect.state import TaskKey
from ferrymq.connect.tasks import TaskSpec

__all__ = ["SPARK_MASTER", "TRIGGER_INTERVAL_MS", "SparkTaskRunner", "lag"]

log = logging.getLogger(__name__)

T = TypeVar("T")

WORKER_SLOTS_PER_CORE = 2
"""Spark task slots a worker's local master gives each core of this process.

A connector's Spark tasks mostly wait (a PostgresSink writer pulls its range from the broker,
then waits while PostgreSQL takes the COPY; a source waits on its database or the broker), so
one slot per core leaves the cores idle during those waits. Measured with `ferry bench
connectors` (PostgresSink steady, 200k rows over 4 queues, 2 cores, 2026-11-26): 2 slots
(`local[*,4]`) 1.06 s median of 7 against 4 slots 0.88 s median of 5, psycopg COPY 0.52 / 0.48 s
beside them: 0.49x -> 0.54x of COPY. Kafka Connect's tasks are threads, likewise not bound to
cores."""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


SPARK_MASTER = f"local[{WORKER_SLOTS_PER_CORE * _cores()},4]"
"""A worker's Spark master unless configured: two task slots per core of this machine
(`WORKER_SLOTS_PER_CORE`), a failed task tried 4 times.

Spark's `local[N]` never retries a task (maxFailures 1: `spark.task.maxFailures` is not read in
local mode), so one transient task failure (a Python worker lost, a task binary that fails to
deserialise) failed the whole query, where a cluster retries it 4 times. `local[N,F]` gives local
mode the cluster's default. A retried writer task stays exact: each plugin's writer commits what
it wrote together with the positions it read up to (PostgresSink: rows and stored offsets in one
transaction, so a retry of an attempt that committed skips every row; the ferrymq sink and
FileSink: the driver's commit of the micro-batch, which names only successful attempts' work).
"""

TRIGGER_INTERVAL_MS = 200
"""`trigger.interval.ms`'s default for the plugins that read ferrymq (PostgresSink, the replicator).

Spark's ProcessingTime trigger starts a batch at each multiple of the interval; a batch that ends
early waits for the next multiple, one that ends late lets the next start at once. A backlog a
few micro-batches long therefore ends with a wait of up to one interval: at 1000 ms up to 1 s of
the steady sink bench's 1.3-1.6 s runs (docs/benchmarks.md). An idle task pays one empty trigger
per interval: the source's `latestOffset` (one route lookup and the covered queues' offsets
from their brokers) and no batch (`noDataMicroBatches` is off): for a 4-queue topic about 2.1 ms
of CPU in the source's Python process and 1 ms in the NameServer and broker together (measured
over 200 look-ups). 200 ms bounds that wait at a fifth of it for five such look-ups a second;
`0` (as fast as possible) would poll every `spark.sql.streaming.pollingDelay` (10 ms) when idle.
The file plugins keep 1000 ms: a shorter interval there makes more, smaller files (FileSink) or
lists the directory more often (FileSource).
"""

_APPLIED = "ferrymq-offsets-request"
"""A file in a task's checkpoint directory: the offsets change it was started from."""


@dataclass(slots=True)
class _Query:
    query: Any
    run_id: str
    trace: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def lag(sources: list[Any]) -> int | None:
    """Messages the sources hold beyond the last batch (`latestOffset` - `endOffset`, per leaf).

    The offsets are the sources' JSON (ferrymq's: topic -> broker -> queue -> next offset); a
    leaf that is not a number on both sides counts nothing. None: no source reports its latest.
    """
    total: int | None = None
    for source in sources:
        try:
            end, latest = json.loads(source["endOffset"]), json.loads(source["latestOffset"])
        except (KeyError, TypeError, ValueError):
            continue
        total = (total or 0) + _behind(end, latest)
    return total


def _behind(end: Any, latest: Any) -> int:
    if isinstance(latest, dict):
        ends = end if isinstance(end, dict) else {}
        return sum(_behind(ends.get(k), v) for k, v in latest.items())
    if type(latest) is int and type(end) is int:
        return max(0, latest - end)
    return 0


class SparkTaskRunner:
    """Runs tasks as Spark Structured Streaming queries of their plugins."""

    def __init__(
        self,
        plugins: Plugins,
        *,
        cluster_id: str,
        namesrv_addr: str,
        state_dir: Path,
        spark_master: str = SPARK_MASTER,
        session_factory: Callable[[str, str], Any] | None = None,
    ) -> None:
        self._plugins = plugins
        self._cluster_id = cluster_id
        self._namesrv_addr = namesrv_addr
        self._state_dir = state_dir
        self._master = spark_master
        self._factory = session_factory
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spark")
        self._spark: Any = None
        self._queries: dict[TaskKey, _Query] = {}

    async def _on_spark(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work)

    def _session(self) -> Any:
        if self._spark is None:
            if self._factory is None:
                from ferrymq.spark.session import local_session

                self._spark = local_session(f"ferrymq-connect-{self._cluster_id}", self._master)
            else:
                self._spark = self._factory(f"ferrymq-connect-{self._cluster_id}", self._master)
        return self._spark

    def checkpoint_dir(self, key: TaskKey) -> Path:
        """Where a task's checkpoint lives."""
        connector, incarnation, task = key
        return task_checkpoint_dir(self._state_dir, self._cluster_id, connector, incarnation, task)

    async def start(self, spec: TaskSpec) -> str:
        """Start the task's query (the session first, if this is the worker's first task)."""
        _, cls = self._plugins.resolve(spec.connector_config["connector.class"])
        plugin = cls()
        checkpoint = self.checkpoint_dir(spec.key)
        context = TaskContext(
            connector=spec.key[0],
            incarnation=spec.key[1],
            task=spec.key[2],
            generation=spec.generation,
            cluster_id=self._cluster_id,
            namesrv_addr=self._namesrv_addr,
            checkpoint_dir=str(checkpoint),
            extra={"offsets": spec.offsets},
            query_name=query_name(spec.key[0], spec.key[2]),
            trigger_interval_ms=plugin.trigger_interval(spec.task_config),
        )

        def run() -> _Query:
            if spec.offsets is not None:
                marker = checkpoint / _APPLIED
                applied = marker.read_text() if marker.exists() else ""
                if applied != spec.offsets.request_id:  # start over from the changed offsets
                    shutil.rmtree(checkpoint, ignore_errors=True)
                    checkpoint.mkdir(parents=True, exist_ok=True)
                    marker.write_text(spec.offsets.request_id)
            checkpoint.mkdir(parents=True, exist_ok=True)
            query = plugin.build(self._session(), spec.task_config, context)
            # recorded here, not after the await: a caller cancelled meanwhile (its worker
            # closing) leaves the query to `close`, not running unknown
            self._queries[spec.key] = started = _Query(query, str(query.runId))
            return started

        started = await self._on_spark(run)
        log.info(
            "task %s/%d started: query %s, generation %d",
            spec.key[0],
            spec.key[2],
            started.run_id,
            spec.generation,
        )
        return started.run_id

    async def stop(self, key: TaskKey) -> None:
        """Stop the task's query (its checkpoint stays)."""
        running = self._queries.pop(key, None)
        if running is not None:
            await self._on_spark(running.query.stop)

    async def refresh(self) -> None:
        """Read every query's state and last progress."""

        def read() -> None:
            for running in self._queries.values():
                query = running.query
                if not query.isActive and running.trace is None:
                    error = query.exception()
                    running.trace = (
                        "".join(traceback.format_exception(error)) if error else "the query stopped"
                    )
                progress = query.lastProgress
                if progress:
                    running.metrics = {
                        "batch_id": progress.get("batchId"),
                        "input_rows_per_second": progress.get("inputRowsPerSecond"),
                        "processed_rows_per_second": progress.get("processedRowsPerSecond"),
                        "num_input_rows": progress.get("numInputRows"),
                        "lag": lag(progress.get("sources") or []),
                    }
                if query.isActive:
                    running.metrics["query_status"] = query.status.get("message")

        if self._queries:
            await self._on_spark(read)

    def failure(self, key: TaskKey) -> str | None:
        """The trace of a query that ended by itself (after `refresh`)."""
        running = self._queries.get(key)
        return None if running is None else running.trace

    def metrics(self, key: TaskKey) -> dict[str, Any]:
        """The query's last progress figures (after `refresh`)."""
        running = self._queries.get(key)
        return {} if running is None else dict(running.metrics)

    async def close(self) -> None:
        """Stop every query, and the session unless it came from `session_factory`.

        Spark calls queued or running first finish (a start whose caller was cancelled, when its
        worker closed, cannot be stopped before it has started).
        """
        await self._on_spark(lambda: None)
        for key in list(self._queries):
            await self.stop(key)
        if self._spark is not None:
            spark, self._spark = self._spark, None
            if self._factory is None:
                await self._on_spark(spark.stop)
        self._thread.shutdown(wait=False)
