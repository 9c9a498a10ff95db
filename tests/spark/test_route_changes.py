"""A streaming query across random route changes reads the topic row for row, no duplicates.

The real `FerryStreamReader` plans every micro-batch (initialOffset, latestOffset, partitions,
read). `ModelQueues`, its `QueueSource`, plays the cluster: a topic whose queues live on broker
groups, where between any two steps of the query queues are added, a group leaves the route (all
its replicas down past the NameServer's expiry) and returns with its data, a queue count shrinks
and grows back, and messages are produced to whatever the route holds; a read of a queue the
route lacks fails as the real one does after failoverTimeoutMs (`RetryableQueryError`).
`Engine` plays Spark's micro-batch engine over a checkpoint: an offsets log and a commits log of
JSON texts (batches run only when the end's text differs from the start's), a sink idempotent
per batch id (as Parquet's is), `initialOffset` asked again when batch 0 is replayed, and a
restart from the checkpoint after any failure or crash. Once the route is whole again and the
query drains, its output must be every message of the topic exactly once.
"""

import json
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from ferrymq.errors import ConnectError, TopicNotFoundError
from ferrymq.spark.options import ReadOptions, parse_read_options
from ferrymq.spark.plan import (
    EARLIEST,
    Bounds,
    LegacyOffsetsError,
    Offsets,
    QueueKey,
    QueueRange,
    stable_partition,
)
from ferrymq.spark.retry import RetryableQueryError
from ferrymq.spark.rows import read_schema
from ferrymq.spark.source import FerryStreamReader

pytestmark = pytest.mark.spark

TOPIC = "T"
MAX_QUEUES = 8
Row = tuple[str, int, str, int, int, bytes]
"""topic, partition, broker name, queue id, offset, value."""


@dataclass
class ModelTopic:
    """One topic on broker groups: what each queue holds, and what the route shows now."""

    counts: dict[str, int]
    """Each group's queue count (readable = writable), also while the group is not routed."""
    down: set[str] = field(default_factory=set)
    """Groups out of the route."""
    messages: dict[QueueKey, list[bytes]] = field(default_factory=dict)
    sent: int = 0
    widest: dict[str, int] = field(default_factory=dict)
    """Each group's highest queue count so far: the whole route."""

    def __post_init__(self) -> None:
        self.widest = dict(self.counts)

    def routed(self) -> list[QueueKey]:
        return sorted(
            QueueKey(group, i)
            for group, count in self.counts.items()
            if group not in self.down
            for i in range(count)
        )

    def produce(self, count: int, turn: int) -> None:
        queues = self.routed()
        for i in range(count):
            if queues:
                queue = queues[(turn + i) % len(queues)]
                self.messages.setdefault(queue, []).append(f"m{self.sent}".encode())
                self.sent += 1

    def resize(self, group: str, count: int) -> None:
        self.counts[group] = max(1, min(MAX_QUEUES, count))
        self.widest[group] = max(self.widest.get(group, 0), self.counts[group])

    def make_whole(self) -> None:
        self.down.clear()
        self.counts = dict(self.widest)

    def stored(self) -> dict[tuple[str, int, int], bytes]:
        return {
            (key.broker_name, key.queue_id, offset): body
            for key, bodies in self.messages.items()
            for offset, body in enumerate(bodies)
        }


_TOPICS: dict[int, ModelTopic] = {}
"""The model topics by id: a pickled `ModelQueues` (Spark pickles readers) finds the same one."""


