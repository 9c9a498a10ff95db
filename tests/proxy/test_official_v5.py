"""The official clients, unchanged, against one `ferry up` (a real process, started once for the
module): the 5.x Python client (PyPI rocketmq-python-client 5.1.2, in its own venv, as a child
process) through the gRPC endpoint the ready file names ("proxy"), and the 4.x client (PyPI
`rocketmq` 0.4.4, C++ core, tests/compat) through its remoting port ("proxy_remoting").
ferrymq's own SDK reads back, through the NameServer, what the clients stored.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.mqadmin import MQAdmin
from ferrymq.client.producer import Producer
from ferrymq.rpc.client import RpcClient
from ferrymq.wire import properties as props
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand
from tests.system.test_up import _up

pytestmark = pytest.mark.system

WORKER = Path(__file__).with_name("v5_worker.py")
FAST_CHECKS = "transactionTimeOut=1000\ntransactionCheckInterval=300\n"
"""Half messages checked after 1 s, every 0.3 s: the check path is seen within seconds."""


class Up:
    """What the module's `ferry up` ready file says (the addresses the tests use)."""

    def __init__(self, info: dict[str, object]) -> None:
        self.namesrv = str(info["namesrv"])
        self.proxy = str(info["proxy"])
        self.proxy_remoting = str(info["proxy_remoting"])
        brokers = info["brokers"]
        assert isinstance(brokers, list)
        self.brokers = [str(broker["addr"]) for broker in brokers]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """`ferry up` as a user runs it (HA: 3 controllers, 3 replicas, the endpoint), without
    Connect and the console, which these tests do not use."""
    where = tmp_path_factory.mktemp("up")
    conf = where / "broker.conf"
    conf.write_text(FAST_CHECKS)
    process, info = _up(where, "--connect", "0", "--no-console", "--broker-config", str(conf))
    try:
        yield Up(info)
    finally:
        process.terminate()  # ferry up stops every child it started on SIGTERM
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


async def _run_worker(v5: Path, *args: str, timeout: float = 90) -> list[dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        str(v5),
        str(WORKER),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()[-3000:]
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]


async def _read_all(namesrv: str, topic: str, want: int, timeout: float = 30) -> list[Any]:
    """Every message of the topic, polling until `want` are there (delayed ones come late)."""
    async with PullConsumer(namesrv, "proxy_readback") as consumer:
        deadline = time.monotonic() + timeout
        while True:
            found = []
            for queue in await consumer.queues(topic):
                offset = 0
                while True:
                    result = await consumer.pull(queue, offset, max_messages=64)
                    found += result.messages
                    if not result.messages:
                        break
                    offset = result.next_offset
            if len(found) >= want or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.2)


async def test_official_producer_normal_fifo_delay_transactions(up: Up, v5: Path) -> None:
    topic = "ProxyProduce"
    async with AdminClient(up.namesrv) as admin:
        await admin.create_topic(topic, queues=4)
    events = await _run_worker(v5, "produce", up.proxy, topic)
    assert not [e for e in events if e["event"] == "error"], events
    sent = {e["body"]: e["message_id"] for e in events if e["event"] == "sent"}
    assert set(sent) == {"normal", "fifo-1", "fifo-2", "delayed", "tx-commit", "tx-check"}
    checks = [e for e in events if e["event"] == "check"]
    assert [c["body"] for c in checks][:1] == ["tx-check"], events  # the broker asked the client
    assert checks[0]["message_id"] == sent["tx-check"]

    async with RpcClient() as rpc:  # the check came so soon because every broker has this
        for broker in up.brokers:
            served = await rpc.call(broker, RemotingCommand(code=RequestCode.GET_BROKER_CONFIG), 5)
            assert set(FAST_CHECKS.split()) <= set(served.body.decode().splitlines())

    stored = await _read_all(up.namesrv, topic, len(sent))
    by_body = {m.body.decode(): m for m in stored}
    assert sorted(m.body.decode() for m in stored) == sorted(sent)  # each once, none lost
    for body, message_id in sent.items():
        assert by_body[body].msg_id == message_id  # the client's id is the stored UNIQ_KEY
    assert by_body["normal"].tags == "TagA"
    assert by_body["normal"].keys == ["key-1"]
    fifo = [by_body["fifo-1"], by_body["fifo-2"]]
    assert fifo[0].queue == fifo[1].queue
    assert fifo[0].queue_offset < fifo[1].queue_offset
    assert fifo[0].properties[props.SHARDING_KEY] == "group-1"
    delayed = by_body["delayed"]
    assert delayed.store_timestamp_ms >= delayed.born_timestamp_ms + 900  # held by the timer


