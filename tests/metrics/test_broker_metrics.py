"""In-process: a broker's endpoint against what a produce/consume run did."""

import asyncio
from pathlib import Path

from ferrymq.broker.metrics import LATENCY_SAMPLE_EVERY
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.metrics.exporter import MetricsExporterType
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from tests.integration.remoting import create_topic
from tests.metrics.scrape import Samples, scrape, value


async def _poll(address: str, histogram: str) -> Samples:
    """Scrape until `histogram` counted something (the flusher thread observes after an fsync)."""
    async with asyncio.timeout(30):
        while value(samples := await scrape(address), f"{histogram}_count") == 0:
            await asyncio.sleep(0.05)
    return samples


async def test_broker_counts_sends_pulls_and_lag(tmp_path: Path) -> None:
    async with (
        LocalCluster(
            tmp_path,
            metrics_exporter_type=MetricsExporterType.PROM,
            metrics_prom_exporter_port=0,
        ) as cluster,
        RpcClient() as client,
    ):
        broker = cluster.broker
        assert broker.metrics is not None
        await create_topic(client, broker.address, "M", 2)
        await broker.register()
        async with (
            Producer(cluster.namesrv_addr) as producer,
            PullConsumer(cluster.namesrv_addr, "G") as consumer,
        ):
            sent = [await producer.send("M", b"x" * 100) for _ in range(30)]
            queue = sent[0].queue
            in_queue = sum(1 for r in sent if r.queue == queue)
            got = await consumer.pull(queue, 0, max_messages=5)
            assert len(got.messages) == 5
            await consumer.commit(queue, 5)
            samples = await scrape(broker.metrics.address)
            more = await consumer.pull(queue, 5, max_messages=3)  # stored bytes, as pulled
            grown = await scrape(broker.metrics.address)
            flushed = await _poll(broker.metrics.address, "rocketmq_storage_flush_latency_seconds")

        assert value(samples, "rocketmq_messages_in_total", topic="M") == 30
        assert value(samples, "rocketmq_throughput_in_total", topic="M") == 3000
        assert value(samples, "rocketmq_messages_out_total", topic="M", consumer_group="G") == 5
        out = {"topic": "M", "consumer_group": "G"}
        stored = [len(broker.state.store.read_record(m.log_offset)) for m in got.messages]
        assert value(samples, "rocketmq_throughput_out_total", **out) == sum(stored)
        grew = sum(len(broker.state.store.read_record(m.log_offset)) for m in more.messages)
        assert len(more.messages) == 3
        assert value(grown, "rocketmq_throughput_out_total", **out) == sum(stored) + grew
        assert value(flushed, "rocketmq_storage_flush_latency_seconds_count") > 0
        lag = value(
            samples,
            "rocketmq_consumer_lag_messages",
            topic="M",
            consumer_group="G",
            queue_id=str(queue.queue_id),
        )
        assert lag == in_queue - 5
        timed = value(samples, "rocketmq_send_latency_seconds_count")
        assert timed == 30 // LATENCY_SAMPLE_EVERY  # one send in 8 is timed
        assert value(samples, "rocketmq_pull_latency_seconds_count") >= 1
        assert value(samples, "rocketmq_storage_dispatch_behind_bytes") == 0
        assert 0 < value(samples, "rocketmq_brokeruntime_commitlog_disk_ratio") < 1
        async with AdminClient(cluster.namesrv_addr) as admin:
            progress = await admin.consume_stats("G", "M")
            runtime = await admin.runtime_info(broker.address)
        assert progress.consume_tps > 0  # 8 messages since the broker started, a second ago
        put_10s, put_1m, put_10m = (float(x) for x in runtime["putTps"].split(" "))
        assert min(put_10s, put_1m, put_10m) > 0
        assert float(runtime["getTransferedTps"].split(" ")[0]) > 0
        assert runtime["msgGetTotalTodayNow"] == "8"  # 5 + 3 pulled
