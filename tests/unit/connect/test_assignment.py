"""The leader's sticky assignment: safety (one live owner), stickiness, balance, convergence."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from ferrymq.connect.assignment import rebalance
from ferrymq.connect.records import AssignedTask, Assignment, decode_record
from ferrymq.connect.state import TaskKey

NONE = Assignment(generation=0, epoch=1, tasks=[])


def tasks(count: int, connector: str = "c") -> list[TaskKey]:
    return [(connector, "i", t) for t in range(count)]


def owners(assignment: Assignment) -> dict[TaskKey, str]:
    return {(t.connector, t.incarnation, t.task): t.worker_id for t in assignment.tasks}


def settle(
    current: Assignment,
    wanted: list[TaskKey],
    workers: list[str],
    expired: frozenset[str] = frozenset(),
) -> tuple[Assignment, int]:
    """Rebalance until nothing changes, each worker applying every generation at once."""
    rounds = 0
    while True:
        live = dict.fromkeys(workers, current.generation)
        nxt = rebalance(current, wanted, live, expired, 1)
        if nxt is None:
            return current, rounds
        assert rounds < 10, "the assignment does not converge"
        current, rounds = nxt, rounds + 1


def test_new_tasks_spread_over_the_live_workers() -> None:
    result, _ = settle(NONE, tasks(6), ["w1", "w2", "w3"])
    assert Counter(owners(result).values()) == {"w1": 2, "w2": 2, "w3": 2}
    assert all(t.since == 1 for t in result.tasks)


def test_a_departed_worker_s_tasks_wait_for_the_grace_then_move_alone() -> None:
    start, _ = settle(NONE, tasks(6), ["w1", "w2", "w3"])
    # w3 gone but within the grace: nothing moves
    assert rebalance(start, tasks(6), {"w1": 1, "w2": 1}, set(), 1) is None
    moved = rebalance(start, tasks(6), {"w1": 1, "w2": 1}, {"w3"}, 1)
    assert moved is not None
    before, after = owners(start), owners(moved)
    for key, worker in before.items():
        if worker != "w3":
            assert after[key] == worker  # survivors keep theirs: not restarted
        else:
            assert after[key] in ("w1", "w2")
    kept = {
        (t.connector, t.task): t.since
        for t in moved.tasks
        if before[(t.connector, t.incarnation, t.task)] != "w3"
    }
    assert set(kept.values()) == {1}  # their fencing generation is unchanged
    assert not moved.revoking


def test_a_joining_worker_gets_tasks_only_after_they_were_revoked() -> None:
    start, _ = settle(NONE, tasks(4), ["w1", "w2"])
    first = rebalance(start, tasks(4), {"w1": 1, "w2": 1, "w3": 0}, set(), 1)
    assert first is not None
    assert first.revoking
    revoked = {(t.connector, t.incarnation, t.task) for t in first.revoking}
    assert not revoked & set(owners(first))  # nobody runs them in this generation
    # the old owner has not applied the revoking generation yet: they wait
    old = {t.worker_id for t in first.revoking}
    live = {"w1": 1, "w2": 1, "w3": 1}
    assert rebalance(first, tasks(4), live, set(), 1) is None
    live = dict.fromkeys(live, 2)
    second = rebalance(first, tasks(4), live, set(), 1)
    assert second is not None
    assert not second.revoking
    for key in revoked:
        assert owners(second)[key] == "w3"
        assert owners(second)[key] not in old
    loads = Counter(owners(second).values())
    assert max(loads.values()) - min(loads.values()) <= 1
    assert set(loads) == {"w1", "w2", "w3"}


@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=6),
    st.lists(st.sampled_from(["w1", "w2", "w3", "w4", "w5"]), min_size=1, max_size=5, unique=True),
    st.lists(st.sampled_from(["w1", "w2", "w3", "w4", "w5"]), min_size=1, max_size=5, unique=True),
)
def test_any_change_converges_to_a_balanced_assignment_with_one_owner_each(
    counts: list[int], before: list[str], after: list[str]
) -> None:
    wanted = [key for i, n in enumerate(counts) for key in tasks(n, f"c{i}")]
    start, _ = settle(NONE, wanted, before)
    gone = frozenset(set(before) - set(after))
    end, _ = settle(start, wanted, after, gone)
    placed = owners(end)
    assert set(placed) == set(wanted)
    assert set(placed.values()) <= set(after)
    loads = Counter(placed.values())
    assert max(loads[w] for w in after) - min(loads[w] for w in after) <= 1
    keys = [(t.connector, t.incarnation, t.task) for t in end.tasks]
    assert len(keys) == len(set(keys))  # one owner each
    for task in end.tasks:  # a task that moved has a newer fencing generation
        previous = owners(start).get((task.connector, task.incarnation, task.task))
        if previous != task.worker_id:
            assert task.since > start.generation


@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=5),
    st.lists(st.sampled_from(["w1", "w2", "w3"]), min_size=1, max_size=3, unique=True),
)
def test_changing_one_connector_moves_no_task_of_another(
    counts: list[int], workers: list[str]
) -> None:
    wanted = [key for i, n in enumerate(counts) for key in tasks(n, f"c{i}")]
    start, _ = settle(NONE, wanted, workers)
    changed = [k for k in wanted if k[0] != "c0"] + tasks(counts[0] + 1, "c0")
    end, _ = settle(start, changed, workers)
    # one more task goes to the least loaded worker: loads stay within one, nothing is revoked
    for key, worker in owners(start).items():
        if key[0] != "c0":
            assert owners(end)[key] == worker


def test_no_live_worker_keeps_everything_where_it_was() -> None:
    start, _ = settle(NONE, tasks(2), ["w1"])
    assert rebalance(start, tasks(2), {}, set(), 1) is None
    assert rebalance(start, tasks(2), {}, {"w1"}, 1) is not None  # dropped, assigned nowhere
    dropped = rebalance(start, tasks(2), {}, {"w1"}, 1)
    assert dropped is not None
    assert dropped.tasks == []


def test_unchanged_input_writes_nothing() -> None:
    start, rounds = settle(NONE, tasks(3), ["w1", "w2"])
    assert rounds == 1
    assert rebalance(start, tasks(3), {"w1": 1, "w2": 1}, set(), 1) is None


def test_tasks_no_longer_wanted_leave_the_assignment() -> None:
    start, _ = settle(NONE, tasks(3), ["w1", "w2"])
    end = rebalance(start, tasks(1), {"w1": 1, "w2": 1}, set(), 1)
    assert end is not None
    assert [(t.task, t.since) for t in end.tasks] == [(0, 1)]
    assert AssignedTask("c", "i", 0, owners(start)[("c", "i", 0)], 1) in end.tasks


# ---------------------------------------------------------------- runs: a restarted worker process


def test_a_worker_restarted_within_the_grace_keeps_its_tasks_under_a_new_generation() -> None:
    start, _ = settle(NONE, tasks(4), ["w1", "w2"])
    runs = {"w1": "a1", "w2": "b1"}
    first = rebalance(start, tasks(4), {"w1": 1, "w2": 1}, set(), 1, runs=runs)
    assert first is not None  # the runs are recorded (given again once, see the old-record test)
    # w2 killed and started again within the grace: a new process, a new run
    runs = {"w1": "a1", "w2": "b2"}
    again = rebalance(first, tasks(4), {"w1": 2, "w2": 0}, set(), 1, runs=runs)
    assert again is not None
    assert owners(again) == owners(start)  # nothing moves
    assert not again.revoking
    for before, after in zip(first.tasks, again.tasks, strict=True):
        if before.worker_id == "w2":
            assert (after.since, after.run) == (again.generation, "b2")
            assert after.since > before.since
        else:
            assert after == before  # w1's tasks are not restarted
    # the same run seen again: nothing to write
    assert rebalance(again, tasks(4), {"w1": 3, "w2": 3}, set(), 1, runs=runs) is None


def test_new_tasks_record_the_run_of_the_worker_they_go_to() -> None:
    first = rebalance(NONE, tasks(2), {"w1": 0, "w2": 0}, set(), 1, runs={"w1": "a", "w2": "b"})
    assert first is not None
    assert {(t.worker_id, t.run, t.since) for t in first.tasks} == {("w1", "a", 1), ("w2", "b", 1)}


def test_a_task_of_an_old_record_without_a_run_is_given_again_once() -> None:
    # a record of a version before runs: five fields, decoded with an empty run
    old = decode_record(
        b'{"type":"assignment","generation":4,"epoch":1,"tasks":[["c","i",0,"w1",3]]}'
    )
    assert isinstance(old, Assignment)
    assert old.tasks == [AssignedTask("c", "i", 0, "w1", 3, "")]
    runs = {"w1": "a"}
    again = rebalance(old, tasks(1), {"w1": 4}, set(), 1, runs=runs)
    assert again is not None
    assert again.tasks == [AssignedTask("c", "i", 0, "w1", 5, "a")]
    assert rebalance(again, tasks(1), {"w1": 5}, set(), 1, runs=runs) is None
    # a worker of an older version reports no run: it causes no re-issue
    assert rebalance(old, tasks(1), {"w1": 4}, set(), 1, runs={"w1": ""}) is None


def test_an_absent_worker_s_tasks_are_not_given_again_for_a_run_it_no_longer_has() -> None:
    start = rebalance(NONE, tasks(2), {"w1": 0, "w2": 0}, set(), 1, runs={"w1": "a", "w2": "b"})
    assert start is not None
    # w2 gone within the grace: its entry stays as it is whatever runs say
    assert rebalance(start, tasks(2), {"w1": 1}, set(), 1, runs={"w1": "a", "w2": "b9"}) is None
