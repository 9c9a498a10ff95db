"""A failover under running Spark queries (issue 9).

A controller-mode cluster of real processes (a NameServer with an embedded controller, one
broker group of three replicas with sync replication) holds a source and a target topic. One
query streams the source into Parquet, another streams it into the target topic through the
exactly-once sink, while a producer keeps sending; the test kills -9 the master by PID in the
middle of a micro-batch of the writing query (rows prepared, commit not decided: checked in the
stopped master's commit log) and the controller elects another. Each query either keeps going,
or fails with a `RetryableQueryError` and, restarted from its checkpoint, finishes. With a
200 ms failover timeout the replicas are held stopped until the writing query has failed, so it
must take that path. Either way the Parquet output holds every acknowledged message once, and
the target topic every source row once.
"""

import asyncio
import json
import logging
import mmap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ferrymq.broker.metadata import SINK_TOPIC
from ferrymq.broker.sink import Decide, decision_of
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import Child
from ferrymq.cmd.up import ProcessCluster, UpConfig
from ferrymq.errors import FerryError, ProtocolError, SendOutcomeUnknownError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.broker import GetMaxOffsetRequestHeader
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.records import BLANK_MAGIC, decode_record, peek_record_size

pytestmark = pytest.mark.spark

log = logging.getLogger(__name__)

SOURCE, TARGET = "FailoverIn", "FailoverOut"
KEPT_GOING, RESTARTED = "kept going", "failed retryably and finished after a restart"


@dataclass
class Sent:
    """What the producer sent, by outcome."""

    acked: list[bytes] = field(default_factory=list)
    unknown: set[bytes] = field(default_factory=set)
    failed: int = 0


async def send(producer: Producer, bodies: list[bytes], sent: Sent) -> None:
    try:
        await producer.send_batch(SOURCE, bodies)
    except SendOutcomeUnknownError:
        sent.unknown.update(bodies)
    except FerryError:
        sent.failed += len(bodies)
    else:
        sent.acked += bodies


async def master(admin: AdminClient, *, not_addr: str = "", timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        route = await admin.route(SOURCE)
        if route is not None:
            for broker in route.broker_datas:
                address = broker.broker_addrs.get(0)
                if address and address != not_addr:
                    return address
        assert time.monotonic() < deadline, "no master in the route"
        await asyncio.sleep(0.1)


async def wait_in_sync(admin: AdminClient, replicas: int) -> str:
    """The master once every replica is in its SyncStateSet."""
    address = await master(admin)
    deadline = time.monotonic() + 30
    async with RpcClient() as client:
        while True:
            request = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO)
            response = await client.call(address, request, 3)
            members = decode_body(response.body, KVTable).table.get("syncStateSet", "")
            if members.count(",") >= replicas - 1:
                return address
            assert time.monotonic() < deadline, f"the SyncStateSet stays {members}"
            await asyncio.sleep(0.1)


async def sink_log_end(client: RpcClient, address: str) -> int:
    """How many records the broker's exactly-once sink log holds (prepared rows, decisions)."""
    header = GetMaxOffsetRequestHeader(topic=SINK_TOPIC, queue_id=0)
    request = RemotingCommand(code=RequestCode.GET_MAX_OFFSET, ext_fields=to_ext_fields(header))
    response = await client.call(address, request, 3)
    return int(response.ext_fields["offset"])


async def topic_bodies(servers: str, topic: str) -> tuple[list[bytes], dict[str, Any]]:
    """Every message body of the topic, and its end offsets as checkpoint JSON."""
    async with PullConsumer(servers, "failover-check") as consumer:
        bodies: list[bytes] = []
        ends: dict[str, dict[str, int]] = {}
        for queue in await consumer.queues(topic):
            end = await consumer.max_offset(queue)
            ends.setdefault(queue.broker_name, {})[str(queue.queue_id)] = end
            messages = await consumer.fetch_range(queue, 0, end)
            assert [m.queue_offset for m in messages] == list(range(end)), queue
            bodies += [m.body for m in messages]
        return bodies, {topic: ends}


def batches(log: Path) -> int:
    """How many micro-batches a checkpoint's offsets or commits log records."""
    return len([p for p in log.iterdir() if p.name.isdigit()]) if log.exists() else 0


def committed_end(checkpoint: Path) -> Any:
    """The source offsets the last committed micro-batch ended at (None before the first)."""
    done = batches(checkpoint / "commits")
    if not done:
        return None
    lines = (checkpoint / "offsets" / str(done - 1)).read_text().splitlines()
    return json.loads(lines[2])


