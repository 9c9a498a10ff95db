"""Sink generations and source positions (broker/sink.py): the coordinator's `SinkOwner` table.

The pure table first (refusal, a zombie's decide appended before a fence is void, positions,
the pending batch of each run, forgetting), then real in-process brokers through the client:
the refusal is a typed error, survives a restart of the coordinator (the table is rebuilt from
its log) and the forgetting of old batches.
"""

from pathlib import Path

import pytest

from ferrymq.broker.sink import Begin, Decide, Done, Fence, Owner, SinkTable
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.sink import SinkClient, SinkFencedError
from ferrymq.model import MessageQueue
from ferrymq.testing import LocalCluster
from ferrymq.wire import properties as props
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.records import BatchItem

F = "conn:inc:0"


def pos(offset: int, queue: str = "0") -> dict[str, dict[str, dict[str, int]]]:
    return {"t": {"broker-a": {queue: offset}}}


def test_a_decide_of_an_older_generation_is_void_in_log_order() -> None:
    table = SinkTable()
    table.apply(Decide(f"{F}/r1", 0, {"x": {"b": 1}}, generation=1, fence=F, positions=pos(10)))
    assert table.owners[F].generation == 1
    assert table.owners[F].positions == pos(10)
    # the new owner fences; then the zombie's decide, appended before the fence was applied
    table.apply(Fence(F, 2))
    table.apply(Decide(f"{F}/r1", 1, {"y": {"b": 1}}, generation=1, fence=F, positions=pos(20)))
    assert table.batches.get((f"{F}/r1", 1)) is None
    owner = table.owners[F]
    assert (owner.generation, owner.positions, owner.run) == (2, pos(10), f"{F}/r1")
    assert table.fenced(F, 1) == 2
    assert table.fenced(F, 2) is None
    assert table.fenced(F, None) is None  # an unfenced (old) writer is not checked
    # the new owner's run: its batch ids start at 0 again, under its own sink id
    table.apply(Decide(f"{F}/r2", 0, {"z": {"b": 1}}, generation=2, fence=F, positions=pos(15)))
    assert table.batches[(f"{F}/r2", 0)].winner == {"z": {"b": 1}}
    assert owner.run == f"{F}/r2"
    assert owner.positions == pos(15)
    # each run's last decided batch, for a later owner to finish
    assert owner.pending == {f"{F}/r1": (0, {"x": {"b": 1}}), f"{F}/r2": (0, {"z": {"b": 1}})}
    # a newer generation replaying a decided batch keeps its winner and records the generation
    table.apply(Decide(f"{F}/r2", 0, {"other": {"b": 1}}, generation=3, fence=F))
    assert table.batches[(f"{F}/r2", 0)].winner == {"z": {"b": 1}}
    assert owner.generation == 3
    # writers without generation, fence id or positions leave no owner behind
    table.apply(Decide("plain", 0, {}))
    assert "plain" not in table.owners


def test_a_fence_sets_the_first_positions_and_applies_an_offsets_change_once() -> None:
    table = SinkTable()
    table.apply(Fence(F, 1, start=pos(5)))  # a first start pins where it starts
    table.apply(Fence(F, 1, start=pos(7)))  # a later start does not move it
    assert table.owners[F].positions == pos(5)
    table.apply(Decide(f"{F}/r1", 0, {}, generation=1, fence=F, positions=pos(9, "1")))
    assert table.owners[F].positions == {"t": {"broker-a": {"0": 5, "1": 9}}}
    table.apply(Fence(F, 2, change="req-1", start=pos(0)))  # an alter: merged
    assert table.owners[F].positions == {"t": {"broker-a": {"0": 0, "1": 9}}}
    table.apply(Decide(f"{F}/r2", 0, {}, generation=2, fence=F, positions=pos(3)))
    table.apply(Fence(F, 2, change="req-1", start=pos(0)))  # the same change again: nothing
    assert table.owners[F].positions == {"t": {"broker-a": {"0": 3, "1": 9}}}
    table.apply(Fence(F, 2, change="req-2", start={}, replace=True))  # a reset
    assert table.owners[F].positions == {}
    assert table.owners[F].change == "req-2"
    table.apply(Fence(F, 1, change="req-3", start=pos(99), replace=True))  # a zombie's: void
    assert table.owners[F].positions == {}
    assert table.owners[F].generation == 2