class ModelQueues:
    """The reader's `QueueSource` over a `ModelTopic` (no retention: every min offset is 0)."""

    def __init__(self, topic: ModelTopic) -> None:
        _TOPICS[id(topic)] = topic
        self.topic_id = id(topic)

    @property
    def topic(self) -> ModelTopic:
        return _TOPICS[self.topic_id]

    def bounds(self, options: ReadOptions, start: Offsets | None) -> Bounds:
        routed = self.topic.routed()
        if not routed:
            if start is None:
                raise TopicNotFoundError(TOPIC)
            return {}
        return {TOPIC: {k: (0, len(self.topic.messages.get(k, []))) for k in routed}}

    def routes(self, options: ReadOptions, topics: Sequence[str]) -> dict[str, list[QueueKey]]:
        return {t: self.topic.routed() if t == TOPIC else [] for t in topics}

    def times(self, options: ReadOptions, times: dict[str, dict[QueueKey, int]]) -> Any:
        """A model message is stored at the millisecond of its offset (timestamps unused here)."""
        return {
            t: {k: min(ms, len(self.topic.messages.get(k, []))) for k, ms in queues.items()}
            for t, queues in times.items()
        }

    def read(
        self, options: ReadOptions, queue_range: QueueRange, schema: StructType
    ) -> Iterator[Any]:
        key = queue_range.key
        if key not in self.topic.routed():
            raise RetryableQueryError(
                f"reading {key}", ConnectError(str(key), "not in the topic's route now")
            )
        bodies = self.topic.messages.get(key, [])
        start = 0 if queue_range.start == EARLIEST else queue_range.start
        assert 0 <= start <= queue_range.end <= len(bodies), queue_range
        for offset in range(start, queue_range.end):
            yield (
                queue_range.topic,
                queue_range.partition,
                key.broker_name,
                key.queue_id,
                offset,
                bodies[offset],
            )


@dataclass
class Batch:
    """The micro-batch a running query works on."""

    batch_id: int
    start: str
    end: str
    partitions: list[Any] | None = None
    written: bool = False


@dataclass
class Engine:
    """Spark's micro-batch engine, as far as a source sees it, over one checkpoint."""

    topic: ModelTopic
    options: ReadOptions
    limit: ReadLimit
    available_now: bool = False
    offsets: list[str] = field(default_factory=list)
    committed: int = 0
    sink: dict[int, list[Row]] = field(default_factory=dict)
    reader: FerryStreamReader | None = None
    current: str | None = None
    batch: Batch | None = None
    restarts: int = 0
    failures: int = 0

    def _initial(self, reader: FerryStreamReader) -> str:
        first = json.dumps(reader.initialOffset())
        assert json.dumps(reader.initialOffset()) == first  # Spark asks twice
        return first

    def start(self) -> None:
        """A query (re)started from the checkpoint; an uncommitted batch is replayed first."""
        reader = FerryStreamReader(
            self.options,
            read_schema(include_headers=False, include_ferry_columns=False),
            ModelQueues(self.topic),
        )
        reader = pickle.loads(pickle.dumps(reader))  # Spark ships the reader pickled
        if self.available_now:
            reader.prepareForTriggerAvailableNow()
        done = len(self.offsets)
        if done == 0:
            self.current = self._initial(reader)
            self.batch = None
        else:
            self.current = self.offsets[-1]
            if self.committed < done:
                start = self.offsets[-2] if done >= 2 else self._initial(reader)
                self.batch = Batch(done - 1, start, self.offsets[-1])
            else:
                self.batch = None
        self.reader = reader
        self.restarts += 1

    def crash(self) -> None:
        self.reader = None
        self.batch = None

    def _running(self) -> FerryStreamReader | None:
        """The running query's reader; a stopped query is restarted (which may fail)."""
        if self.reader is None:
            try:
                self.start()
            except (TopicNotFoundError, RetryableQueryError):
                self.failures += 1
                self.crash()
        return self.reader

    def plan(self) -> bool:
        """latestOffset, and a new batch in the offsets log when the end moved; whether it did."""
        reader = self._running()
        if reader is None or self.batch is not None:
            return False
        assert self.current is not None
        end = json.dumps(reader.latestOffset(json.loads(self.current), self.limit))
        if self.offsets and end == self.current:
            return False
        self.offsets.append(end)
        self.batch = Batch(len(self.offsets) - 1, self.current, end)
        return True

    def partitions(self) -> None:
        reader = self._running()
        if reader is None or self.batch is None or self.batch.partitions is not None:
            return
        planned = reader.partitions(json.loads(self.batch.start), json.loads(self.batch.end))
        self.batch.partitions = [pickle.loads(pickle.dumps(p)) for p in planned]

    def read(self) -> None:
        """The batch's tasks, into the sink (a failed task fails the query)."""
        reader, batch = self.reader, self.batch
        if reader is None or batch is None or batch.partitions is None or batch.written:
            return
        try:
            rows = [row for p in batch.partitions for row in reader.read(p)]
        except RetryableQueryError:
            self.failures += 1
            self.crash()
            return
        self.sink[batch.batch_id] = rows
        batch.written = True

    def commit(self) -> None:
        if self.batch is not None and self.batch.written:
            self.committed = self.batch.batch_id + 1
            self.current = self.batch.end
            self.batch = None

    def trigger(self) -> bool:
        """One whole micro-batch, as Spark runs it (or a restart); False when nothing was new."""
        if self._running() is None:
            return True
        if self.batch is None and not self.plan():
            return False
        self.partitions()
        self.read()
        self.commit()
        return True

    def drain(self, bound: int = 20_000) -> bool:
        """Run batches until one finds nothing new; False if `bound` triggers did not get there."""
        return any(not self.trigger() for _ in range(bound))

    def output(self) -> list[Row]:
        return [row for batch_id in range(self.committed) for row in self.sink[batch_id]]


