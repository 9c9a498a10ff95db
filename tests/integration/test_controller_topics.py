"""Topics kept by the controller (issue 20 section 3), in process: one controller node, a
NameServer and two single-replica broker groups in controller mode.

The admin client goes to the controller; masters reconcile toward what it decided: a group that
was down during a create gets the topic when it returns, one that was down during a delete drops
it (config, queues, offsets) before it registers again; topic requests sent to a broker go to the
controller; deleteTopicEnable=false refuses deletes; auto-create asks the controller.
The same with real processes and replicated groups is tests/system/test_controller_topics.py.
"""

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerConfig
from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.errors import RemoteError
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.broker import CreateTopicRequestHeader, DeleteTopicRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode

from .remoting import command, create_topic, send
from .test_controller import Controller, leader_of, start_controllers

GROUPS = ("broker-a", "broker-b")


async def _until(condition: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g} s"
        await asyncio.sleep(0.02)


@dataclasses.dataclass
class _Cluster:
    root: Path
    controller: Controller
    namesrv: NameServer
    brokers: dict[str, Broker] = dataclasses.field(default_factory=dict)

    def config(self, name: str, **changes: object) -> BrokerConfig:
        config = BrokerConfig(
            broker_name=name,
            enable_controller_mode=True,
            controller_addr=self.controller.address,
            namesrv_addr=self.namesrv.address,
            store_path_root_dir=self.root / name,
            listen_port=0,
            mapped_file_size_commit_log=1024 * 1024,
            register_name_server_period=500,
            broker_heartbeat_interval=100,
            controller_heart_beat_timeout_mills=400,
            sync_broker_metadata_period=300,
            busy_poll_micros=0,
        )
        return dataclasses.replace(config, **changes)  # type: ignore[arg-type]

    async def start(self, name: str, **changes: object) -> Broker:
        broker = Broker(self.config(name, **changes))
        await broker.start()
        self.brokers[name] = broker
        await _until(
            lambda: broker.state.is_master and not broker.fenced and broker.state.lease is not None,
            f"{name} master",
        )
        return broker

    async def stop(self, name: str) -> Broker:
        broker = self.brokers.pop(name)
        await broker.close()
        return broker


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[_Cluster]:
    async with AsyncExitStack() as stack:
        controller = await leader_of(await start_controllers(tmp_path / "ctl", 1, stack))
        namesrv = NameServer(NamesrvConfig(listen_port=0, scan_interval=0.2))
        await namesrv.start()
        stack.push_async_callback(namesrv.close)
        made = _Cluster(tmp_path, controller, namesrv)
        try:
            for name in GROUPS:
                await made.start(name)
            yield made
        finally:
            for broker in list(made.brokers.values()):
                await broker.close()


def _holds(broker: Broker, topic: str) -> int | None:
    config = broker.state.topics.get(topic)
    return config.write_queue_nums if config is not None else None


def _routed(cluster: _Cluster, topic: str) -> dict[str, int]:
    route = cluster.namesrv.routes.route_of(topic)
    return {q.broker_name: q.write_queue_nums for q in route.queue_datas} if route else {}


async def test_create_and_delete_go_through_the_controller(cluster: _Cluster) -> None:
    async with AdminClient(cluster.namesrv.address) as admin:
        masters = await admin.create_topic("Orders", 4)
        assert sorted(masters) == sorted(b.address for b in cluster.brokers.values())
        assert _routed(cluster, "Orders") == {"broker-a": 4, "broker-b": 4}
        state = cluster.controller.node.state
        assert state.topics["Orders"].placement == {"broker-a": (4, 4), "broker-b": (4, 4)}
        assert {n: _holds(b, "Orders") for n, b in cluster.brokers.items()} == {
            "broker-a": 4,
            "broker-b": 4,
        }
        await admin.create_topic("Orders", 2, broker_name="broker-b")
        assert _routed(cluster, "Orders") == {"broker-a": 4, "broker-b": 2}

        placement = await admin.topic_placement("Orders")
        assert placement is not None
        assert [
            (g.broker_name, g.desired, g.on_broker, g.routed, g.state) for g in placement.groups
        ] == [
            ("broker-a", 4, 4, 4, "ok"),
            ("broker-b", 2, 2, 2, "ok"),
        ]

        await admin.delete_topic("Orders")
        assert _routed(cluster, "Orders") == {}
        assert state.deleted_topics["Orders"] == state.topic_version
        await _until(
            lambda: all(_holds(b, "Orders") is None for b in cluster.brokers.values()),
            "both masters dropped the topic",
        )
        for broker in cluster.brokers.values():
            assert broker.state.topics.controller_version == state.topic_version


async def test_a_group_down_during_a_create_gets_the_topic_when_it_returns(
    cluster: _Cluster,
) -> None:
    await cluster.stop("broker-b")
    async with AdminClient(cluster.namesrv.address) as admin:
        masters = await admin.create_topic("Late", 3)
        assert masters == [cluster.brokers["broker-a"].address]
        placement = await admin.topic_placement("Late")
        assert placement is not None
        assert {g.broker_name: g.state for g in placement.groups} == {
            "broker-a": "ok",
            "broker-b": "no master",
        }
        broker_b = await cluster.start("broker-b")
        assert _holds(broker_b, "Late") == 3  # reconciled before it left the fence
        await _until(lambda: _routed(cluster, "Late") == {"broker-a": 3, "broker-b": 3}, "routed")


