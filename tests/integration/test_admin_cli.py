"""`ferry admin`'s everyday commands end to end against an in-process cluster, run through
`ferry`'s own main (one-line errors; exit 2 for bad arguments), JSON checked against the servers."""

import asyncio
import io
import json
import time
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.producer import Producer
from ferrymq.client.push import PushConsumer
from ferrymq.cmd.ferry import main
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from ferrymq.wire.bodies import HeartbeatData, ProducerData, encode_body
from ferrymq.wire.codes import RequestCode

from .remoting import command


def _ferry(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


class Ferry:
    """`ferry admin --namesrv ADDR ...` in a thread (the command runs its own event loop)."""

    def __init__(self, namesrv: str) -> None:
        self.namesrv = namesrv

    async def __call__(self, *args: str, code: int = 0) -> Any:
        done, out, err = await asyncio.to_thread(
            _ferry, ["admin", "--namesrv", self.namesrv, *args]
        )
        assert done == code, (args, out, err)
        if code:
            lines = err.strip().splitlines()
            assert len(lines) == 1, err
            assert lines[0].startswith("ferry: error: "), err
            return lines[0]
        return json.loads(out) if "--json" in args else out


async def test_group_lifecycle_and_clone_offset(cluster: LocalCluster) -> None:
    ferry = Ferry(cluster.namesrv_addr)
    done = await ferry("group", "update", "Billing", "--retry-max-times", "3", "--json")
    assert done["brokers"] == [cluster.broker.address]
    assert cluster.broker.state.groups.configs["Billing"].retry_max_times == 3
    await ferry("group", "update", "Billing", "--no-broadcast")  # the retry count is kept
    kept = cluster.broker.state.groups.configs["Billing"]
    assert (kept.retry_max_times, kept.consume_broadcast_enable) == (3, False)
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("Bills", queues=2)
    async with PullConsumer(cluster.namesrv_addr, "Billing") as consumer:
        queues = await consumer.queues("Bills")
        await consumer.commit(queues[1], 7)
    cloned = await ferry(
        "group", "clone-offset", "--src", "Billing", "--dest", "Audit", "--topic", "Bills", "--json"
    )
    assert {(c["queueId"], c["offset"]) for c in cloned} == {(0, 0), (1, 7)}
    async with PullConsumer(cluster.namesrv_addr, "Audit") as consumer:
        assert await consumer.committed(queues[1]) == 7
    await ferry("group", "delete", "Billing", "--clean-offset")
    assert "Billing" not in cluster.broker.state.groups.configs
    bad = await ferry("group", "update", "Billing", "--retry-queues", "0", code=2)
    assert "--retry-queues" in bad
    await ferry("group", "clone-offset", "--src", "A", "--topic", "Bills", code=2)


async def _ignore(message: Message) -> None:
    pass


async def test_consumer_and_producer_connections(cluster: LocalCluster, client: RpcClient) -> None:
    ferry = Ferry(cluster.namesrv_addr)
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("Orders", queues=1)
    beat = HeartbeatData(client_id="shop@127.0.0.1", producer_data_set=[ProducerData("Shop")])
    addr = cluster.broker.address
    await client.call(addr, command(RequestCode.HEART_BEAT, body=encode_body(beat)), 5)
    producers = await ferry("producer", "connection", "Shop", "--topic", "Orders", "--json")
    assert [c["clientId"] for c in producers["connectionSet"]] == ["shop@127.0.0.1"]
    consumer = PushConsumer(cluster.namesrv_addr, "Packers", _ignore, client_id="packer-1")
    consumer.subscribe("Orders", "TagA || TagB")
    async with consumer:
        found = await ferry("consumer", "connection", "Packers", "--json")
        assert [c["clientId"] for c in found["connectionSet"]] == ["packer-1"]
        assert found["subscriptionTable"]["Orders"]["subString"] == "TagA || TagB"
        table = await ferry("consumer", "connection", "Packers")
        assert "packer-1" in table
        status = await ferry("consumer", "status", "Packers", "--json")
        info = status["packer-1"]
        assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
        assert {(q["topic"], q["queueId"]) for q in info["mqTable"]} >= {("Orders", 0)}
        assert {s["topic"] for s in info["subscriptionSet"]} == {"Orders", "%RETRY%Packers"}
        same = await ferry("consumerStatus", "-g", "Packers", "-i", "packer-1", "--json")
        assert same["packer-1"]["properties"] == info["properties"]
        nobody = await ferry("consumer", "status", "Packers", "--client-id", "nobody", code=1)
        assert nobody == "ferry: error: consumer nobody of group Packers is not online"
    gone = await ferry("consumer", "connection", "Packers", code=1)
    assert gone == "ferry: error: consumer group Packers is not online"
    await ferry("producer", "connection", "Shop", code=2)  # --topic is required


async def test_broker_status_config_and_ha_status(cluster: LocalCluster) -> None:
    ferry = Ferry(cluster.namesrv_addr)
    addr = cluster.broker.address
    status = await ferry("broker", "status", "--broker-addr", addr, "--json")
    assert int(status[addr]["commitLogMaxOffset"]) == cluster.broker.state.store.max_log_offset
    await ferry(
        "broker", "config", "update", "maxMessageSize=1000000", "--cluster", "DefaultCluster"
    )
    config = await ferry(
        "broker", "config", "get", "--broker-addr", addr, "--key", "maxMessageSize", "--json"
    )
    assert config == {addr: {"maxMessageSize": "1000000"}}
    assert cluster.broker.state.config.max_message_size == 1_000_000
    refused = await ferry(
        "broker", "config", "update", "listenPort=1", "--broker-addr", addr, code=1
    )
    assert "listenPort: not changeable at runtime" in refused
    ha = await ferry("broker", "ha-status", "--cluster", "DefaultCluster", "--json")
    assert [(m["brokerAddr"], m["slaves"]) for m in ha] == [(addr, [])]
    await ferry("broker", "status", code=2)  # neither --broker-addr nor --cluster
    await ferry("broker", "config", "update", "notapair", "--broker-addr", addr, code=2)


async def test_topic_perm_by_offset_and_print_without_committing(cluster: LocalCluster) -> None:
    ferry = Ferry(cluster.namesrv_addr)
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("Audit", queues=1)
    begin = int(time.time() * 1000) - 1
    async with Producer(cluster.namesrv_addr) as producer:
        sent = [await producer.send("Audit", f"m{i}".encode(), keys=f"k{i}") for i in range(3)]
    one = await ferry(
        "message", "by-offset", "--topic", "Audit", "--broker-name", "broker-a",
        "--queue", "0", "--offset", "1", "--json",
    )  # fmt: skip
    assert [(m["body"], m["keys"]) for m in one] == [("m1", ["k1"])]
    printed = await ferry("message", "print", "Audit", "--begin-ms", str(begin), "--json")
    assert [m["body"] for m in printed] == ["m0", "m1", "m2"]
    assert [m["msgId"] for m in printed] == [s.msg_id for s in sent]
    async with PullConsumer(cluster.namesrv_addr, "ferry-admin-reader") as reader:
        assert await reader.committed((await reader.queues("Audit"))[0]) is None
    later = await ferry("message", "print", "Audit", "--begin-ms", str(2 * begin), "--json")
    assert later == []
    perm = await ferry("topic", "perm", "Audit", "--perm", "4", "--json")
    assert perm["brokers"] == [cluster.broker.address]
    async with AdminClient(cluster.namesrv_addr) as admin:
        route = await admin.route("Audit")
    assert route is not None
    assert route.queue_datas[0].perm == 4
    await ferry("topic", "perm", "Audit", "--perm", "5", code=2)
    await ferry("message", "print", "Audit", "--begin-ms", "10", "--end-ms", "5", code=2)
    # --max takes the earliest of every queue, not the first queue's (m0 is in queue 1)
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic("Spread", queues=2)
    async with Producer(cluster.namesrv_addr) as producer:
        for body, queue_id in (("s0", 1), ("s1", 0), ("s2", 0)):
            await producer.send(
                "Spread", body.encode(), queue=MessageQueue("Spread", "broker-a", queue_id)
            )
            await asyncio.sleep(0.01)  # store times differ
    first = await ferry(
        "message", "print", "Spread", "--begin-ms", str(begin), "--max", "2", "--json"
    )
    assert [m["body"] for m in first] == ["s0", "s1"]
    missing = await ferry(
        "message", "by-offset", "--topic", "Audit", "--broker-name", "broker-a",
        "--queue", "0", "--offset", "9",
        code=1,
    )  # fmt: skip
    assert "no message at Audit broker-a queue 0 offset 9" in missing


async def test_namesrv_config_and_kv(cluster: LocalCluster) -> None:
    ferry = Ferry(cluster.namesrv_addr)
    ns = cluster.namesrv_addr
    config = await ferry("namesrv", "config", "get", "--json")
    assert config[ns]["brokerTimeout"] == "30.0"
    await ferry("namesrv", "config", "update", "brokerTimeout=20")
    assert cluster.namesrv.config.broker_timeout == 20.0
    refused = await ferry("namesrv", "config", "update", "listenPort=1", code=1)
    assert "listenPort: not changeable at runtime" in refused
    await ferry("namesrv", "kv", "put", "ORDER_TOPIC_CONFIG", "Orders", "broker-a:4")
    got = await ferry("namesrv", "kv", "get", "ORDER_TOPIC_CONFIG", "Orders", "--json")
    assert got["value"] == "broker-a:4"
    await ferry("namesrv", "kv", "delete", "ORDER_TOPIC_CONFIG", "Orders")
    gone = await ferry("namesrv", "kv", "get", "ORDER_TOPIC_CONFIG", "Orders", code=1)
    assert gone == "ferry: error: no KV config item ORDER_TOPIC_CONFIG/Orders"
    await ferry("namesrv", "kv", "put", "ORDER_TOPIC_CONFIG", "Orders", code=2)


BAD_USAGE = [
    ("consumer", "connection"),
    ("consumer", "status"),
    ("producer", "connection", "--topic", "T"),
    ("group", "delete"),
    ("broker", "ha-status"),
    ("broker", "config", "get", "--broker-addr", "127.0.0.1:1", "--cluster", "C"),
    ("message", "by-offset", "--topic", "T", "--broker-name", "b", "--queue", "0"),
    ("message", "print"),
    ("offset", "reset-by-time", "--group", "G", "--topic", "T", "--timestamp", "-5"),
    ("stats-all", "--bogus"),
    ("namesrv", "config", "update"),
    ("namesrv", "kv", "get", "NS"),
    ("topic", "perm", "T"),
    ("consumerStatus", "-i", "c1"),
    ("statsAll", "-x"),
]


@pytest.mark.parametrize("args", BAD_USAGE, ids=" ".join)
async def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    await Ferry("127.0.0.1:1")(*args, code=2)  # refused before any server is asked


async def test_changes_print_what_they_did_as_json(cluster: LocalCluster) -> None:
    ferry = Ferry(cluster.namesrv_addr)
    addr = cluster.broker.address
    made = await ferry("topic", "create", "Made", "--queues", "2", "--json")
    assert made == {
        "topic": "Made", "queues": 2, "brokers": [addr], "order": False, "fenced": False,
        "pending": [],
    }  # fmt: skip
    assert cluster.broker.state.topics.configs["Made"].write_queue_nums == 2
    user = await ferry("user", "create", "bob", "--password", "b-pw", "--json")
    assert user == {
        "username": "bob", "userType": "Normal", "userStatus": "enable", "passwordSet": True,
        "created": True, "brokers": [addr],
    }  # fmt: skip
    same = await ferry("updateUser", "-u", "bob", "-s", "disable", "--json")  # mqadmin's name
    assert (same["userStatus"], same["passwordSet"], same["brokers"]) == ("disable", False, [addr])
    assert (await ferry("user", "get", "bob", "--json"))["userStatus"] == "disable"
    acl = await ferry(
        "acl", "create", "User:bob", "--resources", "Topic:Made", "--actions", "Pub", "--json"
    )
    assert acl["brokers"] == [addr]
    assert acl["policies"][0]["entries"][0]["resource"] == "Topic:Made"
    gone = await ferry("deleteAcl", "-s", "User:bob", "--json")
    assert (gone["subject"], gone["deleted"], gone["brokers"]) == ("User:bob", True, [addr])
    assert (await ferry("user", "delete", "bob", "--json"))["deleted"]
    deleted = await ferry("topic", "delete", "Made", "--json")
    assert deleted == {"topic": "Made", "cluster": None, "deleted": True}
    assert "Made" not in cluster.broker.state.topics.configs