def assert_exactly_the_topic(engine: Engine) -> None:
    rows = engine.output()
    got = {(r[2], r[3], r[4]): r[5] for r in rows}
    assert len(got) == len(rows), "a row was read twice"
    assert got == engine.topic.stored(), "the output is not the topic"
    assert all(r[1] == stable_partition(r[2], r[3]) for r in rows)
    assert all(r[0] == TOPIC for r in rows)


def read_options(max_rows: int | None = None, **extra: str) -> ReadOptions:
    raw = {"servers": "127.0.0.1:1", "subscribe": TOPIC, "startingOffsets": "earliest", **extra}
    if max_rows is not None:
        raw["maxOffsetsPerTrigger"] = str(max_rows)
    return parse_read_options(raw, streaming=True)


GROUPS = ["broker-a", "broker-b", "broker-c"]
_group = st.sampled_from(GROUPS)
ROUTE_CHANGES = st.one_of(
    st.tuples(st.just("produce"), st.integers(1, 25)),
    st.tuples(st.just("grow"), _group, st.integers(1, 4)),  # broker-c joins this way
    st.tuples(st.just("shrink"), _group, st.integers(1, 3)),
    st.tuples(st.just("leave"), _group),
    st.tuples(st.just("return"), _group),
)
QUERY_STEPS = st.sampled_from(["plan", "partitions", "read", "commit", "trigger", "crash"])


def change(topic: ModelTopic, step: tuple[Any, ...], turn: int) -> None:
    match step:
        case ("produce", count):
            topic.produce(count, turn)
        case ("grow", group, more):
            topic.resize(group, topic.counts.get(group, 0) + more)
        case ("shrink", group, fewer) if group in topic.counts:
            topic.resize(group, topic.counts[group] - fewer)
        case ("leave", group):
            topic.down.add(group)
        case ("return", group):
            topic.down.discard(group)


def run(engine: Engine, step: str) -> None:
    actions = {
        "plan": engine.plan,
        "partitions": engine.partitions,
        "read": engine.read,
        "commit": engine.commit,
        "trigger": engine.trigger,
        "crash": engine.crash,
    }
    actions[step]()


@given(
    st.lists(st.tuples(st.lists(ROUTE_CHANGES, max_size=2), QUERY_STEPS), max_size=50),
    st.one_of(st.none(), st.integers(1, 40)),
    st.booleans(),
)
def test_a_query_across_random_route_changes_reads_every_message_once(
    steps: list[tuple[list[tuple[Any, ...]], str]], max_rows: int | None, available_now: bool
) -> None:
    """Between any two steps of the query (planning, partitions, reads, commits, crashes), the
    route may change; at the end it is made whole and the query drains."""
    topic = ModelTopic({"broker-a": 4, "broker-b": 4})
    topic.produce(10, 0)
    limit: ReadLimit = ReadAllAvailable() if max_rows is None else ReadMaxRows(max_rows)
    engine = Engine(topic, read_options(max_rows), limit)
    for turn, (changes, step) in enumerate(steps):
        for route_change in changes:
            change(topic, route_change, turn)
        run(engine, step)
    topic.make_whole()
    if available_now:  # drain as Trigger.AvailableNow: a restart with a fixed target
        engine.crash()
        engine.available_now = True
    assert engine.drain(), "the query never drained: empty batches forever?"
    assert_exactly_the_topic(engine)


