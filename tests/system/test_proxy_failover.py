"""The official 4.x client through the endpoint's remoting port across kill -9 of the master
(issue 21): `ferry up`'s processes (3 controllers, a NameServer, a group of 3 replicas, the
endpoint); the C++ client sends without pause to `proxy_remoting`; five times the master is
killed (and started again, to rejoin as a slave). gap = kill -> first acknowledgement of a send
started after it. Median of the five within 2 s; every acknowledged send is stored.
"""

import asyncio
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

from ..proxy.v5env import v5_python

pytestmark = [pytest.mark.system, pytest.mark.compat, pytest.mark.asyncio(loop_scope="module")]

log = logging.getLogger(__name__)

TOPIC = "ProxyFailover"
ROUNDS = 5


async def _master(
    admin: AdminClient,
    *,
    topic: str = TOPIC,
    not_addr: str = "",
    timeout: float = 60.0,
    poll: float = 0.1,
) -> str:
    deadline = time.monotonic() + timeout
    while True:
        route = await admin.route(topic)
        if route is not None:
            for broker in route.broker_datas:
                address = broker.broker_addrs.get(0)
                if address and address != not_addr:
                    return address
        assert time.monotonic() < deadline, "no master in the route"
        await asyncio.sleep(poll)


async def _in_sync(client: RpcClient, master: str, members: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        response = await client.call(
            master, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 3
        )
        if decode_body(response.body, KVTable).table.get("syncStateSet", "").count(",") >= (
            members - 1
        ):
            return
        assert time.monotonic() < deadline, "the slaves never joined the SyncStateSet"
        await asyncio.sleep(0.1)


async def _stored(namesrv: str) -> set[str]:
    found: set[str] = set()
    async with PullConsumer(namesrv, "proxy_failover_check") as consumer:
        for queue in await consumer.queues(TOPIC):
            offset = 0
            while True:
                result = await consumer.pull(queue, offset, max_messages=256)
                if not result.messages:
                    break
                found |= {m.body.decode() for m in result.messages}
                offset = result.next_offset
    return found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ProcessCluster]:
    """`ferry up`'s processes with the endpoint, shared by this module's tests."""
    up = ProcessCluster(
        UpConfig(
            data_dir=tmp_path_factory.mktemp("proxy-failover"),
            replicas=3,
            controllers=3,
            proxy=True,
            segment_bytes=16 * 1024 * 1024,
        )
    )
    await up.start()
    try:
        yield up
    finally:
        await up.stop()


async def test_official_4x_client_through_the_endpoint_across_master_kills(
    cluster: ProcessCluster, tmp_path: Path
) -> None:
    rows: list[dict[str, Any]] = []
    assert cluster.proxy is not None
    remoting = str(cluster.proxy.info["remoting"])
    async with AdminClient(cluster.namesrv_addr) as admin, RpcClient() as client:
        await admin.create_topic(TOPIC, queues=4)
        master = await _master(admin)
        producer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.proxy.cpp_stream",
            remoting,
            TOPIC,
            "300",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "HOME": str(tmp_path)},  # the C++ core logs under ~/logs
        )
        assert producer.stdout is not None
        stdout = producer.stdout

        async def read_rows() -> None:
            async for line in stdout:
                rows.append(json.loads(line))  # noqa: PERF401 -- read while the test runs

        reader = asyncio.get_running_loop().create_task(read_rows())
        gaps: list[float] = []
        elects: list[float] = []
        try:
            for _ in range(ROUNDS):
                count = len(rows)
                deadline = time.monotonic() + 30
                while len([r for r in rows[count:] if r["ok"]]) < 20:  # sending through it
                    assert time.monotonic() < deadline, rows[-5:]
                    await asyncio.sleep(0.05)
                await _in_sync(client, master, 2)  # another replica can take over
                victim = next(n for n, c in cluster.brokers.items() if c.addr == master)
                killed_at = time.time()
                cluster.brokers[victim].kill()
                master = await _master(admin, not_addr=master, poll=0.02)
                elects.append(time.time() - killed_at)
                deadline = time.monotonic() + 30
                while not [r for r in rows if r["ok"] and r["start"] > killed_at]:
                    assert time.monotonic() < deadline, f"no send acknowledged: {rows[-5:]}"
                    await asyncio.sleep(0.02)
                first = min(r["end"] for r in rows if r["ok"] and r["start"] > killed_at)
                gaps.append(first - killed_at)
                await cluster.brokers[victim].process.wait()
                await cluster.restart(victim)  # rejoins as a slave while the next round runs
        finally:
            if producer.returncode is None:
                producer.terminate()
            await asyncio.wait_for(producer.wait(), 30)
            await asyncio.wait_for(reader, 10)
        acked = {r["body"] for r in rows if r["ok"]}
        missing = acked - await _stored(cluster.namesrv_addr)
        log.warning(
            "gaps %s s (the route named the new master after %s s), %d acked of %d sends",
            [round(g, 2) for g in gaps],
            [round(e, 2) for e in elects],
            len(acked),
            len(rows),
        )
        assert not missing, f"{len(missing)} acknowledged sends lost: {sorted(missing)[:5]}"
        assert statistics.median(gaps) <= 2.0, gaps


