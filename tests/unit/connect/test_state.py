"""The config state as a fold of the log: snapshots, copy-forward, retention, incarnations."""

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from hypothesis import example, given
from hypothesis import strategies as st

from ferrymq.connect import decide
from ferrymq.connect.errors import ConnectRestError
from ferrymq.connect.plugin import ConfigKey, ConfigType, ConnectorPlugin, Plugins
from ferrymq.connect.records import (
    COPY,
    AssignedTask,
    Assignment,
    Claim,
    ConnectorPut,
    Record,
    Snapshot,
    TargetPut,
    TargetState,
    decode_record,
    encode_record,
    logical_offset,
)
from ferrymq.connect.state import ConfigState


class Splitter(ConnectorPlugin):
    """A plugin whose task configs are a pure function of its config (as every plugin's are)."""

    type = "sink"
    keys = (ConfigKey("topics", ConfigType.STRING, "topics to read", required=True),)

    def task_configs(self, config: Mapping[str, str], max_tasks: int) -> list[dict[str, str]]:
        topics = config["topics"].split(",")
        count = min(max_tasks, len(topics))
        return [{**config, "topics": ",".join(topics[i::count])} for i in range(count)]


PLUGINS = Plugins({"Splitter": Splitter})


@dataclass
class Log:
    """A fenced topic's queue as the broker keeps it: records, copies, a deleted prefix."""

    entries: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    first: int = 0
    """Index of the first stored entry (retention deleted the ones before)."""
    live_start: int = 0

    def append(self, record: Record, props: dict[str, str] | None = None) -> None:
        offset = len(self.entries)
        if isinstance(record, Snapshot):
            self.live_start = offset
        self.entries.append((offset, dict(props or {}), encode_record(record)))

    def copy_forward(self) -> None:
        """The broker's copy of the live tail before retention deletes it."""
        tail = self.entries[self.live_start :]
        start = len(self.entries)
        for offset, props, body in tail:
            copy = {**props, COPY: props.get(COPY, str(offset))}
            self.entries.append((len(self.entries), copy, body))
        self.live_start = start

    def retain_from(self, index: int) -> None:
        self.first = max(self.first, min(index, self.live_start))

    def stored(self) -> list[tuple[int, dict[str, str], bytes]]:
        return self.entries[self.first :]

    def live(self) -> list[tuple[int, dict[str, str], bytes]]:
        """From the live start (GET_FENCE), which retention never deletes."""
        assert self.first <= self.live_start
        return self.entries[self.live_start :]


def replay(entries: list[tuple[int, dict[str, str], bytes]], state: ConfigState) -> ConfigState:
    for offset, props, body in entries:
        state.apply(decode_record(body), logical_offset(offset, props))
    return state


def follow(log: Log, reader: ConfigState, position: int) -> ConfigState:
    """Read on from queue offset `position` as `ConfigLog` does (broker/fence.py rule 6).

    While the record at `position` is stored, the reader reads on from it; once retention has
    deleted it, the reader reads the live tail into an empty state, which then replaces its own.
    Never from the first stored record: the records stored before the live start would be
    applied to an empty state and hide the copies of the older ones behind them.
    """
    if position < log.first:
        reader.replace(replay(log.live(), ConfigState()))
        return reader
    return replay(log.entries[position:], reader)


def same(a: ConfigState, b: ConfigState) -> bool:
    return a.image() == b.image()


ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "create",
                "update",
                "pause",
                "resume",
                "stop",
                "delete",
                "restart",
                "snapshot",
                "claim",
                "assign",
                "copy",
                "retain",
            ]
        ),
        st.sampled_from(["a", "b", "c"]),
        st.integers(1, 4),
    ),
    min_size=1,
    max_size=40,
)


def run(script: list[tuple[str, str, int]]) -> tuple[Log, ConfigState]:
    """Play a leader's decisions into a log (each applied as the leader reads it back)."""
    log = Log()
    state = ConfigState()
    ids = (f"id{i}" for i in itertools.count())
    log.append(Claim(1, "w1", "http://w1"))
    replay(log.stored()[-1:], state)
    for op, name, n in script:
        record: Record | None = None
        try:
            if op == "create":
                topics = ",".join(f"t{i}" for i in range(n))
                config = {"connector.class": "Splitter", "topics": topics, "tasks.max": str(n)}
                record = decide.create(state, PLUGINS, name, config, make_id=lambda: next(ids))
            elif op == "update" and name in state.connectors:
                config = {**state.connectors[name].config, "tasks.max": str(n)}
                record = decide.put_config(state, PLUGINS, name, config)
            elif op in ("pause", "resume", "stop"):
                target = {
                    "pause": TargetState.PAUSED,
                    "resume": TargetState.RUNNING,
                    "stop": TargetState.STOPPED,
                }[op]
                record = decide.set_target(state, PLUGINS, name, target)
            elif op == "delete":
                record = decide.delete(state, name)
            elif op == "restart":
                record = decide.restart_task(state, name, n - 1, make_id=lambda: next(ids))
            elif op == "snapshot":
                record = Snapshot(state.image())
            elif op == "claim":
                record = Claim(state.epoch + 1, f"w{n}", f"http://w{n}")
            elif op == "assign":
                wanted = state.wanted_tasks()
                record = Assignment(
                    generation=state.assignment.generation + 1,
                    epoch=state.epoch,
                    tasks=[AssignedTask(c, i, t, f"w{t % n}", 1) for c, i, t in wanted],
                )
            elif op == "copy":
                log.copy_forward()
                state = replay(log.stored()[-(len(log.entries) - log.live_start) :], state)
            elif op == "retain":
                log.retain_from(len(log.entries) - n)
        except ConnectRestError:
            continue
        if record is not None:
            log.append(record)
            replay(log.entries[-1:], state)
    return log, state


