"""SINK_QUERY_FENCE on an in-process broker: a fence id's recorded state, read without a record.

The coordinator answers what SINK_FENCE and SINK_DECIDE recorded (generation, positions, run,
pending batch), appends nothing to its log, answers the same after a restart (the table is
rebuilt from the log), and refuses a fence id it has no record of with a typed error.
"""

import pytest

from ferrymq.client.sink import SinkClient, SinkFenceNotFoundError
from ferrymq.testing import LocalCluster
from ferrymq.wire.codes import ResponseCode

F = "mirror:inc-1:0"


async def test_a_fence_query_answers_the_recorded_state_and_records_nothing(
    cluster: LocalCluster,
) -> None:
    async with SinkClient(cluster.namesrv_addr, retry_for=20) as sink:
        coordinator = await sink.coordinator(None)
        with pytest.raises(SinkFenceNotFoundError, match=f"{F} has no record") as info:
            await sink.query_fence(coordinator, F)
        assert info.value.code == ResponseCode.SINK_FENCE_NOT_FOUND
        await sink.fence(coordinator, F, 2, start={"t": {"broker-a": {"0": 5}}})
        positions = {"t": {"broker-a": {"1": 9}}}
        await sink.decide(
            coordinator, f"{F}/run-1", 0, {}, generation=2, fence_id=F, positions=positions
        )
        service = cluster.broker.sink
        assert service is not None
        service.catch_up()
        records = service.applied_queue_offset
        state = await sink.query_fence(coordinator, F)
        assert (state.generation, state.positions, state.run) == (
            2,
            {"t": {"broker-a": {"0": 5, "1": 9}}},
            f"{F}/run-1",
        )
        assert [(p.sink_id, p.batch_id) for p in state.pending] == [(f"{F}/run-1", 0)]
        assert await sink.query_fence(coordinator, F) == state
        service.catch_up()
        assert service.applied_queue_offset == records  # nothing appended
        # the same answer from the table rebuilt from the log
        await cluster.restart_broker(0)
        assert await sink.query_fence(coordinator, F) == state