V5_WORKER = Path(__file__).parents[1] / "proxy" / "v5_worker.py"


async def test_official_5x_producer_and_simple_consumer_across_a_master_kill(
    cluster: ProcessCluster,
) -> None:
    """Every send the producer saw acknowledged is received (message id and body), nothing acked
    before the kill comes again after it, and exactly the messages in flight at the kill (received,
    their ack not answered by then, nor answered later for that delivery) come again after it.
    """
    events: list[dict[str, Any]] = []
    assert cluster.proxy is not None
    topic = "ProxyFailover5"
    async with AdminClient(cluster.namesrv_addr) as admin, RpcClient() as client:
        await admin.create_topic(topic, queues=2)
        master = await _master(admin, topic=topic)
        await _in_sync(client, master, 3)
        worker = await asyncio.create_subprocess_exec(
            str(v5_python()),
            str(V5_WORKER),
            "failover",
            str(cluster.proxy.info["grpc"]),
            topic,
            "proxy_failover5",
            "120",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        assert worker.stdout is not None
        stdout = worker.stdout

        async def read_events() -> None:
            async for line in stdout:
                if line.startswith(b"{"):
                    events.append(json.loads(line))  # noqa: PERF401 -- read while running

        reader = asyncio.get_running_loop().create_task(read_events())

        def count(kind: str, after: float = 0.0) -> int:
            return sum(
                1 for e in events if e["event"] == kind and e.get("at", e.get("end", 0)) > after
            )

        try:
            deadline = time.monotonic() + 60
            while count("acked") < 30:  # producing and consuming through the endpoint
                assert time.monotonic() < deadline, events[-5:]
                await asyncio.sleep(0.05)
            victim = next(n for n, c in cluster.brokers.items() if c.addr == master)
            killed_at = time.time()
            cluster.brokers[victim].kill()
            deadline = time.monotonic() + 60
            # consuming past every pre-kill delivery's 3 s invisible time (a lost ack shows)
            while count("acked", killed_at + 4) < 5:
                assert time.monotonic() < deadline, events[-5:]
                await asyncio.sleep(0.1)
        finally:
            if worker.returncode is None:
                worker.terminate()  # it stops sending, then drains (30 s at most)
            await asyncio.wait_for(worker.wait(), 60)
            await asyncio.wait_for(reader, 10)
    assert events[-1]["event"] == "drained", events[-3:]
    sent = [e for e in events if e["event"] == "sent"]
    received = [e for e in events if e["event"] == "received"]
    acks = [e for e in events if e["event"] == "acked"]
    sent_ok = {(e["id"], e["body"]) for e in sent if e["ok"]}
    got = {(r["id"], r["body"]) for r in received}
    assert sent_ok - got == set(), events[-1]  # every acknowledged send received
    assert {b for _, b in got - sent_ok} <= {e["body"] for e in sent if not e["ok"]}
    acked_before = {e["body"] for e in acks if e["at"] < killed_at}
    again = {r["body"] for r in received if r["at"] > killed_at}
    assert acked_before & again == set()
    first_ack = {e["body"]: e["at"] for e in reversed(acks)}
    assert {r["body"] for r in received if r["at"] > first_ack.get(r["body"], 1e18)} == set()
    # in flight at the kill: received before it, not acked before it; minus those whose ack of
    # that (pre-kill) delivery was answered after the kill. Exactly those come again.
    timeline = sorted(received + acks, key=lambda e: e["at"])
    in_flight: set[str] = set()
    for e in timeline:
        if e["at"] >= killed_at:
            break
        (in_flight.add if e["event"] == "received" else in_flight.discard)(e["body"])
    acked_late = set()
    for body in in_flight:
        after = [e for e in timeline if e["body"] == body and e["at"] >= killed_at]
        if after and after[0]["event"] == "acked":
            acked_late.add(body)
    assert in_flight - acked_late, "nothing was in flight at the kill"
    assert in_flight & again == in_flight - acked_late
    log.warning(
        "5.x across a kill: %d sends acked, %d acked by the consumer, %d in flight came again",
        len(sent_ok),
        len(acks),
        len(in_flight - acked_late),
    )