def decided_batches(store_dir: Path) -> set[int]:
    """The sink batches a stopped broker's commit log holds a decision for, read from its files."""
    decided: set[int] = set()
    for path in sorted((store_dir / "commitlog").iterdir()):
        with (
            path.open("rb") as file,
            mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
            memoryview(mapped) as data,
        ):
            position = 0
            while position + 8 <= len(data):
                try:
                    size, magic = peek_record_size(data, position)
                    if magic == BLANK_MAGIC:
                        break
                    op = decision_of(decode_record(data, position))
                except ProtocolError:
                    return decided  # the end of what was written (or a torn last record)
                if isinstance(op, Decide):
                    decided.add(op.batch)
                position += size
    return decided


async def kill_mid_batch(
    victim: Child, checkpoint: Path, deadline: float, *, hold: list[Child]
) -> int:
    """kill -9 the master in the middle of a micro-batch of the writing query; returns its id.

    In the middle: its tasks began to prepare rows (the first landed in the sink log), and its
    commit has not been decided, so the rest of the batch meets a group without a master. The
    master is stopped (SIGSTOP) at the first prepared row and its commit log read from disk: a
    batch whose decision it already holds (the whole batch ran between two polls) is let go on
    (SIGCONT) and the next one is tried. The processes in `hold` are stopped (SIGSTOP) just
    before the kill.
    """
    async with RpcClient() as client:
        for _ in range(5):
            planned = batches(checkpoint / "offsets")
            while batches(checkpoint / "offsets") == planned:
                assert time.monotonic() < deadline, "the writing query planned no batch"
                await asyncio.sleep(0.005)
            in_flight = batches(checkpoint / "offsets") - 1
            prepared = await sink_log_end(client, victim.addr)
            while await sink_log_end(client, victim.addr) == prepared:
                assert time.monotonic() < deadline, "the writing query prepared no rows"
                await asyncio.sleep(0.002)
            victim.suspend()
            decided = decided_batches(Path(str(victim.info["store_dir"])))
            # the master coordinated every batch so far: the reader must find their decisions
            assert set(range(in_flight)) <= decided, (in_flight, sorted(decided))
            if in_flight not in decided:
                for child in hold:
                    child.suspend()
                victim.kill()
                return in_flight
            log.warning("batch %d was decided before the master stopped; next one", in_flight)
            victim.resume()
    raise AssertionError("every batch tried was decided before the master could be stopped")


def start_query(
    spark: Any, options: dict[str, str], target: str, checkpoint: Path, **trigger: Any
) -> Any:
    """Stream the source into Parquet (`target` a directory) or into ferrymq (a topic)."""
    rows = (
        spark.readStream.format("ferrymq")
        .options(**options)
        .option("subscribe", SOURCE)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "300")
        .load()
    )
    if target == TARGET:
        writer = rows.selectExpr("value").writeStream.format("ferrymq").options(**options)
        writer = writer.option("topic", target)
    else:
        writer = rows.selectExpr("value", "partition", "offset").writeStream.format("parquet")
        writer = writer.option("path", target)
    return writer.option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()


def settle(query: Any, checkpoint: Path, end: Any, restart: Any) -> str:
    """Wait until the query committed `end`, or failed retryably and a restart finished it."""
    deadline = time.monotonic() + 150
    while committed_end(checkpoint) != end:
        if not query.isActive:
            error = query.exception()
            assert error is not None, "the query stopped without an error before the end"
            text = str(error)
            assert "RetryableQueryError" in text, text[-4000:]
            assert "this error is retryable" in text, text[-4000:]
            again = restart(availableNow=True)
            finished = again.awaitTermination(150)
            if not finished:
                again.stop()
            assert finished, "the restarted query did not finish"
            assert again.exception() is None, str(again.exception())[-4000:]
            assert committed_end(checkpoint) == end
            return RESTARTED
        assert time.monotonic() < deadline, f"the query never reached {end}"
        time.sleep(0.3)
    query.stop()
    return KEPT_GOING


