"""Must-show (issue 22): every server's endpoint of `ferry up`, scraped during a produce/consume
load, against what the load did: messages in = acknowledged sends, lag = produced - consumed.

While the load runs, every server of the ready file is scraped until a count that moves with it
has moved: the master's messages in, each slave's replicated commit log, each NameServer's
routes (the load's topic), each controller's Raft applied index (the topic's entry), the
proxy's relayed sends (a few sent through its gRPC port); a Connect worker with no connector
has nothing to count and is scraped only. After it, the exact figures."""

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from ferrymq.broker.metrics import LATENCY_SAMPLE_EVERY
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.proxy.stubs import load as load_v2
from tests.metrics.scrape import Samples, scrape, scrape_text, value
from tests.proxy import raw
from tests.system.test_up import _up

pytestmark = pytest.mark.system

_MIN_SENDS = 300
_MAX_SENDS = 5000
"""The load sends at least `_MIN_SENDS`, and on until every server was seen counting it."""
_LOAD_S = 60.0
_MAXOFFSET = "rocketmq_brokeruntime_commitlog_maxoffset"
Check = Callable[[Samples], bool]


def _in(samples: Samples) -> float:
    return value(samples, "rocketmq_messages_in_total", topic="Metered")


def _applied(samples: Samples) -> float:
    return value(samples, "rocketmq_controller_raft_applied_index")


async def _during(
    sending: asyncio.Task[None], where: str, what: str, ok: Callable[[str], Check]
) -> Samples:
    """Scrape `where` until `ok(where)` holds, which must happen while the load still runs."""
    check = ok(where)
    deadline = time.monotonic() + 30
    while True:
        samples = await scrape(where)
        if check(samples):
            assert not sending.done(), f"{where}: {what} only after the load ({sending})"
            return samples
        assert not sending.done(), f"{where}: {what} not seen while the load ran ({sending})"
        assert time.monotonic() < deadline, f"{where}: {what} never held"
        await asyncio.sleep(0.1)


async def _proxy_send(grpc_addr: str, topic: str, count: int) -> None:
    """`count` messages of 64 bytes through the proxy's gRPC SendMessage, in one call."""
    v2 = load_v2()
    send = v2.SendMessageRequest()
    for i in range(count):
        message = send.messages.add()
        message.topic.name = topic
        message.body = b"p" * 64
        message.system_properties.message_id = f"proxied{i}"
        message.system_properties.body_encoding = v2.enum("Encoding", "IDENTITY")
        message.system_properties.message_type = v2.enum("MessageType", "NORMAL")
    async with grpc.aio.insecure_channel(grpc_addr) as channel:
        sent = await raw.rpc(channel, v2, "SendMessage")(send, timeout=30)
    assert sent.status.code == v2.code("OK"), sent.status


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
        slaves = [b for b in brokers if b["role"] == "SLAVE"]
        assert slaves, brokers
        assert info["proxy_metrics"], info
        raft = str(controllers[0]["metrics"])
        committed = value(await scrape(raft), "rocketmq_controller_raft_commit_index")
        known = {  # each NameServer's routes before the topic
            str(n["metrics"]): value(await scrape(str(n["metrics"])), "rocketmq_namesrv_topics")
            for n in namesrvs
        }
        stored = {  # each slave's replicated log before the load
            str(b["metrics"]): value(
                await scrape(str(b["metrics"])), "rocketmq_brokeruntime_commitlog_maxoffset"
            )
            for b in slaves
        }
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

        def _grown(name: str, before: dict[str, float]) -> Callable[[str], Check]:
            return lambda where: lambda s: value(s, name) > before[where]

        def _counted(samples: Samples) -> bool:  # read as the scrape returns: acked is current
            assert _in(samples) <= acked + 1 + proxied  # one send may be in flight
            return _in(samples) > 0

        watched: list[tuple[dict[str, object], str, Callable[[str], Check]]] = [
            (master, "messages in, no more than acknowledged", lambda _: _counted),
            *((b, "replicated log grew", _grown(_MAXOFFSET, stored)) for b in slaves),
            *((n, "routes the topic", _grown("rocketmq_namesrv_topics", known)) for n in namesrvs),
            *(  # the topic's Raft entry applied on every node
                (c, "Raft applied the topic", lambda _: lambda s: _applied(s) > committed)
                for c in controllers
            ),
            *((w, "answers", lambda _: lambda s: True) for w in workers),  # no connector to count
            (
                {"metrics": info["proxy_metrics"]},
                "the proxy's sends",
                lambda _: lambda s: value(s, "rocketmq_proxy_messages_sent_total") == proxied,
            ),
        ]

        acked, proxied = 0, 3
        sending_done = asyncio.Event()

        async def load(producer: Producer) -> None:  # until every server was seen counting
            nonlocal acked
            started = time.monotonic()
            while acked < _MIN_SENDS or (acked < _MAX_SENDS and not sending_done.is_set()):
                await producer.send("Metered", b"m" * 64)
                acked += 1
                assert time.monotonic() - started < _LOAD_S

        async with Producer(namesrv) as producer, PullConsumer(namesrv, "MeterGroup") as consumer:
            sending = asyncio.get_running_loop().create_task(load(producer))
            try:
                await _proxy_send(str(info["proxy"]), "Metered", proxied)
                seen = await asyncio.gather(
                    *(_during(sending, str(e["metrics"]), what, ok) for e, what, ok in watched)
                )
            finally:
                sending_done.set()
                await sending
            assert len(seen) == len(watched)
            acked += proxied
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
        assert value(samples, "rocketmq_messages_in_total", topic="Metered") == acked
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
