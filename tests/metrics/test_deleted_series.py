"""A deleted group's or topic's POP state, stats and metric series go, on master and slave.

In process: a SYNC_MASTER and its slave, both with a Prometheus endpoint. RocketMQ's
`deleteSubscriptionGroup` drops the group's offsets (cleanOffset) and stats, its
`deleteTopicInBroker` the topic's offsets and stats; ferrymq drops their POP state too, and the
slave does the same from the replicated delete records.
"""

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerRole
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.simple import ReceivedMessage, SimpleConsumer
from ferrymq.errors import RemoteError
from ferrymq.metrics.exporter import MetricsExporterType
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from ferrymq.wire.broker import DeleteTopicRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from tests.integration.remoting import command, create_topic, send
from tests.integration.test_admin_cli import Ferry
from tests.metrics.scrape import scrape


async def _until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g} s"
        await asyncio.sleep(0.02)


async def _series(broker: Broker, label: str, value: str) -> set[str]:
    """The names of the metric series of `broker` with `label`=`value`."""
    assert broker.metrics is not None
    return {
        name for name, labels in await scrape(broker.metrics.address) if (label, value) in labels
    }


def _pop_keys(broker: Broker, group: str = "", topic: str = "") -> set[tuple[str, str, int]]:
    return {k for k in broker.state.pop.queues if group in (k[0], "") and topic in (k[1], "")}


async def test_a_deleted_group_and_topic_leave_no_pop_state_stats_or_series(
    tmp_path: Path,
) -> None:
    async with LocalCluster(
        tmp_path,
        broker_role=BrokerRole.SYNC_MASTER,
        ha_send_heartbeat_interval=200,
        metrics_exporter_type=MetricsExporterType.PROM,
        metrics_prom_exporter_port=0,
    ) as cluster:
        master = cluster.broker
        config = master.config
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
        try:
            async with RpcClient() as rpc:
                for topic in ("Del", "Keep"):
                    await create_topic(rpc, master.address, topic, 1)
                    for i in range(3):
                        assert (await send(rpc, master.address, topic, b"m%d" % i)).code == 0
                await master.register()
                async with (
                    SimpleConsumer(cluster.namesrv_addr, "GD") as popper,
                    PullConsumer(cluster.namesrv_addr, "GD") as puller,
                    PullConsumer(cluster.namesrv_addr, "GK") as keeper,
                ):
                    got: list[ReceivedMessage] = []
                    async with asyncio.timeout(20):
                        while len(got) < 2:
                            got += await popper.receive(
                                "Del", max_messages=2 - len(got), invisible_duration=60, wait=0.5
                            )
                    await popper.ack(got[0])
                    assert (await puller.pull(MessageQueue("Del", "broker-a", 0), 0)).messages
                    keep = MessageQueue("Keep", "broker-a", 0)
                    assert (await keeper.pull(keep, 0)).messages
                    await keeper.commit(keep, 3)
                    await _until(lambda: _pop_keys(slave, "GD") != set(), "POP on the slave")
                    assert {"rocketmq_messages_out_total", "rocketmq_consumer_offset"} <= (
                        await _series(master, "consumer_group", "GD")
                    )
                    assert "rocketmq_consumer_offset" in await _series(
                        slave, "consumer_group", "GD"
                    )

                    ferry = Ferry(cluster.namesrv_addr)
                    await ferry("group", "delete", "GD", "--clean-offset")
                    assert _pop_keys(master, "GD") == set()
                    assert await _series(master, "consumer_group", "GD") == set()
                    await _until(lambda: "GD" not in slave.state.groups.configs, "slave delete")
                    await _until(lambda: not slave.state.offsets.of_group("GD"), "slave offsets")
                    assert _pop_keys(slave, "GD") == set()
                    assert await _series(slave, "consumer_group", "GD") == set()
                    assert "rocketmq_messages_out_total" in await _series(
                        master, "consumer_group", "GK"
                    )
                    with pytest.raises(RemoteError) as stale:  # its in-flight handles
                        await popper.ack(got[1])
                    assert stale.value.code == ResponseCode.NO_MESSAGE
                    # created again (on the next pop): starts clean, from the first message
                    again = await popper.receive("Del", invisible_duration=60, wait=2)
                    assert [(m.message.body, m.delivery_attempt) for m in again] == [
                        (b"m%d" % i, 1) for i in range(3)
                    ]
                    assert master.state.pop.in_flight_count(("GD", "Del", 0)) == 3

                delete = command(
                    RequestCode.DELETE_TOPIC_IN_BROKER, DeleteTopicRequestHeader(topic="Del")
                )
                assert (await rpc.call(master.address, delete, 5)).code == ResponseCode.SUCCESS
                assert _pop_keys(master, topic="Del") == set()
                assert await _series(master, "topic", "Del") == set()
                await _until(lambda: "Del" not in slave.state.topics.configs, "slave topic")
                assert _pop_keys(slave, topic="Del") == set()
                assert await _series(slave, "topic", "Del") == set()
                assert "rocketmq_messages_in_total" in await _series(master, "topic", "Keep")
                assert "rocketmq_consumer_offset" in await _series(slave, "topic", "Keep")
        finally:
            await slave.close()