def test_the_issue_s_scenario_broker_a_grows_under_a_checkpointed_query() -> None:
    """Issue 20: 4+4 queues on broker-a and broker-b, a checkpointed query, broker-a grows to 8.
    Positional offsets shifted broker-b's queues onto broker-a's new ones (rows read twice and
    rows skipped); named queues do not move."""
    topic = ModelTopic({"broker-a": 4, "broker-b": 4})
    engine = Engine(topic, read_options(), ReadAllAvailable())
    topic.produce(80, 0)
    engine.drain()
    engine.crash()  # the query stops; its checkpoint stays
    topic.resize("broker-a", 8)
    topic.produce(120, 3)
    engine.drain()  # restarts from the checkpoint
    assert engine.restarts == 2
    assert_exactly_the_topic(engine)
    assert len(engine.output()) == 200


def test_a_group_out_of_the_route_fails_the_read_and_the_restart_finishes() -> None:
    """A planned range of a group that then leaves the route is never dropped: the read fails
    the query (retryably) and the batch is replayed once the group is back."""
    topic = ModelTopic({"broker-a": 2, "broker-b": 2})
    engine = Engine(topic, read_options(), ReadAllAvailable())
    topic.produce(40, 0)
    assert engine.plan()
    engine.partitions()
    topic.down.add("broker-b")
    engine.read()
    assert (engine.failures, engine.reader) == (1, None)
    assert not engine.drain(bound=5)  # broker-b still away: the replay fails every time
    assert (engine.committed, engine.failures) == (0, 6)
    topic.produce(10, 1)
    topic.down.clear()
    engine.drain()
    assert_exactly_the_topic(engine)


def test_an_old_positional_checkpoint_resumes_when_it_maps_unambiguously() -> None:
    topic = ModelTopic({"broker-a": 3})
    topic.produce(30, 0)
    engine = Engine(topic, read_options(), ReadAllAvailable())
    # the old layout, batch 0 committed up to 4 messages per queue, batch 1 not committed
    engine.offsets = ['{"T": {"0": 4, "1": 4, "2": 4}}', '{"T": {"0": 7, "1": 9, "2": 10}}']
    engine.committed = 1
    engine.sink[0] = [
        (TOPIC, stable_partition("broker-a", q), "broker-a", q, o, topic.messages[k][o])
        for q in range(3)
        for k in [QueueKey("broker-a", q)]
        for o in range(4)
    ]
    engine.drain()
    assert_exactly_the_topic(engine)
    assert json.loads(engine.offsets[-1]) == {TOPIC: {"broker-a": {"0": 10, "1": 10, "2": 10}}}


def test_an_old_checkpoint_of_a_topic_on_two_groups_is_refused() -> None:
    topic = ModelTopic({"broker-a": 2, "broker-b": 2})
    topic.produce(20, 0)
    engine = Engine(topic, read_options(), ReadAllAvailable())
    engine.offsets = ['{"T": {"0": 1, "1": 1, "2": 1, "3": 1}}']
    engine.committed = 1
    engine.start()
    with pytest.raises(LegacyOffsetsError, match="2 broker groups"):
        engine.plan()
    mapped = Engine(
        topic,
        read_options(legacyOffsets="currentRoute"),
        ReadAllAvailable(),
        offsets=engine.offsets,
    )
    mapped.committed = 1
    mapped.sink[0] = [
        (
            TOPIC,
            stable_partition(k.broker_name, k.queue_id),
            k.broker_name,
            k.queue_id,
            0,
            topic.messages[k][0],
        )
        for k in topic.routed()
    ]
    mapped.drain()
    assert_exactly_the_topic(mapped)
