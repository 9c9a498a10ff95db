"""The Connect config log after retention, read by the real `ConfigLog` from a real broker.

The layout of a Hypothesis finding (tests/unit/connect/test_state.py): retention took the claim
and `create a` (queue offsets 0, 1) after copying the live tail forward (3-5), and kept
`create b` (2) in the next segment. A fresh worker and a follower whose next record is gone both
reach the writer's state; only an empty state fed from the first stored record would not. The
follower keeps its last whole state while it reads the live tail again."""

import asyncio
from pathlib import Path

from ferrymq.broker import retention
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.fenced import FencedTopicWriter
from ferrymq.client.producer import Producer
from ferrymq.connect.configlog import ConfigLog
from ferrymq.connect.records import Claim, ConnectorPut, Record, TargetState, encode_record
from ferrymq.connect.state import ConfigState
from ferrymq.testing import LocalCluster

TOPIC = "ConnectConfigs"
SEGMENT = 64 * 1024
FILLER = b"f" * 4000
CLAIM = Claim(1, "w1", "http://w1")


def _create(name: str) -> ConnectorPut:
    return ConnectorPut(name, f"{name}-1", {"connector.class": "X"}, [{}], TargetState.RUNNING)


async def _roll_segment(cluster: LocalCluster) -> None:
    async with Producer(cluster.namesrv_addr) as producer:
        for _ in range(SEGMENT // len(FILLER) + 1):
            await producer.send("Filler", FILLER)
    cluster.broker.store.flush()


async def test_a_fresh_worker_and_a_follower_whose_next_record_expired_reach_the_writer_s_state(
    tmp_path: Path,
) -> None:
    async with LocalCluster(tmp_path, mapped_file_size_commit_log=SEGMENT) as cluster:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.create_topic(TOPIC, 1, broker_name="broker-a", fenced=True)
            await admin.create_topic("Filler", 1)
        writer = ConfigState()
        async with FencedTopicWriter(cluster.namesrv_addr, TOPIC) as fenced:

            async def write(record: Record) -> None:
                body = encode_record(record)
                if isinstance(record, Claim):
                    appended = await fenced.append(
                        body, op="claim", epoch=1, writer="w1", url="http://w1"
                    )
                else:
                    appended = await fenced.append(body, op="write", epoch=1, writer="w1")
                writer.apply(record, appended.queue_offset)

            async def live_start() -> int:
                return (await fenced.holder()).live_start_offset

            await write(CLAIM)
            await write(_create("a"))
            await _roll_segment(cluster)
            await write(_create("b"))
            await _roll_segment(cluster)
            assert await retention.delete_expired(cluster.broker.state, force=True) == 1
            assert cluster.broker.store.min_queue_offset(TOPIC, 0) == 2
            assert await live_start() == 3
            async with PullConsumer(cluster.namesrv_addr, "ConfigReader") as consumer:
                fresh = ConfigLog(consumer, TOPIC, ConfigState(), live_start=live_start)
                follower = ConfigLog(consumer, TOPIC, ConfigState(), live_start=live_start)
                follower.state.apply(CLAIM, 0)  # it read offset 0, then stopped
                follower.end_at_start = follower.config_offset = 1
                seen = set()  # what the follower's state showed at every turn of the loop
                readers = [asyncio.create_task(log.run()) for log in (fresh, follower)]
                try:
                    async with asyncio.timeout(30):
                        while follower.config_offset < 6:
                            seen.add(
                                (follower.state.epoch, tuple(sorted(follower.state.connectors)))
                            )
                            await asyncio.sleep(0)
                        assert await fresh.wait_for(6, 30)
                finally:
                    for reader in readers:
                        reader.cancel()
                    await asyncio.gather(*readers, return_exceptions=True)
    assert (writer.epoch, sorted(writer.connectors)) == (1, ["a", "b"])
    assert fresh.state.image() == writer.image()
    assert follower.state.image() == writer.image()
    # the follower answered from its last whole state until the live tail was read again, never
    # from a half-read one (an empty state would stop its tasks and 404 its connectors)
    assert seen == {(1, ())}
