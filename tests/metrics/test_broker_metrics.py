"""In-process: a broker's endpoint against what a produce/consume run did."""

from pathlib import Path

from ferrymq.broker.metrics import LATENCY_SAMPLE_EVERY
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.metrics.exporter import MetricsExporterType
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from tests.integration.remoting import create_topic
from tests.metrics.scrape import scrape, value


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

        assert value(samples, "rocketmq_messages_in_total", topic="M") == 30
        assert value(samples, "rocketmq_throughput_in_total", topic="M") == 3000
        assert value(samples, "rocketmq_messages_out_total", topic="M", consumer_group="G") == 5
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
        assert progress.consume_tps > 0  # 5 messages since the broker started, a second ago
        put_10s, put_1m, put_10m = (float(x) for x in runtime["putTps"].split(" "))
        assert min(put_10s, put_1m, put_10m) > 0
        assert float(runtime["getTransferedTps"].split(" ")[0]) > 0
        assert runtime["msgGetTotalTodayNow"] == "5"
