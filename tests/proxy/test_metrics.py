"""The endpoint's Prometheus metrics (issue 22: metrics on every server, the proxy too).

`run_proxy` (what `ferry proxy --metrics-exporter-type PROM` runs) against an in-process
cluster: its ready file names the scrape address, and after sends, a receive and a malformed
request over raw gRPC the scrape counts each call by RPC and v2 status, and the messages relayed.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import grpc

from ferrymq.client.admin import AdminClient
from ferrymq.cmd.proxy import run_proxy
from ferrymq.proxy.stubs import SERVICE, load
from ferrymq.testing import LocalCluster

from ..metrics.scrape import scrape, value
from . import raw


async def test_the_endpoint_counts_calls_and_messages(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    v2 = load()
    topic, group = "ProxyMetrics", "proxy_metrics"
    async with AdminClient(cluster.namesrv_addr) as admin:
        await admin.create_topic(topic, queues=1)
    stop, ready = asyncio.Event(), tmp_path / "proxy.json"
    served = asyncio.get_running_loop().create_task(
        run_proxy(
            stop,
            namesrv=cluster.namesrv_addr,
            host="127.0.0.1",
            grpc_port=0,
            remoting_port=-1,
            tls=None,
            ready_file=ready,
            metrics=("PROM", "", 0),
        )
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert not served.done(), served
            assert time.monotonic() < deadline, "the endpoint never became ready"
            await asyncio.sleep(0.05)
        info = json.loads(ready.read_text())
        async with grpc.aio.insecure_channel(info["grpc"]) as channel:

            def rpc(name: str, stream: bool = False) -> Any:
                return raw.rpc(channel, v2, name, stream=stream)

            send = v2.SendMessageRequest()
            for i in range(3):
                message = send.messages.add()
                message.topic.name = topic
                message.body = f"m{i}".encode()
                message.system_properties.message_id = f"id{i}"
                message.system_properties.body_encoding = v2.enum("Encoding", "IDENTITY")
                message.system_properties.message_type = v2.enum("MessageType", "NORMAL")
            sent = await rpc("SendMessage")(send, timeout=10)
            assert sent.status.code == v2.code("OK"), sent.status
            receive = v2.ReceiveMessageRequest(batch_size=8)
            receive.group.name = group
            receive.message_queue.topic.name = topic
            receive.invisible_duration.FromSeconds(60)
            receive.long_polling_timeout.FromSeconds(2)
            got = 0
            for _ in range(5):  # POP may answer part of the queue per call
                parts = [p async for p in rpc("ReceiveMessage", stream=True)(receive, timeout=10)]
                got += sum(1 for p in parts if p.HasField("message"))
                if got == 3:
                    break
            assert got == 3
            bad: Any = channel.unary_unary(f"/{SERVICE}/SendMessage")  # bytes, not a request
            answer = v2.SendMessageResponse.FromString(await bad(b"\xff\xff\xff", timeout=10))
            assert answer.status.code == v2.code("BAD_REQUEST")

        samples = await scrape(info["metrics"])
        assert value(samples, "rocketmq_proxy_rpc_calls_total", rpc="SendMessage", code="OK") == 1
        assert (
            value(samples, "rocketmq_proxy_rpc_calls_total", rpc="SendMessage", code="BAD_REQUEST")
            == 1
        )
        assert value(samples, "rocketmq_proxy_rpc_calls_total", rpc="ReceiveMessage") >= 1
        assert value(samples, "rocketmq_proxy_rpc_latency_seconds_count", rpc="SendMessage") == 2
        assert value(samples, "rocketmq_proxy_messages_sent_total") == 3
        assert value(samples, "rocketmq_proxy_messages_received_total") == 3
    finally:
        stop.set()
        await served