async def test_a_group_down_during_a_delete_drops_the_topic_before_it_is_routed_again(
    cluster: _Cluster,
) -> None:
    async with (
        AdminClient(cluster.namesrv.address) as admin,
        Producer(cluster.namesrv.address) as producer,
    ):
        await admin.create_topic("Doomed", 2)
        queues = [q for q in await producer.queues("Doomed") if q.broker_name == "broker-b"]
        for queue in queues:
            await producer.send("Doomed", b"x", queue=queue)
        broker_b = cluster.brokers["broker-b"]
        broker_b.state.offsets.commit("Doomed", "readers", 0, 1)
        assert broker_b.store.max_queue_offset("Doomed", 0) == 1
        await cluster.stop("broker-b")
        await admin.delete_topic("Doomed")
        assert _routed(cluster, "Doomed") == {}

        registered: list[set[str]] = []
        routes = cluster.namesrv.routes
        original = routes.register

        def spy(**fields: object) -> object:
            topics = fields.get("topics")
            if fields.get("broker_name") == "broker-b" and isinstance(topics, dict):
                registered.append(set(topics))
            return original(**fields)  # type: ignore[arg-type]

        routes.register = spy  # type: ignore[method-assign,assignment]
        broker_b = await cluster.start("broker-b")
        await _until(lambda: bool(registered), "broker-b registered")
        assert all("Doomed" not in topics for topics in registered)
        assert _holds(broker_b, "Doomed") is None
        assert broker_b.store.max_queue_offset("Doomed", 0) == 0
        assert broker_b.state.offsets.groups_of("Doomed") == []
        assert _routed(cluster, "Doomed") == {}


async def test_topic_requests_sent_to_a_broker_go_to_the_controller(cluster: _Cluster) -> None:
    broker_a = cluster.brokers["broker-a"]
    async with RpcClient() as rpc:
        await create_topic(rpc, broker_a.address, "Direct", queues=2)
        assert cluster.controller.node.state.topics["Direct"].placement == {"broker-a": (2, 2)}
        assert _holds(broker_a, "Direct") == 2
        header = CreateTopicRequestHeader(
            topic="Direct", read_queue_nums=1, write_queue_nums=1, attributes="+ferry.fenced=true"
        )
        fenced = await rpc.call(
            cluster.brokers["broker-b"].address,
            command(RequestCode.UPDATE_AND_CREATE_TOPIC, header),
            5.0,
        )
        assert fenced.code == ResponseCode.INVALID_PARAMETER, fenced.remark
        assert "cannot become fenced" in (fenced.remark or "")
        deleted = await rpc.call(
            broker_a.address,
            command(RequestCode.DELETE_TOPIC_IN_BROKER, DeleteTopicRequestHeader(topic="Direct")),
            5.0,
        )
        assert deleted.code == ResponseCode.SUCCESS, deleted.remark
        assert "Direct" in cluster.controller.node.state.deleted_topics
        assert _holds(broker_a, "Direct") is None
        # a broker-local topic stays the broker's own
        await create_topic(rpc, broker_a.address, "%RETRY%local", queues=1)
        assert "%RETRY%local" not in cluster.controller.node.state.topics
        assert _holds(broker_a, "%RETRY%local") == 1


async def test_delete_topic_enable_false_refuses_deletes_with_a_clear_error(
    cluster: _Cluster,
) -> None:
    async with AdminClient(cluster.namesrv.address) as admin:
        await admin.create_topic("Kept", 1)
        controllers = await admin.controllers()
        assert controllers is not None
        await controllers.update_config({"deleteTopicEnable": "false"})
        with pytest.raises(RemoteError) as refused:
            await admin.delete_topic("Kept")
        assert refused.value.code == ResponseCode.NO_PERMISSION
        assert "deleteTopicEnable=false" in refused.value.remark
        assert _routed(cluster, "Kept") == {"broker-a": 1, "broker-b": 1}
        await controllers.update_config({"deleteTopicEnable": "true"})
        await admin.delete_topic("Kept")
        assert _routed(cluster, "Kept") == {}


async def test_auto_create_asks_the_controller(cluster: _Cluster) -> None:
    broker_c = await cluster.start("broker-c", auto_create_topic_enable=True)
    async with RpcClient() as rpc:
        response = await send(rpc, broker_c.address, "Auto", b"x")
        assert response.code == ResponseCode.SUCCESS, response.remark
        assert cluster.controller.node.state.topics["Auto"].placement == {"broker-c": (4, 4)}
        assert _holds(broker_c, "Auto") == 4
        # broker-b does not auto-create: the send is refused as before
        refused = await send(rpc, cluster.brokers["broker-b"].address, "Auto2", b"x")
        assert refused.code == ResponseCode.TOPIC_NOT_EXIST
        assert "Auto2" not in cluster.controller.node.state.topics


async def test_broker_local_topics_stay_with_the_brokers(cluster: _Cluster) -> None:
    async with AdminClient(cluster.namesrv.address) as admin:
        await admin.create_topic("%RETRY%readers", 1)
        assert "%RETRY%readers" not in cluster.controller.node.state.topics
        assert all(_holds(b, "%RETRY%readers") == 1 for b in cluster.brokers.values())
        await admin.delete_topic("%RETRY%readers")
        assert all(_holds(b, "%RETRY%readers") is None for b in cluster.brokers.values())
        assert cluster.controller.node.state.deleted_topics == {}
