"""A deleted topic's queues on every replica (issue 20 section 3), classic mode in process.

A slave drops a topic's consume queues when the master's metadata log deletes it (before, only
its config went), so a topic created again under the same name starts at queue offset 0 on every
replica. Metadata records are applied again at every start: replaying an old delete must not
drop a later incarnation of the topic, on the slave or on the master.
"""

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerRole
from ferrymq.rpc.client import RpcClient
from ferrymq.store.store import GetStatus
from ferrymq.testing import LocalCluster
from ferrymq.wire.broker import DeleteTopicRequestHeader
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.records import decode_record

from .remoting import command, create_topic, send

TOPIC = "Again"


async def _until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g} s"
        await asyncio.sleep(0.02)


def _bodies(broker: Broker) -> list[bytes]:
    result = broker.store.get(TOPIC, 0, 0, 100)
    if result.status is not GetStatus.FOUND:
        return []
    return [decode_record(record).body for record in result.records]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(
        tmp_path, broker_role=BrokerRole.SYNC_MASTER, ha_send_heartbeat_interval=200
    ) as made:
        yield made


async def _slave(cluster: LocalCluster) -> Broker:
    config = cluster.broker.config
    slave = Broker(
        dataclasses.replace(
            config,
            broker_id=1,
            broker_role=BrokerRole.SLAVE,
            store_path_root_dir=config.store_path_root_dir.parent / "slave",
            ha_listen_port=0,
        )
    )
    await slave.start()
    return slave


async def test_slaves_drop_a_deleted_topics_queues_and_a_replay_keeps_the_new_one(
    cluster: LocalCluster,
) -> None:
    slave = await _slave(cluster)
    try:
        async with RpcClient() as rpc:
            master = cluster.broker
            await create_topic(rpc, master.address, TOPIC, 1)
            for body in (b"old-1", b"old-2"):
                assert (await send(rpc, master.address, TOPIC, body)).code == 0
            await _until(lambda: _bodies(slave) == [b"old-1", b"old-2"], "the slave has them")
            deleted = await rpc.call(
                master.address,
                command(RequestCode.DELETE_TOPIC_IN_BROKER, DeleteTopicRequestHeader(topic=TOPIC)),
                5.0,
            )
            assert deleted.code == 0, deleted.remark
            await _until(lambda: slave.state.topics.get(TOPIC) is None, "the slave forgot it")
            await _until(lambda: not slave.store.queues.queues_of(TOPIC), "its queues dropped")

            await create_topic(rpc, master.address, TOPIC, 1)
            assert (await send(rpc, master.address, TOPIC, b"new-1")).code == 0
            await _until(lambda: _bodies(slave) == [b"new-1"], "the slave has the new one")
            assert _bodies(master) == [b"new-1"]

        # both start again and replay the metadata log, old delete included
        await slave.close()
        slave = await _slave(cluster)
        await _until(lambda: slave.state.topics.get(TOPIC) is not None, "the slave replayed")
        assert _bodies(slave) == [b"new-1"]
        restarted = await cluster.restart_broker()
        assert _bodies(restarted) == [b"new-1"]
        assert restarted.state.topics.get(TOPIC) is not None
    finally:
        await slave.close()
