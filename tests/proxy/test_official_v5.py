"""The official 5.x Python client (PyPI rocketmq-python-client 5.1.2), unchanged, through the
gRPC endpoint: it runs in its own venv as a child process; the cluster and the endpoint run in the
test's loop on port 0, and ferrymq's own SDK reads back what the client stored.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.mqadmin import MQAdmin
from ferrymq.client.producer import Producer
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.testing import LocalCluster
from ferrymq.wire import properties as props

WORKER = Path(__file__).with_name("v5_worker.py")


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


async def test_official_producer_normal_fifo_delay_transactions(
    cluster: LocalCluster, endpoint: GrpcEndpoint, v5: Path
) -> None:
    topic = "ProxyProduce"
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=4)
    events = await _run_worker(v5, "produce", endpoint.address, topic)
    assert not [e for e in events if e["event"] == "error"], events
    sent = {e["body"]: e["message_id"] for e in events if e["event"] == "sent"}
    assert set(sent) == {"normal", "fifo-1", "fifo-2", "delayed", "tx-commit", "tx-check"}
    checks = [e for e in events if e["event"] == "check"]
    assert [c["body"] for c in checks][:1] == ["tx-check"], events  # the broker asked the client
    assert checks[0]["message_id"] == sent["tx-check"]

    stored = await _read_all(cluster.namesrv_addr, topic, len(sent))
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


async def test_official_simple_consumer_ack_change_expiry(
    cluster: LocalCluster, endpoint: GrpcEndpoint, v5: Path
) -> None:
    topic, bodies = "ProxySimple", [f"m{i}" for i in range(5)]
    await _produce_with_sdk(cluster.namesrv_addr, topic, bodies)
    events = await _run_worker(v5, "simple", endpoint.address, topic, "proxy_simple", "5")
    received = [(e["body"], e["attempt"]) for e in events if e["event"] == "received"]
    acked = [e["body"] for e in events if e["event"] == "acked"]
    assert sorted(acked) == bodies, json.dumps(events[:40])  # every message acked once
    assert ("m2", 1) in received, events
    assert ("m2", 2) in received, events  # expired, came again
    assert [e["body"] for e in events if e["event"] == "changed"] == ["m1"]
    assert sorted(received) == sorted([(b, 1) for b in bodies] + [("m2", 2)]), events


async def test_official_push_consumer(
    cluster: LocalCluster, endpoint: GrpcEndpoint, v5: Path
) -> None:
    topic, bodies = "ProxyPush", [f"p{i}" for i in range(6)]
    await _produce_with_sdk(cluster.namesrv_addr, topic, bodies)
    events = await _run_worker(v5, "push", endpoint.address, topic, "proxy_push", "6")
    assert not [e for e in events if e["event"] == "error"], events
    assert sorted({e["body"] for e in events if e["event"] == "consumed"}) == bodies


async def test_official_push_consumer_of_a_fifo_group(
    cluster: LocalCluster, endpoint: GrpcEndpoint, v5: Path
) -> None:
    """A FIFO group (consumeMessageOrderly): one message group's messages in send order, each
    consumed (held 300 ms) only after the previous one was done."""
    topic, group, bodies = "ProxyPushFifo", "proxy_push_fifo", [f"f{i}" for i in range(4)]
    async with MQAdmin(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=2)
        await admin.update_group(group, {"consumeMessageOrderly": True})
    async with Producer(cluster.namesrv_addr) as producer:
        queue = (await producer.queues(topic))[0]
        for body in bodies:
            await producer.send(
                topic, body.encode(), queue=queue, properties={props.SHARDING_KEY: "g"}
            )
    events = await _run_worker(v5, "push", endpoint.address, topic, group, "4", "300")
    assert not [e for e in events if e["event"] == "error"], events
    consumed = [e for e in events if e["event"] == "consumed"]
    assert [e["body"] for e in consumed] == bodies, events
    for before, after in itertools.pairwise(consumed):
        assert after["start"] >= before["end"], events  # one at a time
