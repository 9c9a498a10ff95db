"""A NameServer over real sockets: registration, routes, cluster info, bad bodies, departures."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import (
    ClusterInfo,
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    TopicRouteData,
    decode_body,
    encode_register_body,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.namesrv import GetRouteInfoRequestHeader, RegisterBrokerRequestHeader


@pytest.fixture
async def namesrv() -> AsyncIterator[NameServer]:
    async with NameServer(NamesrvConfig(listen_port=0, scan_interval=0.05)) as server:
        yield server


def _register_request(
    addr: str, topics: list[str], compressed: bool, broker_id: int = 0
) -> RemotingCommand:
    body = RegisterBrokerBody(
        TopicConfigSerializeWrapper(
            {t: TopicConfig(topic_name=t, read_queue_nums=4, write_queue_nums=4) for t in topics},
            DataVersion(1, 2, 3),
        )
    )
    header = RegisterBrokerRequestHeader(
        broker_name="broker-a",
        broker_addr=addr,
        cluster_name="DefaultCluster",
        ha_server_addr=addr,
        broker_id=broker_id,
        compressed=compressed,
    )
    return RemotingCommand(
        code=RequestCode.REGISTER_BROKER,
        ext_fields=to_ext_fields(header),
        body=encode_register_body(body, compressed),
    )


async def _route(client: RpcClient, namesrv: NameServer, topic: str) -> RemotingCommand:
    return await client.call(
        namesrv.address,
        RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
            ext_fields=to_ext_fields(GetRouteInfoRequestHeader(topic=topic)),
        ),
        5,
    )


@pytest.mark.parametrize("compressed", [False, True])
async def test_registered_topics_are_routed(namesrv: NameServer, compressed: bool) -> None:
    async with RpcClient() as broker, RpcClient() as client:
        response = await broker.call(
            namesrv.address, _register_request("127.0.0.1:10911", ["T1", "T2"], compressed), 5
        )
        assert response.code == ResponseCode.SUCCESS
        assert response.ext_fields["masterAddr"] == "127.0.0.1:10911"
        route = decode_body((await _route(client, namesrv, "T1")).body, TopicRouteData)
        assert route.broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}
        assert (
            b'"brokerAddrs":{"0":"127.0.0.1:10911"}' in (await _route(client, namesrv, "T1")).body
        )
        missing = await _route(client, namesrv, "Nope")
        assert missing.code == ResponseCode.TOPIC_NOT_EXIST
        assert "Nope" in (missing.remark or "")
        topics = await client.call(
            namesrv.address, RemotingCommand(code=RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 5
        )
        assert decode_body(topics.body, TopicList).topic_list == ["T1", "T2"]
        cluster = await client.call(
            namesrv.address, RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO), 5
        )
        assert decode_body(cluster.body, ClusterInfo).cluster_addr_table == {
            "DefaultCluster": ["broker-a"]
        }


async def test_a_broker_whose_connection_drops_leaves_the_routes(namesrv: NameServer) -> None:
    async with RpcClient() as client:
        broker = RpcClient()
        await broker.call(namesrv.address, _register_request("127.0.0.1:10911", ["T"], False), 5)
        assert (await _route(client, namesrv, "T")).code == ResponseCode.SUCCESS
        await broker.close()
        for _ in range(100):
            if (await _route(client, namesrv, "T")).code == ResponseCode.TOPIC_NOT_EXIST:
                break
            await asyncio.sleep(0.02)
        assert (await _route(client, namesrv, "T")).code == ResponseCode.TOPIC_NOT_EXIST


@pytest.mark.parametrize(
    ("body", "compressed"),
    [
        (b"{not json", False),
        (b"\x78\x9c garbage", True),
        (b'{"topicConfigSerializeWrapper": 5}', False),
    ],
)
async def test_a_bad_registration_body_is_refused_and_the_server_serves_on(
    namesrv: NameServer, body: bytes, compressed: bool
) -> None:
    request = _register_request("127.0.0.1:10911", ["T"], compressed)
    request.body = body
    async with RpcClient() as client:
        response = await client.call(namesrv.address, request, 5)
        assert response.code == ResponseCode.SYSTEM_ERROR
        assert "REGISTER_BROKER" in (response.remark or "") or "body" in (response.remark or "")
        assert (await _route(client, namesrv, "T")).code == ResponseCode.TOPIC_NOT_EXIST
        good = await client.call(
            namesrv.address, _register_request("127.0.0.1:10911", ["T"], False), 5
        )
        assert good.code == ResponseCode.SUCCESS