def test_the_owner_outlives_the_forgetting_of_old_batches() -> None:
    table = SinkTable()
    run = f"{F}/r1"
    for batch in range(100):
        table.apply(Decide(run, batch, {}, generation=4, fence=F, positions=pos(batch + 1)))
        table.apply(Begin(run, batch, []))
        table.apply(Done(run, batch, 0))
    assert len(table.batches) == 64
    assert table.forgotten_upto[run] == 35
    owner = table.owners[F]
    assert (owner.generation, owner.positions, owner.pending) == (4, pos(100), {run: (99, {})})
    table.apply(Decide(f"{F}/r0", 0, {"old": {}}, generation=3, fence=F))
    assert (f"{F}/r0", 0) not in table.batches
    # only the last runs are kept pending
    for index in range(20):
        table.apply(Decide(f"{F}/s{index}", 0, {}, generation=4, fence=F))
    assert list(owner.pending) == [f"{F}/s{i}" for i in range(4, 20)]


def test_an_owner_snapshot_stands_for_the_records_retention_deletes() -> None:
    records: list[Fence | Decide] = [
        Fence(F, 1, start=pos(5)),
        Decide(f"{F}/r1", 0, {"x": {"b": 1}}, generation=1, fence=F, positions=pos(9)),
        Fence(F, 2, change="req-1", start=pos(7, "1")),
        Decide(f"{F}/r2", 0, {"y": {"b": 2}}, generation=2, fence=F, positions=pos(11)),
    ]
    full = SinkTable()
    for op in records:
        full.apply(op)
    snapshot = full.owners[F].snapshot(F)
    assert isinstance(snapshot, Owner)
    # a rebuild that finds only the snapshot (older segments deleted) and what follows it
    rebuilt = SinkTable()
    rebuilt.apply(snapshot)
    assert rebuilt.owners == full.owners
    later = Decide(f"{F}/r2", 1, {}, generation=2, fence=F, positions=pos(12))
    for table in (full, rebuilt):
        table.apply(snapshot)  # a full replay meets the snapshot where it was written: no change
        table.apply(later)
        table.apply(Decide(f"{F}/r1", 1, {}, generation=1, fence=F))
    assert rebuilt.owners == full.owners
    assert rebuilt.owners[F].positions == {"t": {"broker-a": {"0": 12, "1": 7}}}
    assert rebuilt.fenced(F, 1) == 2


def rows(prefix: str, count: int) -> list[BatchItem]:
    return [
        BatchItem.of(f"{prefix}-{i}".encode(), {props.UNIQ_KEY: f"{prefix}-{i}"})
        for i in range(count)
    ]


async def two_groups(tmp_path: Path) -> LocalCluster:
    cluster = LocalCluster(tmp_path, brokers=2)
    await cluster.start()
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("Out", queues=2)
    for broker in cluster.brokers:
        await broker.register()
    return cluster


