"""The checker flags each anomaly in a synthetic history, only that one, and nothing in a clean one.

A checker that cannot fail proves nothing (reference/reliability-harness.md §0.6): every anomaly
name has a history here that must produce it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.chaos.checker import ANOMALIES, check
from ferrymq.chaos.history import (
    CORRUPT_VALUE,
    Event,
    EventType,
    HistoryWriter,
    read_history,
)

Q0 = "broker-a/0"
Q1 = "broker-a/1"
MASTER = "127.0.0.2:10911"


@dataclass
class History:
    """Builds a history with increasing times."""

    events: list[Event] = field(default_factory=list)
    clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1000, 1000))

    def add(self, proc: str, type_: EventType, f: str, **fields: object) -> None:
        fields.update(proc=proc, type=type_, f=f, i=len(self.events), t_ns=next(self.clock))
        self.events.append(msgspec.convert(fields, Event))

    def send(
        self,
        proc: str,
        v: str,
        q: str = Q0,
        outcome: EventType = "ok",
        off: int | None = None,
        node: str = MASTER,
        epoch: int | None = None,
    ) -> None:
        self.add(proc, "invoke", "send", q=q, v=v)
        if outcome == "ok":
            self.add(proc, "ok", "send", q=q, v=v, off=off, node=node, epoch=epoch)
        else:
            self.add(proc, outcome, "send", q=q, v=v, error="test")

    def poll(self, proc: str, reads: dict[str, list[tuple[int, str]]], gen: int = 0) -> None:
        self.add(proc, "invoke", "poll")
        self.add(proc, "ok", "poll", reads=reads, gen=gen, node=MASTER)

    def drain(self, reads: dict[str, list[tuple[int, str]]]) -> None:
        self.add("drain", "invoke", "drain")
        self.add("drain", "ok", "drain", reads=reads, gen=0, node=MASTER)
        self.add("drain", "ok", "drained")


def _found(history: History) -> dict[str, int]:
    return {k: v for k, v in check(history.events).anomalies.items() if v}


def _clean() -> History:
    """Two producers, one consumer, a drain: the baseline every anomaly test perturbs."""
    h = History()
    h.send("p0", "p0-0", off=0)
    h.send("p1", "p1-0", off=1)
    h.send("p0", "p0-1", off=2)
    h.send("p1", "p1-1", outcome="fail")
    h.send("p1", "p1-2", outcome="info")
    h.poll("c0", {Q0: [(0, "p0-0"), (1, "p1-0")]})
    h.poll("c0", {Q0: [(2, "p0-1")]})
    h.drain({Q0: [(0, "p0-0"), (1, "p1-0"), (2, "p0-1")]})
    return h


def test_a_clean_history_has_no_anomaly_and_lists_every_name() -> None:
    results = check(_clean().events)
    assert results.valid
    assert set(results.anomalies) == set(ANOMALIES)
    assert not any(results.anomalies.values())
    assert results.stats["acked"] == 3
    assert results.stats["failed"] == 1
    assert results.stats["unknown"] == 1
    assert results.stats["drain_complete"] == 1
    assert results.stats["redelivered"] == 3  # the drain re-reads what c0 read


def test_an_acked_send_never_read_is_lost() -> None:
    h = _clean()
    h.send("p0", "p0-2", off=3)
    assert _found(h) == {"lost": 1}


def test_an_acked_send_read_during_the_run_but_not_by_the_final_drain_is_lost() -> None:
    h = History()
    h.send("p0", "p0-0", off=0)
    h.send("p0", "p0-1", off=1)
    h.poll("c0", {Q0: [(0, "p0-0"), (1, "p0-1")]})
    h.drain({Q0: [(0, "p0-0")]})  # a failover truncated p0-1 away after c0 read it
    results = check(h.events)
    assert {k: v for k, v in results.anomalies.items() if v} == {"lost": 1}
    assert "not by the final drain" in results.examples["lost"][0]


def test_an_unknown_send_that_was_read_is_recovered_not_an_anomaly() -> None:
    h = _clean()
    h.drain({Q0: [(3, "p1-2")]})
    results = check(h.events)
    assert results.valid
    assert results.stats["recovered"] == 1


def test_a_value_never_sent_is_unexpected() -> None:
    h = _clean()
    h.drain({Q0: [(3, "garbage")]})
    assert _found(h) == {"unexpected": 1}


def test_a_read_of_a_failed_send_is_an_aborted_read() -> None:
    h = _clean()
    h.drain({Q0: [(3, "p1-1")]})
    assert _found(h) == {"aborted-read": 1}


def test_one_value_at_two_offsets_is_duplicated() -> None:
    h = _clean()
    h.drain({Q0: [(3, "p0-1")]})
    assert _found(h) == {"duplicated": 1}


def test_two_values_at_one_offset_are_inconsistent_offsets() -> None:
    h = _clean()
    h.send("p0", "p0-2", off=3)
    h.drain({Q0: [(3, "p0-2")]})
    h.poll("c1", {Q0: [(3, "p1-2")]})  # the unknown send, read at the same offset
    assert _found(h) == {"inconsistent-offsets": 1}


def test_a_producers_acks_going_back_in_one_queue_are_nonmonotonic_send() -> None:
    h = History()
    h.send("p0", "p0-0", off=5)
    h.send("p0", "p0-1", off=4)
    h.drain({Q0: [(4, "p0-1"), (5, "p0-0")]})
    assert _found(h) == {"nonmonotonic-send": 1}


def test_a_poll_starting_before_the_last_read_is_nonmonotonic() -> None:
    h = _clean()
    h.poll("c0", {Q0: [(1, "p1-0")]})
    assert _found(h) == {"nonmonotonic-poll": 1}


def test_a_new_generation_may_start_over() -> None:
    h = _clean()
    h.poll("c0", {Q0: [(0, "p0-0")]}, gen=1)
    assert check(h.events).valid


def test_a_poll_starting_past_the_next_offset_skips() -> None:
    h = History()
    for i in range(4):
        h.send("p0", f"p0-{i}", off=i)
    h.poll("c0", {Q0: [(0, "p0-0")]})
    h.poll("c0", {Q0: [(2, "p0-2"), (3, "p0-3")]})
    h.drain({Q0: [(0, "p0-0"), (1, "p0-1"), (2, "p0-2"), (3, "p0-3")]})
    assert _found(h) == {"poll-skip": 1}


def test_gaps_and_reversals_inside_one_poll_are_internal() -> None:
    h = History()
    for i in range(4):
        h.send("p0", f"p0-{i}", off=i)
    h.poll("c0", {Q0: [(0, "p0-0"), (2, "p0-2")]})
    h.poll("c1", {Q0: [(1, "p0-1"), (0, "p0-0")]})
    h.drain({Q0: [(0, "p0-0"), (1, "p0-1"), (2, "p0-2"), (3, "p0-3")]})
    assert _found(h) == {"int-poll-skip": 1, "int-nonmonotonic-poll": 1}


def _dump(
    h: History,
    node: str,
    entries: list[tuple[int, str, int]],
    confirm: int,
    epochs: list[tuple[int, int]] | None = None,
    q: str = Q0,
) -> None:
    h.add(
        "observer",
        "ok",
        "dump",
        node=node,
        group=q.split("/", 1)[0],
        confirm=confirm,
        epochs=epochs or [(1, 0)],
        entries={q: entries},
    )


REPLICA = [(0, "p0-0", 0), (1, "p1-0", 100), (2, "p0-1", 200)]


def test_replicas_that_agree_below_the_confirm_offset_are_fine() -> None:
    h = _clean()
    _dump(h, "n2", REPLICA, confirm=300)
    _dump(h, "n3", REPLICA, confirm=300)
    _dump(h, "n4", [*REPLICA[:2], (2, "p1-2", 200)], confirm=200)  # its tail is unconfirmed
    assert check(h.events).valid


def test_replicas_disagreeing_below_the_confirm_offset_diverge() -> None:
    h = _clean()
    _dump(h, "n2", REPLICA, confirm=300)
    _dump(h, "n3", [REPLICA[0], (1, "p1-2", 100), REPLICA[2]], confirm=300)
    assert _found(h) == {"replica-divergence": 1}


def test_a_corrupt_record_below_the_confirm_offset_diverges() -> None:
    h = _clean()
    _dump(h, "n2", REPLICA, confirm=300)
    _dump(h, "n3", [REPLICA[0], (1, CORRUPT_VALUE, 100), REPLICA[2]], confirm=300)
    assert _found(h) == {"replica-divergence": 1}


def test_a_replica_missing_a_record_below_its_confirm_offset_lost_it() -> None:
    h = _clean()
    _dump(h, "n2", REPLICA, confirm=300)
    _dump(h, "n3", REPLICA[:2], confirm=300)
    assert _found(h) == {"lost-on-replica": 1}


def test_an_epoch_file_going_back_is_an_epoch_regression() -> None:
    h = _clean()
    _dump(h, "n2", REPLICA, confirm=300, epochs=[(1, 0), (3, 100), (2, 200)])
    assert _found(h) == {"epoch-regression": 1}


def test_an_observed_epoch_going_back_is_an_epoch_regression() -> None:
    h = _clean()
    h.add("observer", "ok", "role", node="n2", group="broker-a", role="master", epoch=2)
    h.add("observer", "ok", "role", node="n2", group="broker-a", role="master", epoch=1)
    assert _found(h) == {"epoch-regression": 1}


def test_two_masters_at_one_epoch_are_dual_masters() -> None:
    h = _clean()
    h.add("observer", "ok", "role", node="n2", group="broker-a", role="master", epoch=2)
    h.add("observer", "ok", "role", node="n3", group="broker-a", role="slave", epoch=2)
    h.add("observer", "ok", "role", node="n3", group="broker-a", role="master", epoch=2)
    assert _found(h) == {"dual-master": 1}


def test_a_deposed_master_acking_after_its_successor_is_a_dual_master() -> None:
    h = History()
    h.send("p0", "p0-0", off=0, node="A", epoch=1)
    h.send("p0", "p0-1", off=1, node="B", epoch=2)
    h.send("p1", "p1-0", off=2, node="A", epoch=1)
    h.drain({Q0: [(0, "p0-0"), (1, "p0-1"), (2, "p1-0")]})
    assert _found(h) == {"dual-master": 1}


def test_a_master_returning_with_a_newer_epoch_is_fine() -> None:
    h = History()
    h.send("p0", "p0-0", off=0, node="A", epoch=1)
    h.send("p0", "p0-1", off=1, node="B", epoch=2)
    h.send("p0", "p0-2", off=2, node="A", epoch=3)
    h.drain({Q0: [(0, "p0-0"), (1, "p0-1"), (2, "p0-2")]})
    assert check(h.events).valid


QB = "broker-b/0"


def _two_groups() -> History:
    """Both groups' masters at epoch 1 take sends in turn; both groups' replicas agree."""
    h = History()
    for node, group in (("n2", "broker-a"), ("n21", "broker-b")):
        h.add("observer", "ok", "role", node=node, group=group, role="master", epoch=1)
    h.send("p0", "p0-0", off=0, node="n2", epoch=1)
    h.send("p0", "p0-1", q=QB, off=0, node="n21", epoch=1)
    h.send("p1", "p1-0", off=1, node="n2", epoch=1)
    h.send("p1", "p1-1", q=QB, off=1, node="n21", epoch=1)
    h.poll("c0", {Q0: [(0, "p0-0")], QB: [(0, "p0-1")]})
    h.drain({Q0: [(0, "p0-0"), (1, "p1-0")], QB: [(0, "p0-1"), (1, "p1-1")]})
    for node in ("n2", "n3"):
        _dump(h, node, [(0, "p0-0", 0), (1, "p1-0", 100)], confirm=200)
    for node in ("n21", "n22"):
        _dump(h, node, [(0, "p0-1", 0), (1, "p1-1", 100)], confirm=200, q=QB)
    return h


def test_two_groups_with_masters_at_the_same_epoch_taking_turns_are_fine() -> None:
    results = check(_two_groups().events)
    assert results.valid, results.examples
    assert results.stats["acked"] == 4
    assert results.stats["acked@broker-a"] == 2
    assert results.stats["acked@broker-b"] == 2


def test_on_the_second_group_loss_skips_and_replica_gaps_are_found_too() -> None:
    h = _two_groups()
    h.send("p0", "p0-2", q=QB, off=2, node="n21", epoch=1)  # acked, never read
    h.poll("c0", {QB: [(1, "p1-1"), (2, "p0-2")]})
    h.poll("c0", {QB: [(0, "p0-1")]})  # back to an offset before the last read
    _dump(h, "n23", [(0, "p0-1", 0)], confirm=200, q=QB)  # lacks @1, below its confirm
    assert _found(h) == {"lost": 1, "nonmonotonic-poll": 1, "lost-on-replica": 1}


def test_a_deposed_master_of_the_second_group_acking_late_is_a_dual_master() -> None:
    h = History()
    h.send("p0", "p0-0", off=0, node="n2", epoch=1)
    h.send("p0", "p0-1", q=QB, off=0, node="n21", epoch=1)
    h.send("p0", "p0-2", q=QB, off=1, node="n22", epoch=2)
    h.send("p0", "p0-3", off=1, node="n2", epoch=1)  # broker-a's master: not a second master
    h.send("p1", "p1-0", q=QB, off=2, node="n21", epoch=1)  # broker-b's old one: it is
    h.drain({Q0: [(0, "p0-0"), (1, "p0-3")], QB: [(0, "p0-1"), (1, "p0-2"), (2, "p1-0")]})
    assert _found(h) == {"dual-master": 1}


def _commit(h: History, offset: int, type_: EventType = "ok", q: str = Q0) -> None:
    h.add("c0", "invoke", "commit", group="g", offsets={q: offset})
    h.add("c0", type_, "commit", group="g", offsets={q: offset})


def _committed(h: History, offset: int, q: str = Q0) -> None:
    h.add("c1", "invoke", "committed", group="g")
    h.add("c1", "ok", "committed", group="g", offsets={q: offset})


def test_a_stored_position_below_an_acked_commit_is_a_commit_regression() -> None:
    h = _clean()
    _commit(h, 2)
    _committed(h, 2)
    _commit(h, 3)
    _committed(h, 2)
    assert _found(h) == {"commit-regression": 1}


def test_a_commit_of_unknown_outcome_may_be_missing() -> None:
    h = _clean()
    _commit(h, 2)
    _commit(h, 3, "info")
    _committed(h, 2)
    assert check(h.events).valid


def test_acked_commits_going_back_are_a_commit_regression() -> None:
    h = _clean()
    _commit(h, 3)
    _commit(h, 1)
    assert _found(h) == {"commit-regression": 1}


def test_faults_and_operations_are_counted() -> None:
    h = _clean()
    h.add("nemesis", "info", "kill", targets=["n2"])
    h.add("nemesis", "info", "restart", targets=["n2"])
    h.add("nemesis", "info", "kill", targets=["n3"])
    results = check(h.events)
    assert results.faults == {"kill": 2, "restart": 1}
    assert results.operations["send"] == {"ok": 3, "fail": 1, "info": 1}


def test_the_history_file_round_trips(tmp_path: Path) -> None:
    h = _clean()
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        for event in h.events:
            writer.write(event, event.t_ns)
    assert read_history(path) == h.events


@st.composite
def clean_histories(draw: st.DrawFn) -> History:
    """Producers sending to three queues on two broker groups with random outcomes, consumers
    reading in order, commits that only grow, a complete drain, and replicas that agree."""
    h = History()
    log: dict[str, list[str]] = {Q0: [], Q1: [], QB: []}
    positions: dict[str, dict[str, int]] = {
        "c0": {Q0: 0, Q1: 0, QB: 0},
        "c1": {Q0: 0, Q1: 0, QB: 0},
    }
    committed = {Q0: 0, Q1: 0, QB: 0}
    counters = {"p0": 0, "p1": 0, "p2": 0}
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["send", "send", "send", "poll", "commit"]),
                st.sampled_from(sorted(counters)),
                st.sampled_from([Q0, Q1, QB]),
                st.sampled_from(["ok", "ok", "ok", "fail", "info", "info-stored"]),
                st.sampled_from(sorted(positions)),
                st.integers(1, 4),
            ),
            max_size=60,
        )
    )
    for action, proc, q, outcome, consumer, count in steps:
        if action == "send":
            v = f"{proc}-{counters[proc]}"
            counters[proc] += 1
            if outcome == "ok":
                log[q].append(v)
                h.send(proc, v, q, "ok", off=len(log[q]) - 1)
            elif outcome == "info-stored":
                log[q].append(v)
                h.send(proc, v, q, "info")
            else:
                h.send(proc, v, q, "fail" if outcome == "fail" else "info")
        elif action == "poll":
            start = positions[consumer][q]
            batch = [(o, log[q][o]) for o in range(start, min(start + count, len(log[q])))]
            if batch:
                h.poll(consumer, {q: batch})
                positions[consumer][q] = batch[-1][0] + 1
        else:
            position = max(committed[q], positions[consumer][q])
            committed[q] = position
            _commit(h, position, q=q)
            _committed(h, position, q=q)
    h.drain({q: list(enumerate(values)) for q, values in log.items()})
    entries = [(o, v, 100 * o) for o, v in enumerate(log[Q0])]
    for node in ("n2", "n3", "n4"):
        _dump(h, node, entries, confirm=100 * len(entries))
    entries = [(o, v, 100 * o) for o, v in enumerate(log[QB])]
    for node in ("n21", "n22", "n23"):
        _dump(h, node, entries, confirm=100 * len(entries), q=QB)
    return h


@given(clean_histories())
def test_generated_clean_histories_have_no_anomaly(history: History) -> None:
    results = check(history.events)
    assert results.valid, results.examples
