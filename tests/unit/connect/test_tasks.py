"""Which tasks a worker process takes from the assignment: those given to its own run or to none."""

from pathlib import Path

from ferrymq.connect.plugin import Plugins
from ferrymq.connect.records import AssignedTask, Assignment, ConnectorPut, TargetState
from ferrymq.connect.state import ConfigState
from ferrymq.connect.tasks import TaskManager
from ferrymq.connectors.runtime import SparkTaskRunner


def test_a_restarted_worker_takes_only_the_tasks_given_to_its_own_run(tmp_path: Path) -> None:
    state = ConfigState()
    put = ConnectorPut("c", "i", {"connector.class": "FileSink"}, [{}, {}], TargetState.RUNNING)
    state.apply(put, 0)
    # task 0 still names the previous process of w1 (its orphan may write under generation 3);
    # task 1 was given again to this process under generation 4
    given = [AssignedTask("c", "i", 0, "w1", 3, "old"), AssignedTask("c", "i", 1, "w1", 4, "new")]
    state.apply(Assignment(generation=4, epoch=1, tasks=given), 1)
    runner = SparkTaskRunner(Plugins(), cluster_id="x", namesrv_addr="", state_dir=tmp_path)
    manager = TaskManager("w1", runner, report=lambda _: None, wall_ms=lambda: 0, run="new")
    wanted = manager.wanted(state)
    assert list(wanted) == [("c", "i", 1)]
    assert wanted[("c", "i", 1)][0].generation == 4


def test_a_task_given_to_no_run_runs_on_its_worker(tmp_path: Path) -> None:
    # a leader of a version before runs (a rolling upgrade) writes no run: the worker takes the
    # task; another worker's task and another run's task stay out
    state = ConfigState()
    put = ConnectorPut("c", "i", {"connector.class": "FileSink"}, [{}, {}, {}], TargetState.RUNNING)
    state.apply(put, 0)
    given = [
        AssignedTask("c", "i", 0, "w1", 5, ""),
        AssignedTask("c", "i", 1, "w2", 5, ""),
        AssignedTask("c", "i", 2, "w1", 5, "old"),
    ]
    state.apply(Assignment(generation=5, epoch=1, tasks=given), 1)
    runner = SparkTaskRunner(Plugins(), cluster_id="x", namesrv_addr="", state_dir=tmp_path)
    manager = TaskManager("w1", runner, report=lambda _: None, wall_ms=lambda: 0, run="new")
    wanted = manager.wanted(state)
    assert list(wanted) == [("c", "i", 0)]
    assert wanted[("c", "i", 0)][0].generation == 5