async def test_an_older_generation_is_refused_across_a_restart_and_forgetting(
    tmp_path: Path,
) -> None:
    cluster = await two_groups(tmp_path)
    a0, b0 = MessageQueue("Out", "broker-a", 0), MessageQueue("Out", "broker-b", 0)
    old, new = f"{F}/old-run", f"{F}/new-run"
    try:
        async with SinkClient(cluster.namesrv_addr) as sink:
            # generation 1 decides its batch 0 (rows on both groups) and commits it on one
            await sink.prepare(a0, old, 0, "t1", rows("g1", 2))
            await sink.prepare(b0, old, 0, "t1", rows("g1b", 1))
            proposal = {"t1": {"broker-a": 2, "broker-b": 1}}
            winner = await sink.decide(
                "broker-a", old, 0, proposal, generation=1, fence_id=F, positions=pos(3)
            )
            assert winner == proposal
            assert await sink.commit("broker-a", old, 0, {"t1": 2}, generation=1, fence_id=F)
            # generation 2 (a new checkpoint, so a new run) starts: fence, then its batch 0
            state = await sink.fence("broker-a", F, 2)
            assert (state.generation, state.positions, state.run) == (2, pos(3), old)
            assert [(p.sink_id, p.batch_id, p.transactions) for p in state.pending] == [
                (old, 0, proposal)
            ]
            await sink.prepare(a0, new, 0, "t2", rows("g2", 1))
            await sink.decide("broker-a", new, 0, {"t2": {"broker-a": 1}}, generation=2, fence_id=F)
            # the zombie planned a different batch 1 (and a batch 0 of other content): refused
            await sink.prepare(a0, old, 1, "z", rows("zombie", 5))
            for batch in (0, 1):
                with pytest.raises(SinkFencedError, match="generation 2 owns the sink") as info:
                    await sink.decide(
                        "broker-a", old, batch, {"z": {"broker-a": 5}}, generation=1, fence_id=F
                    )
                assert info.value.code == ResponseCode.SINK_GENERATION_FENCED
            with pytest.raises(SinkFencedError):
                await sink.fence("broker-a", F, 1)
            # finishing the decided batch is never refused (the new owner does the same)
            assert await sink.commit("broker-b", old, 0, {"t1": 1}, generation=1, fence_id=F) == (
                1,
                False,
            )
            assert await sink.commit("broker-a", new, 0, {"t2": 1}, generation=2, fence_id=F)
        service = cluster.broker.sink
        assert service is not None
        assert service.table.batches[(old, 1)].winner is None  # its rows stay prepared only

        # the coordinator restarts: the table is rebuilt from its log
        await cluster.restart_broker(0)
        async with SinkClient(cluster.namesrv_addr) as sink:
            with pytest.raises(SinkFencedError):
                await sink.decide("broker-a", old, 1, {}, generation=1, fence_id=F)
            # generation 2 commits 70 more (empty) batches: batch 0 and more are forgotten
            for batch in range(1, 71):
                await sink.decide("broker-a", new, batch, {}, generation=2, fence_id=F)
                await sink.commit("broker-a", new, batch, {}, generation=2, fence_id=F)
            service = cluster.broker.sink
            assert service is not None
            assert service.table.forgotten_upto[new] >= 6
            with pytest.raises(SinkFencedError):
                await sink.decide("broker-a", old, 1, {}, generation=1, fence_id=F)
        await cluster.restart_broker(0)
        async with SinkClient(cluster.namesrv_addr) as sink:
            with pytest.raises(SinkFencedError):
                await sink.decide("broker-a", old, 2, {}, generation=1, fence_id=F)
            service = cluster.broker.sink
            assert service is not None
            assert await service.snapshot_owners() == 1  # what the master does periodically
            state = await sink.fence("broker-a", F, 3)
            assert state.generation == 3
            assert state.run == new
            assert {p.sink_id: p.batch_id for p in state.pending} == {old: 0, new: 70}
            # a writer without a generation (an old client) is neither checked nor recorded
            assert await sink.decide("broker-a", "plain", 0, {}) == {}
        async with PullConsumer(cluster.namesrv_addr, "checker") as consumer:
            bodies = []
            for queue in await consumer.queues("Out"):
                end = await consumer.max_offset(queue)
                bodies += [m.body for m in await consumer.fetch_range(queue, 0, end)]
        assert sorted(bodies) == [b"g1-0", b"g1-1", b"g1b-0", b"g2-0"]
    finally:
        await cluster.close()
