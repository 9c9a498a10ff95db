"""The handshake's truncation point over generated replication histories.

A model cluster of three replicas: masters are elected (new epochs, empty ones included), write,
die mid-replication and come back as slaves ahead of the new master. A log is a list of epoch
labels, one per byte unit, so two logs agree exactly where their labels do. The point must always
be where a slave's log stops equalling its master's, and the histories must keep describing the
bytes they label.
"""

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ferrymq.errors import StoreError
from ferrymq.replication.handshake import consistent_point
from ferrymq.store.epochs import EpochHistory
from ferrymq.wire.ha import EpochEntry


def _history(*pairs: tuple[int, int]) -> EpochHistory:
    return EpochHistory([EpochEntry(e, s) for e, s in pairs])


@pytest.mark.parametrize(
    ("local", "local_end", "master", "master_end", "point"),
    [
        # RocketMQ's EpochFileCacheTest vectors, where ferrymq agrees
        (((1, 100), (2, 300), (3, 500)), 700, ((1, 100), (2, 300), (3, 450)), 700, 450),
        (((1, 100), (2, 300), (3, 500)), 700, ((3, 500),), 600, 600),
        (((1, 100), (2, 300), (3, 500), (4, 800)), 900, ((3, 500),), 700, 700),
        # ... and where it does not: no common epoch wipes instead of failing (RocketMQ: -1)
        (((1, 100), (2, 300), (3, 500)), 700, ((1, 200), (2, 500)), 800, 0),
        # bytes without a history are not trusted (RocketMQ keeps them all)
        ((), 5000, ((1, 0),), 9000, 0),
        ((), 0, ((1, 0),), 9000, 0),
        # a slave ahead in the master's own epoch is cut back to the master's end
        (((1, 0),), 800, ((1, 0),), 500, 500),
    ],
)
def test_points(
    local: tuple[tuple[int, int], ...],
    local_end: int,
    master: tuple[tuple[int, int], ...],
    master_end: int,
    point: int,
) -> None:
    assert consistent_point(_history(*local), local_end, _history(*master), master_end) == point


def test_a_new_epoch_at_the_same_offset_replaces_the_empty_one() -> None:
    history = _history((1, 0), (2, 100))
    assert history.assign(3, 100)
    assert history.entries == (EpochEntry(1, 0), EpochEntry(3, 100))
    assert not history.assign(3, 100)
    with pytest.raises(StoreError, match="not newer"):
        history.assign(2, 200)
    with pytest.raises(StoreError, match="not newer"):
        history.assign(3, 150)


class Replica:
    def __init__(self) -> None:
        self.log: list[int] = []
        self.history = EpochHistory()


class ReplicationModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.replicas = [Replica() for _ in range(3)]
        self.master: int | None = None
        self.epoch = 0

    @rule(replica=st.integers(0, 2))
    def elect(self, replica: int) -> None:
        # The new master first agrees with the old one as far as it can, as a slave would.
        self.epoch += 1
        self.master = replica
        chosen = self.replicas[replica]
        chosen.history.assign(self.epoch, len(chosen.log))

    @precondition(lambda self: self.master is not None)
    @rule(units=st.integers(1, 5))
    def write(self, units: int) -> None:
        assert self.master is not None
        self.replicas[self.master].log += [self.epoch] * units

    @precondition(lambda self: self.master is not None)
    @rule(replica=st.integers(0, 2), units=st.integers(0, 12))
    def replicate(self, replica: int, units: int) -> None:
        assert self.master is not None
        if replica == self.master:
            return
        master, slave = self.replicas[self.master], self.replicas[replica]
        point = consistent_point(slave.history, len(slave.log), master.history, len(master.log))
        common = 0
        while (
            common < min(len(slave.log), len(master.log))
            and slave.log[common] == master.log[common]
        ):
            common += 1
        assert point == common, "the point is exactly where the logs stop agreeing"
        slave.log = slave.log[:point]
        slave.history.truncate_from_offset(point)
        end = min(len(master.log), point + units)
        slave.log += master.log[point:end]
        for entry in master.history:  # transfer headers carry each chunk's epoch and start
            if entry.start_offset < max(end, point + 1) and entry.epoch > slave.history.last_epoch:
                slave.history.assign(entry.epoch, entry.start_offset)

    @invariant()
    def histories_label_every_byte(self) -> None:
        for replica in self.replicas:
            labels = [replica.history.epoch_at(p) for p in range(len(replica.log))]
            assert labels == replica.log


TestReplicationModel = ReplicationModel.TestCase