# retention kept create b (queue offset 2) but not the claim and create a before it
RETAINED_BEFORE_THE_LIVE_START = [
    ("create", "a", 1),
    ("create", "b", 1),
    ("copy", "a", 1),
    ("retain", "a", 4),
]


@given(ops)
@example(RETAINED_BEFORE_THE_LIVE_START)
def test_a_reader_starting_at_the_live_start_reaches_the_writer_s_state(
    script: list[tuple[str, str, int]],
) -> None:
    log, writer = run(script)
    reader = replay(log.live(), ConfigState())
    assert same(reader, writer)


@given(ops, st.data())
def test_a_reader_that_stopped_anywhere_catches_up_through_copies(
    script: list[tuple[str, str, int]], data: st.DataObject
) -> None:
    log, writer = run(script)
    cut = data.draw(st.integers(0, len(log.entries)))
    reader = replay(log.entries[:cut], ConfigState())  # it kept up, then stopped
    assert same(follow(log, reader, cut), writer)


def test_records_stored_before_the_live_start_are_not_where_a_reader_starts() -> None:
    log, writer = run(RETAINED_BEFORE_THE_LIVE_START)
    assert (log.first, log.live_start, len(log.entries)) == (2, 3, 6)
    # what the model once did: an empty state fed from the first stored record (create b)
    # skips the copies of the claim and of create a, whose logical offsets are below it
    wrong = replay(log.stored(), ConfigState())
    assert (wrong.epoch, sorted(wrong.connectors)) == (0, ["b"])
    assert (writer.epoch, sorted(writer.connectors)) == (1, ["a", "b"])
    for cut in range(len(log.entries) + 1):  # offsets 0 and 1 gone: over from the live start
        reader = replay(log.entries[:cut], ConfigState())
        assert same(follow(log, reader, cut), writer), cut


@given(ops)
def test_snapshot_then_its_tail_equals_the_full_replay(script: list[tuple[str, str, int]]) -> None:
    log, writer = run(script)
    full = replay(log.entries, ConfigState())
    snapshots = [i for i, (_, _, body) in enumerate(log.entries) if b'"snapshot"' in body]
    for index in snapshots:
        offset, props, body = log.entries[index]
        record = decode_record(body)
        assert isinstance(record, Snapshot)
        restored = ConfigState.from_image(record.state, logical_offset(offset, props))
        assert same(replay(log.entries[index + 1 :], restored), full)
    assert same(full, writer)


def test_records_of_a_deleted_incarnation_never_touch_the_new_one() -> None:
    state = ConfigState()
    config = {"connector.class": "Splitter", "topics": "t0,t1", "tasks.max": "2"}
    old = decide.create(state, PLUGINS, "a", config, make_id=lambda: "old")
    state.apply(old, 0)
    state.apply(decide.delete(state, "a"), 1)
    fresh = decide.create(state, PLUGINS, "a", {**config, "tasks.max": "1"}, make_id=lambda: "new")
    state.apply(fresh, 2)
    # a stale writer's (or a late copy's) records of the old incarnation
    state.apply(TargetPut("a", "old", TargetState.PAUSED), 3)
    state.apply(ConnectorPut("a", "old", {**config, "x": "1"}, [{}, {}]), 4)
    connector = state.connectors["a"]
    assert (connector.incarnation, connector.target, len(connector.tasks)) == (
        "new",
        TargetState.RUNNING,
        1,
    )
    assert "x" not in connector.config


def test_claims_and_assignments_only_move_forward() -> None:
    state = ConfigState()
    state.apply(Claim(3, "w3", "u3"), 0)
    state.apply(Claim(2, "w2", "u2"), 1)
    assert (state.epoch, state.leader_id) == (3, "w3")
    state.apply(Assignment(5, 3, []), 2)
    state.apply(Assignment(4, 3, [AssignedTask("a", "i", 0, "w", 4)]), 3)
    assert (state.assignment.generation, state.assignment.tasks) == (5, [])
    assert not state.apply(Claim(9, "w9", "u9"), 3)  # at or below the last logical offset
    assert state.epoch == 3