@pytest.mark.timeout(420)
@pytest.mark.parametrize("failover_timeout_ms", [None, 200], ids=["ride-out", "give-up"])
def test_kill_the_master_under_a_streaming_read_and_write(
    spark: Any, tmp_path: Path, failover_timeout_ms: int | None
) -> None:
    """Default `failoverTimeoutMs`: either outcome. 200 ms, with the election held back until
    the writing query stopped: it must fail retryably and finish after a restart."""
    cluster = ProcessCluster(
        UpConfig(data_dir=tmp_path / "cluster", replicas=3, controllers=1, embedded_controller=True)
    )
    runner = asyncio.Runner()
    queries: list[Any] = []
    sent = Sent()
    try:
        runner.run(cluster.start())
        servers = cluster.namesrv_addr

        async def prepare() -> str:
            async with AdminClient(servers) as admin:
                await admin.create_topic(SOURCE, queues=4)
                await admin.create_topic(TARGET, queues=2)
                old = await wait_in_sync(admin, 3)
            async with Producer(servers, "failover-tests") as producer:
                for first in range(0, 900, 100):
                    await send(
                        producer, [f"a-{i:06d}".encode() for i in range(first, first + 100)], sent
                    )
            assert len(sent.acked) == 900
            return old

        old_master = runner.run(prepare())
        out, read_cp, write_cp = tmp_path / "out", tmp_path / "read-cp", tmp_path / "write-cp"

        options = {"servers": servers}
        if failover_timeout_ms is not None:
            options["failoverTimeoutMs"] = str(failover_timeout_ms)

        def read(**trigger: Any) -> Any:
            return start_query(spark, options, str(out), read_cp, **trigger)

        def write(**trigger: Any) -> Any:
            return start_query(spark, options, TARGET, write_cp, **trigger)

        queries += [
            read(processingTime="200 milliseconds"),
            write(processingTime="200 milliseconds"),
        ]

        async def fail_over() -> None:
            stop = asyncio.Event()

            async def keep_sending() -> None:
                async with Producer(servers, "failover-tests", send_timeout=2.0) as producer:
                    turn = 0
                    while not stop.is_set():
                        await send(
                            producer, [f"b-{turn:04d}-{i:02d}".encode() for i in range(10)], sent
                        )
                        turn += 1
                        await asyncio.sleep(0.1)

            sending = asyncio.create_task(keep_sending())
            deadline = time.monotonic() + 150
            while not all((cp / "commits" / "1").exists() for cp in (read_cp, write_cp)):
                assert all(q.isActive for q in queries), [str(q.exception()) for q in queries]
                assert time.monotonic() < deadline, "the queries committed no micro-batch"
                await asyncio.sleep(0.2)
            victim = next(c for c in cluster.brokers.values() if c.addr == old_master)
            # give-up: the replicas are stopped with the master, so no master can be elected
            # until the writing query has failed (a commit Spark starts late would otherwise meet
            # the new master and succeed); ride-out: the election runs at once
            replicas = [c for c in cluster.brokers.values() if c is not victim]
            held = [] if failover_timeout_ms is None else replicas
            in_flight = await kill_mid_batch(victim, write_cp, deadline, hold=held)
            assert batches(write_cp / "commits") == in_flight, "the batch ended before the kill"
            while held and queries[1].isActive:
                assert time.monotonic() < deadline, "the writer outlived a group with no master"
                await asyncio.sleep(0.1)
            for child in held:
                child.resume()
            async with AdminClient(servers) as admin:
                await master(admin, not_addr=old_master, timeout=60)
            acked_before = len(sent.acked)
            deadline = time.monotonic() + 30
            while len(sent.acked) < acked_before + 50:
                assert time.monotonic() < deadline, "no send acknowledged by the new master"
                await asyncio.sleep(0.1)
            stop.set()
            await sending

        runner.run(fail_over())

        async def final_end() -> Any:
            # the committed end of the source, once it stopped moving
            _, end = await topic_bodies(servers, SOURCE)
            deadline = time.monotonic() + 30
            while True:
                await asyncio.sleep(1.0)
                _, again = await topic_bodies(servers, SOURCE)
                if again == end:
                    return end
                assert time.monotonic() < deadline, "the source never stopped growing"
                end = again

        end = runner.run(final_end())
        outcomes = [
            settle(queries[0], read_cp, end, read),
            settle(queries[1], write_cp, end, write),
        ]
        log.warning("read into Parquet: %s; write into ferrymq: %s", *outcomes)
        assert set(outcomes) <= {KEPT_GOING, RESTARTED}
        if failover_timeout_ms is not None:
            assert outcomes[1] == RESTARTED

        source, _ = runner.run(topic_bodies(servers, SOURCE))
        target, _ = runner.run(topic_bodies(servers, TARGET))
        parquet = [r["value"] for r in spark.read.parquet(str(out)).select("value").collect()]

        assert len(set(source)) == len(source), "a source message is stored twice"
        lost = set(sent.acked) - set(source)
        assert not lost, f"{len(lost)} acknowledged messages are not in the source topic"
        assert set(source) <= set(sent.acked) | sent.unknown
        assert sorted(parquet) == sorted(source), "Parquet is not every source message once"
        assert sorted(target) == sorted(source), "the target is not every source row once"
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
        runner.run(cluster.stop())
        runner.close()
