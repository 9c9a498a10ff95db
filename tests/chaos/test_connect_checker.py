"""The Connect checks flag each anomaly in a synthetic history, only that one, and nothing in a
clean one (a checker that cannot fail proves nothing): lost and refused writes, contradictory
answers, states no write explains, workers that end apart, and a raw config log with two claims
of one epoch or a record written under an older claim."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.chaos.checker import ANOMALIES, check
from ferrymq.chaos.connect_check import (
    CONNECT_ANOMALIES,
    CREATE_OPS,
    Write,
    apply,
    possible_states,
)
from ferrymq.chaos.connect_workload import connector_config
from ferrymq.chaos.history import ConnectorView, Event, EventType, LogEntry

WORKERS = ("n15-worker1", "n16-worker2", "n17-worker3")
_REFUSED_NO_LEADER = "this worker is not the leader (the leader is w2 at http://127.0.0.16:8083)"


def _status(kind: str) -> int:
    if kind in CREATE_OPS:
        return 201
    return {"patch": 200, "pause": 202}.get(kind, 204)


@dataclass
class History:
    events: list[Event] = field(default_factory=list)
    clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1000, 1000))
    values: itertools.count[int] = field(default_factory=itertools.count)

    def add(self, proc: str, type_: EventType, f: str, **fields: object) -> None:
        fields.update(proc=proc, type=type_, f=f, i=len(self.events), t_ns=next(self.clock))
        self.events.append(msgspec.convert(fields, Event))

    def write(
        self,
        conn: str,
        kind: str,
        outcome: EventType = "ok",
        status: int | None = None,
        message: str | None = None,
        value: str | None = None,
    ) -> str:
        proc = conn.split("-", 1)[0]
        v = value or f"{proc}-{next(self.values)}"
        fields: dict[str, object] = {"conn": conn, "op": kind, "v": v, "node": WORKERS[1]}
        self.add(proc, "invoke", "cwrite", **fields)
        if status is None:
            status = _status(kind) if outcome == "ok" else 504 if outcome == "info" else 409
        if message is None and outcome == "fail" and status == 409:
            message = _REFUSED_NO_LEADER
        self.add(proc, outcome, "cwrite", **fields, status=status, error=message)
        return v

    def final(self, view: dict[str, tuple[str, str]], offset: int = 40, workers: int = 3) -> None:
        for node in WORKERS[:workers]:
            self.view(node, view, offset)
        self.add("connect-observer", "ok", "cconverged")

    def view(self, node: str, view: dict[str, tuple[str, str]], offset: int = 40) -> None:
        shown = {
            name: ConnectorView(
                state=state, config=connector_config(x), tasks=0 if state == "STOPPED" else 1
            )
            for name, (x, state) in view.items()
        }
        self.add("connect-observer", "ok", "cview", node=node, off=offset, view=shown)

    def log(self, records: list[LogEntry], end: int | None = None) -> None:
        shown = records[-1].offset + 1 if records else 0
        fields = {"node": WORKERS[0], "records": records, "off": shown if end is None else end}
        self.add("connect-observer", "ok", "clog", **fields)


def _claim(offset: int, epoch: int, writer: str) -> LogEntry:
    return LogEntry(offset, offset, "Claim", epoch, writer, claimed=epoch)


def _record(offset: int, epoch: int | None, writer: str, kind: str = "ConnectorPut") -> LogEntry:
    return LogEntry(offset, offset, kind, epoch, writer)


def _good_log() -> list[LogEntry]:
    return [
        _claim(0, 1, "w1"),
        _record(1, 1, "w1", "Snapshot"),
        _record(2, 1, "w1"),
        _claim(3, 2, "w2"),
        _record(4, 2, "w2", "Snapshot"),
        _record(5, 2, "w2", "TargetPut"),
    ]


def _found(h: History) -> dict[str, int]:
    return {k: v for k, v in check(h.events).anomalies.items() if v}


def _clean() -> History:
    h = History()
    a = h.write("k0-c0", "create")
    h.write("k0-c0", "create", "fail", 409, "Connector k0-c0 already exists")
    b = h.write("k0-c0", "patch")
    h.write("k0-c0", "stop")
    h.write("k0-c1", "pause", "fail", 404, "Connector k0-c1 not found")
    c = h.write("k0-c1", "create-stopped")
    h.write("k0-c1", "patch", "fail")  # no leader: nothing written
    h.write("k0-c1", "delete")
    h.write("k1-c0", "create", "info")  # unknown, and the last write of k1-c0
    assert a != b != c
    h.final({"k0-c0": (b, "STOPPED")})
    h.log(_good_log())
    return h


def test_a_clean_connect_history_has_no_anomaly_and_lists_every_name() -> None:
    results = check(_clean().events)
    assert results.valid, results.examples
    assert set(CONNECT_ANOMALIES) <= set(results.anomalies) == set(ANOMALIES)
    assert results.stats["connect_acked"] == 5
    assert results.stats["connect_failed"] == 3
    assert results.stats["connect_unknown"] == 1
    assert results.stats["connect_claims"] == 2
    assert results.stats["connect_converged"] == 1


def test_a_history_without_connect_has_no_connect_stats() -> None:
    h = History()
    h.add("p0", "invoke", "send", q="broker-a/0", v="p0-0")
    h.add("p0", "fail", "send", q="broker-a/0", v="p0-0", error="test")
    assert not any(k.startswith("connect") for k in check(h.events).stats)


def test_an_unknown_write_may_have_landed_or_not() -> None:
    for landed in (False, True):
        h = History()
        v = h.write("k0-c0", "create")
        w = h.write("k0-c0", "patch", "info")
        h.final({"k0-c0": (w if landed else v, "PAUSED")})
        assert not _found(h), landed


def test_an_unknown_write_may_land_after_a_later_acknowledged_one() -> None:
    h = History()
    h.write("k0-c0", "create")
    late = h.write("k0-c0", "patch", "info")  # held by a paused follower
    h.write("k0-c0", "patch")
    h.final({"k0-c0": (late, "PAUSED")})  # it was forwarded when the follower resumed
    assert not _found(h)


def test_an_acknowledged_write_missing_from_a_worker_is_lost() -> None:
    h = History()
    v = h.write("k0-c0", "create")
    w = h.write("k0-c0", "patch")
    h.view(WORKERS[0], {"k0-c0": (w, "PAUSED")})
    h.view(WORKERS[1], {"k0-c0": (v, "PAUSED")})  # behind: the patch is missing
    found = _found(h)
    assert found.pop("connect-lost-write") == 1
    assert found == {"connect-divergence": 1}
    example = check(h.events).examples["connect-lost-write"][0]
    assert "n16-worker2" in example
    assert "patch" in example


def test_an_acknowledged_creation_missing_everywhere_is_lost() -> None:
    h = History()
    h.write("k0-c0", "create")
    h.final({})
    assert _found(h) == {"connect-lost-write": 3}


def test_an_acknowledged_deletion_undone_is_lost() -> None:
    h = History()
    v = h.write("k0-c0", "create")
    h.write("k0-c0", "delete")
    h.final({"k0-c0": (v, "PAUSED")})
    assert _found(h) == {"connect-lost-write": 3}


def test_a_refused_write_that_took_effect_is_refused_applied() -> None:
    h = History()
    h.write("k0-c0", "create")
    h.write("k0-c0", "stop", "fail")  # 409: no leader
    h.final({"k0-c0": (h.events[0].v or "", "STOPPED")})
    assert _found(h) == {"connect-refused-applied": 3}


def test_a_refused_creation_that_exists_is_refused_applied() -> None:
    h = History()
    v = h.write("k0-c0", "create", "fail", 400, "Connector configuration is invalid")
    h.final({"k0-c0": (v, "PAUSED")})
    assert _found(h) == {"connect-refused-applied": 3}


def test_a_connector_or_value_no_write_set_is_unexplained() -> None:
    h = History()
    h.write("k0-c0", "create")
    h.final({"k0-c0": ("garbage", "PAUSED"), "phantom": ("x", "PAUSED")})
    assert _found(h) == {"connect-unexplained-state": 6}


def test_answers_that_contradict_each_other_are_inconsistent() -> None:
    h = History()
    v = h.write("k0-c0", "create")
    h.write("k0-c0", "create")  # a second 201 without a delete between
    h.write("k1-c0", "create")
    h.write("k1-c0", "patch", "fail", 404, "Connector k1-c0 not found")
    h.final({"k0-c0": (v, "PAUSED")})
    found = _found(h)
    assert found.pop("connect-inconsistent-answers") == 2
    assert found == {}


def test_a_decided_refusal_after_an_unknown_write_may_be_right() -> None:
    h = History()
    h.write("k0-c0", "create", "info")  # it may not have landed ...
    h.write("k0-c0", "patch", "fail", 404, "Connector k0-c0 not found")  # ... and it had not
    h.final({})
    assert not _found(h)


def test_workers_ending_apart_diverge() -> None:
    h = History()
    v = h.write("k0-c0", "create")
    h.view(WORKERS[0], {"k0-c0": (v, "PAUSED")}, offset=40)
    h.view(WORKERS[1], {"k0-c0": (v, "PAUSED")}, offset=41)
    h.add("connect-observer", "fail", "cview", node=WORKERS[2], error="ConnectError: refused")
    h.add("connect-observer", "fail", "cconverged", error="not converged in 60 s")
    assert _found(h) == {"connect-divergence": 3}


def test_two_claims_of_one_epoch_break_the_claim_order() -> None:
    h = History()
    h.log([*_good_log(), _claim(6, 2, "w3"), _claim(7, 4, "w1")])
    results = check(h.events)
    assert {k: v for k, v in results.anomalies.items() if v} == {"connect-claim-order": 2}
    assert "w3 claims epoch 2" in results.examples["connect-claim-order"][0]


def test_a_record_of_an_older_epoch_after_a_newer_claim_is_stale() -> None:
    h = History()
    h.log([*_good_log(), _record(6, 1, "w1"), _record(7, 2, "w3"), _record(8, None, "")])
    results = check(h.events)
    assert {k: v for k, v in results.anomalies.items() if v} == {"connect-stale-record": 3}
    assert (
        "epoch 1 by 'w1' after w2's claim of epoch 2" in results.examples["connect-stale-record"][0]
    )


def test_copies_forward_of_older_records_are_not_stale() -> None:
    h = History()
    copies = [LogEntry(6, 2, "ConnectorPut", 1, "w1"), LogEntry(7, 1, "Snapshot", 1, "w1")]
    h.log([*_good_log(), *copies, _record(8, 2, "w2")])
    assert not _found(h)


def test_an_unreadable_record_is_corrupt() -> None:
    h = History()
    h.log([*_good_log(), LogEntry(6, 6, "unreadable", 2, "w2")])
    assert _found(h) == {"connect-corrupt-record": 1}


def test_a_raw_log_shown_short_of_the_workers_offset_is_short() -> None:
    h = History()
    h.log(_good_log(), end=9)  # the workers applied records 6, 7 and 8
    h.add("connect-observer", "fail", "clog", off=9, error="n15-worker1: ReadTimeout")
    results = check(h.events)
    assert {k: v for k, v in results.anomalies.items() if v} == {"connect-short-log": 2}
    assert "shown up to offset 6, the workers reached 9" in results.examples["connect-short-log"][0]


def test_a_write_answered_500_is_an_unexpected_status() -> None:
    h = History()
    h.write("k0-c0", "create", "info", 500, "KeyError: 'x'")
    h.final({})
    assert _found(h) == {"connect-unexpected-status": 1}


# ---------------------------------------------------------------- generated clean histories


@dataclass
class _Pending:
    write: Write
    name: str
    lands_at: int | None
    """The step at which the unknown write takes effect (None: never)."""


@st.composite
def clean_histories(draw: st.DrawFn) -> History:
    """Clients writing to their connectors through a leader that answers truthfully: each write
    applied and acknowledged, refused with nothing written (no leader, or a decision on the
    state), or of unknown outcome and then lost, applied at once, or applied any number of
    steps later (after the client's later writes). Every worker ends on the true state."""
    h = History()
    rng = random.Random(draw(st.integers(0, 2**32)))
    names = ["k0-c0", "k0-c1", "k1-c0"]
    truth: dict[str, tuple[str | None, str] | None] = dict.fromkeys(names)
    pending: list[_Pending] = []
    steps = draw(st.integers(0, 40))
    for step in range(steps):
        for p in [p for p in pending if p.lands_at == step]:
            truth[p.name] = apply(p.write.op, p.write.value, truth[p.name])[1]
            pending.remove(p)
        name = rng.choice(names)
        kind = rng.choice(["create", "create-stopped", "patch", "patch", "pause", "stop", "delete"])
        ok, after = apply(kind, f"v{step}", truth[name])
        fate = rng.choice(["ok", "ok", "refused", "lost", "now", "later"])
        if fate == "ok" and ok:
            h.write(name, kind, "ok", value=f"v{step}")
            truth[name] = after
        elif fate in ("ok", "refused"):
            if not ok:
                message = (
                    f"Connector {name} already exists"
                    if kind in CREATE_OPS
                    else f"Connector {name} not found"
                )
                status = 409 if kind in CREATE_OPS else 404
                h.write(name, kind, "fail", status, message, value=f"v{step}")
            else:
                h.write(name, kind, "fail", value=f"v{step}")
        else:
            h.write(name, kind, "info", value=f"v{step}")
            if fate == "now":
                truth[name] = after
            elif fate == "later":
                write = Write(kind, f"v{step}", "info")
                pending.append(_Pending(write, name, rng.randint(step + 1, steps + 1)))
    for p in pending:
        if p.lands_at is not None and p.lands_at <= steps:
            truth[p.name] = apply(p.write.op, p.write.value, truth[p.name])[1]
    h.final({n: (s[0] or "", s[1]) for n, s in truth.items() if s is not None})
    h.log(_good_log())
    return h


@settings(max_examples=300)
@given(clean_histories())
def test_generated_clean_connect_histories_have_no_anomaly(history: History) -> None:
    results = check(history.events)
    assert results.valid, results.examples


def test_possible_states_of_ordered_writes() -> None:
    writes = [
        Write("create", "a", "ok"),
        Write("patch", "b", "info"),
        Write("stop", "", "ok"),
        Write("delete", "", "fail", 409, _REFUSED_NO_LEADER),
    ]
    states, broken = possible_states(writes)
    assert broken is None
    assert states == {("a", "STOPPED"), ("b", "STOPPED")}
    loose, _ = possible_states(writes, refused_may_apply=True)
    assert None in loose
