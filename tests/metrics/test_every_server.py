"""Must-show (issue 22): every server's endpoint of `ferry up`, scraped during a produce/consume
load, against what the load did: messages in = acknowledged sends, lag = produced - consumed."""

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ferrymq.broker.metrics import LATENCY_SAMPLE_EVERY
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from tests.metrics.scrape import Samples, scrape, scrape_text, value
from tests.system.test_up import _up

pytestmark = pytest.mark.system

_SENDS = 300
_LOAD_S = 60.0


async def _ferry(*args: str) -> str:
    cli = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ferrymq.cmd.ferry",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )
    out, err = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0, err.decode()
    return out.decode()


async def _poll(address: str, check: str, ok: Callable[[Samples], bool]) -> Samples:
    deadline = time.monotonic() + 30
    while True:
        samples = await scrape(address)
        if ok(samples):
            return samples
        assert time.monotonic() < deadline, f"{check} never held at {address}"
        await asyncio.sleep(0.2)


async def test_every_server_counts_what_the_load_did(tmp_path: Path) -> None:
    process, info = _up(
        tmp_path, "--controllers", "1", "--replicas", "2", "--connect", "1", "--no-console"
    )
    try:
        namesrv = str(info["namesrv"])
        brokers = info["brokers"]
        controllers = info["controllers"]
        workers = info["connect"]
        namesrvs = info["namesrvs"]
        assert isinstance(brokers, list)
        assert isinstance(controllers, list)
        assert isinstance(workers, list)
        assert isinstance(namesrvs, list)
        entries = [*brokers, *controllers, *workers, *namesrvs]
        assert all(entry["metrics"] for entry in entries), entries
        master = next(b for b in brokers if b["role"] != "SLAVE")
        raft = str(controllers[0]["metrics"])
        committed = value(await scrape(raft), "rocketmq_controller_raft_commit_index")
        async with AdminClient(namesrv) as admin:
            await admin.create_topic("Metered", queues=2)  # a write through the controller
            deadline = time.monotonic() + 30
            while await admin.route("Metered") is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        await _poll(
            raft,
            "the topic's Raft entry committed",
            lambda s: value(s, "rocketmq_controller_raft_commit_index") > committed,
        )

        acked = 0
        mid_load: Samples = {}
        async with Producer(namesrv) as producer, PullConsumer(namesrv, "MeterGroup") as consumer:
            started = time.monotonic()
            for i in range(_SENDS):
                await producer.send("Metered", b"m" * 64)
                acked += 1
                if i == _SENDS // 2:  # a scrape during the load: no more than was acknowledged
                    mid_load = await scrape(str(master["metrics"]))
                    assert value(mid_load, "rocketmq_messages_in_total", topic="Metered") <= acked
                assert time.monotonic() - started < _LOAD_S
            consumed = 0
            for queue in await consumer.queues("Metered"):
                pulled = await consumer.pull(queue, 0, max_messages=50)
                assert pulled.status is PullStatus.FOUND
                await consumer.commit(queue, len(pulled.messages))
                consumed += len(pulled.messages)

        # clusterList's InTPS and OutTPS are 10 s rates: read them while the load is fresh
        deadline = time.monotonic() + 30
        while True:
            listing = await _ferry("admin", "--namesrv", namesrv, "cluster", "list")
            (row,) = [line for line in listing.splitlines() if str(master["addr"]) in line]
            in_tps, out_tps = (float(c.strip()) for c in row.strip(" │\n").split("│")[-2:])
            if in_tps > 0 and out_tps > 0:
                break
            assert time.monotonic() < deadline, f"clusterList shows no TPS: {row}"
            await asyncio.sleep(0.2)

        samples = await _poll(
            str(master["metrics"]),
            "consumed offsets committed",
            lambda s: (
                value(s, "rocketmq_consumer_lag_messages", consumer_group="MeterGroup")
                == acked - consumed
            ),
        )
        assert value(samples, "rocketmq_messages_in_total", topic="Metered") == acked == _SENDS
        assert value(samples, "rocketmq_throughput_in_total", topic="Metered") == 64 * acked
        out = value(samples, "rocketmq_messages_out_total", consumer_group="MeterGroup")
        assert out == consumed
        timed = value(samples, "rocketmq_send_latency_seconds_count")  # one send in 8
        assert abs(timed - acked // LATENCY_SAMPLE_EVERY) <= 2
        assert value(samples, "rocketmq_sync_state_set_size") == 2
        # the slave acknowledged everything: no replication lag (polled: acks trail the sends)
        samples = await _poll(
            str(master["metrics"]),
            "slave caught up",
            lambda s: value(s, "rocketmq_replication_lag_bytes", in_sync="true") == 0,
        )
        assert value(samples, "rocketmq_broker_confirm_offset") == value(
            samples, "rocketmq_brokeruntime_commitlog_maxoffset"
        )

        # the same counts as RocketMQ's tools read them: consumeTps (clusterList's TPS above)
        progress = await _ferry(
            "admin", "--namesrv", namesrv, "consumer", "progress", "MeterGroup", "--json"
        )
        assert json.loads(progress)["consumeTps"] > 0

        node = await scrape(str(controllers[0]["metrics"]))
        assert value(node, "rocketmq_controller_raft_term") >= 1
        assert value(node, "rocketmq_controller_raft_leader_changes_total") >= 1
        applied = value(node, "rocketmq_controller_raft_applied_index")
        assert applied >= 1
        assert value(node, "rocketmq_controller_raft_commit_index") >= applied
        assert value(node, "rocketmq_controller_sync_state_set_size", broker="broker-a") == 2
        assert value(node, "rocketmq_controller_role") == 1
        routes = await scrape(str(namesrvs[0]["metrics"]))
        assert value(routes, "rocketmq_namesrv_brokers") == 2
        assert value(routes, "rocketmq_namesrv_topics") >= 1
        worker = await scrape_text(str(workers[0]["metrics"]))  # no connector: families only
        assert "# TYPE ferrymq_connect_task_lag_messages gauge" in worker
        assert "ferrymq_connect_task_state{" not in worker
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