async def _produce_with_sdk(namesrv: str, topic: str, bodies: list[str]) -> None:
    async with AdminClient(namesrv) as admin:
        await admin.create_topic(topic, queues=2)
    async with Producer(namesrv) as producer:
        for body in bodies:
            await producer.send(topic, body.encode())


async def test_official_simple_consumer_ack_change_expiry(up: Up, v5: Path) -> None:
    topic, bodies = "ProxySimple", [f"m{i}" for i in range(5)]
    await _produce_with_sdk(up.namesrv, topic, bodies)
    events = await _run_worker(v5, "simple", up.proxy, topic, "proxy_simple", "5")
    received = [(e["body"], e["attempt"]) for e in events if e["event"] == "received"]
    acked = [e["body"] for e in events if e["event"] == "acked"]
    assert sorted(acked) == bodies, json.dumps(events[:40])  # every message acked once
    assert ("m2", 1) in received, events
    assert ("m2", 2) in received, events  # expired, came again
    assert [e["body"] for e in events if e["event"] == "changed"] == ["m1"]
    assert sorted(received) == sorted([(b, 1) for b in bodies] + [("m2", 2)]), events


async def test_official_push_consumer(up: Up, v5: Path) -> None:
    topic, bodies = "ProxyPush", [f"p{i}" for i in range(6)]
    await _produce_with_sdk(up.namesrv, topic, bodies)
    events = await _run_worker(v5, "push", up.proxy, topic, "proxy_push", "6")
    assert not [e for e in events if e["event"] == "error"], events
    assert sorted({e["body"] for e in events if e["event"] == "consumed"}) == bodies


async def test_official_push_consumer_of_a_fifo_group(up: Up, v5: Path) -> None:
    """A FIFO group (consumeMessageOrderly): one message group's messages in send order, each
    consumed (held 300 ms) only after the previous one was done."""
    topic, group, bodies = "ProxyPushFifo", "proxy_push_fifo", [f"f{i}" for i in range(4)]
    async with MQAdmin(up.namesrv) as admin:
        await admin.create_topic(topic, queues=2)
        await admin.update_group(group, {"consumeMessageOrderly": True})
    async with Producer(up.namesrv) as producer:
        queue = (await producer.queues(topic))[0]
        for body in bodies:
            await producer.send(
                topic, body.encode(), queue=queue, properties={props.SHARDING_KEY: "g"}
            )
    events = await _run_worker(v5, "push", up.proxy, topic, group, "4", "300")
    assert not [e for e in events if e["event"] == "error"], events
    consumed = [e for e in events if e["event"] == "consumed"]
    assert [e["body"] for e in consumed] == bodies, events
    for before, after in itertools.pairwise(consumed):
        assert after["start"] >= before["end"], events  # one at a time


async def _cpp_worker(tmp_path: Path, *args: str) -> list[Any]:
    """Run tests/compat's 4.x client worker; its JSON lines."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.compat.cpp_worker",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(tmp_path)},  # the C++ core logs under ~/logs
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()[-3000:]
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith(("{", "["))]


@pytest.mark.compat
async def test_official_4x_client_sends_and_pulls_through_the_ready_files_remoting_port(
    up: Up, tmp_path: Path
) -> None:
    """The 4.x client takes "proxy_remoting" as its NameServer and finds the endpoint there as
    its broker: every message it sent it pulls back once, and the brokers hold each once."""
    topic, bodies = "ProxyUpRemoting", [f"r{i}" for i in range(20)]
    async with AdminClient(up.namesrv) as admin:
        await admin.create_topic(topic, queues=2)
    spec = json.dumps([{"topic": topic, "body": body} for body in bodies])
    [sent] = await _cpp_worker(tmp_path, "produce", up.proxy_remoting, "proxy_up_4x", spec)
    assert [r["status"] for r in sent] == ["OK"] * len(bodies), sent
    offsets = json.dumps({"0": 0, "1": 0})
    pulled = await _cpp_worker(
        tmp_path, "pull", up.proxy_remoting, "proxy_up_4x_pull", topic, offsets
    )
    assert sorted(m["body"] for m in pulled) == sorted(bodies), pulled  # each once, none lost
    assert {m["id"] for m in pulled} == {r["msg_id"] for r in sent}
    assert {m["queue_id"] for m in pulled} == {0, 1}
    stored = await _read_all(up.namesrv, topic, len(bodies))
    assert sorted(m.body.decode() for m in stored) == sorted(bodies)
