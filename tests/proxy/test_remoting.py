"""The endpoint's remoting side with the official 4.x client (C++ core, its own process): two
broker groups behind one `ferryproxy` group, queue ids mapped both ways, sends and pulls relayed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.proxy.remoting import RemotingRelay
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from ferrymq.wire.bodies import (
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueueBody,
    decode_body,
    encode_body,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

pytestmark = pytest.mark.compat


async def _worker(tmp_path: Path, *args: str) -> list[Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.compat.cpp_worker",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HOME": str(tmp_path)},  # the C++ core logs under ~/logs
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 0, err.decode()[-3000:]
    return [json.loads(line) for line in out.decode().splitlines() if line.startswith(("{", "["))]


async def test_4x_client_sends_and_pulls_through_two_groups(tmp_path: Path) -> None:
    async with LocalCluster(tmp_path / "cluster", brokers=2) as cluster:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.create_topic("ProxyRemoting", queues=2)  # 2 on each group: 4 in all
        relay = RemotingRelay(cluster.namesrv_addr)
        await relay.start()
        try:
            spec = [{"topic": "ProxyRemoting", "body": f"r{i}"} for i in range(8)]
            [sent] = await _worker(tmp_path, "produce", relay.address, "proxy_r", json.dumps(spec))
            assert [r["status"] for r in sent] == ["OK"] * 8, sent
            offsets = json.dumps({str(q): 0 for q in range(4)})
            pulled = await _worker(
                tmp_path, "pull", relay.address, "proxy_rp", "ProxyRemoting", offsets
            )
        finally:
            await relay.close()
        assert sorted(m["body"] for m in pulled) == sorted(s["body"] for s in spec)
        # the client saw queue ids 0..3; behind them, each group's own 0 and 1 took messages
        assert {m["queue_id"] for m in pulled} == {0, 1, 2, 3}
        async with PullConsumer(cluster.namesrv_addr, "proxy_r_check") as consumer:
            per_group: dict[str, int] = {}
            for queue in await consumer.queues("ProxyRemoting"):
                got = len((await consumer.pull(queue, 0)).messages)
                per_group[queue.broker_name] = per_group.get(queue.broker_name, 0) + got
        assert per_group == {"broker-a": 4, "broker-b": 4}, per_group


async def test_lock_batch_maps_queue_ids_both_ways(tmp_path: Path) -> None:
    """An orderly consumer's LOCK_BATCH_MQ of the endpoint's queues locks the real ones."""
    async with LocalCluster(tmp_path, brokers=2) as cluster:
        async with AdminClient(cluster.namesrv_addr) as admin:
            await admin.create_topic("ProxyLock", queues=2)
        relay = RemotingRelay(cluster.namesrv_addr)
        await relay.start()
        try:
            async with RpcClient() as rpc:

                async def lock(client_id: str, code: int = RequestCode.LOCK_BATCH_MQ) -> set[int]:
                    body = LockBatchRequestBody(
                        consumer_group="proxy_lock",
                        client_id=client_id,
                        mq_set=[
                            MessageQueueBody(
                                topic="ProxyLock", broker_name="ferryproxy", queue_id=i
                            )
                            for i in range(4)
                        ],
                    )
                    answer = await rpc.call(
                        relay.address, RemotingCommand(code=code, body=encode_body(body)), 10
                    )
                    assert answer.code == ResponseCode.SUCCESS, answer.remark
                    if code != RequestCode.LOCK_BATCH_MQ:
                        return set()
                    locked = decode_body(answer.body, LockBatchResponseBody).lock_o_k_m_q_set
                    return {q.queue_id for q in locked}

                assert await lock("client-1") == {0, 1, 2, 3}  # both groups' queues
                assert await lock("client-2") == set()  # held by client-1
                await lock("client-1", RequestCode.UNLOCK_BATCH_MQ)
                assert await lock("client-2") == {0, 1, 2, 3}
        finally:
            await relay.close()
