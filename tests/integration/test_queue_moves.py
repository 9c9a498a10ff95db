"""Moving a queue between broker groups (issue 20 section 4), in process: one controller node,
a NameServer and two single-replica broker groups in controller mode (the fixture of
test_controller_topics.py).

While a producer sends to every logical queue in turn (each message naming its queue and
sequence number) and an orderly push consumer reads them, queue 1 of broker-a moves to
broker-b: the consumer gets every message once, each queue in order; a pull consumer reads
each logical queue from offset 0 with contiguous offsets across the move (and so does the
Spark source's read path, `spark.fetch`); the old physical
queue is sealed (a send to it is refused) and the new one starts where it ended.
`ferry admin topic reassign` and `broker drain` print their progress (and JSON) and refuse bad
input with one line. The same with real processes, kill -9 included, is
tests/system/test_queue_moves.py.
"""

import asyncio
import functools
import json
import sys
import time
from collections import defaultdict

import pytest

from ferrymq.broker.forward import ASIDE_TOPIC, FORWARD_PATIENCE_S, deliver_elsewhere
from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message, SendResult
from ferrymq.client.producer import Producer
from ferrymq.client.push import ConsumeFrom, PushConsumer
from ferrymq.client.sink import SinkClient
from ferrymq.errors import RemoteError, RequestError, SendFailedError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.spark.fetch import queue_bounds, read_range
from ferrymq.spark.plan import QueueKey, QueueRange
from ferrymq.wire import properties as props
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.queuemap import QueueSegment
from ferrymq.wire.records import BatchItem, decode_record
from ferrymq.wire.topics import ControllerReassignRequestHeader, SealQueueRequestHeader

from .remoting import pull, send
from .test_controller_topics import _Cluster, _until, cluster  # noqa: F401 - the fixture

TOPIC = "Moves"
PER_QUEUE = 120


async def _move(admin: AdminClient, broker: str, queue_id: int, to: str) -> int:
    """Start a move and wait until it is done; the offset the old segment ended at."""
    body = await admin.reassign(
        ControllerReassignRequestHeader(
            action="move", topic=TOPIC, broker_name=broker, queue_id=queue_id, to_broker_name=to
        )
    )
    (move,) = body.moves
    deadline = time.monotonic() + 30
    while True:
        (progress,) = await admin.move_progress([move])
        if progress.state == "done":
            assert progress.end_offset is not None
            return progress.end_offset
        assert progress.state == "moving", progress
        assert time.monotonic() < deadline, "the move did not finish within 30 s"
        await asyncio.sleep(0.05)


async def _send(producer: Producer, body: bytes, queue: MessageQueue) -> SendResult:
    """Send to one queue, again after a send that surely failed (nothing stored: no duplicate)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await producer.send(TOPIC, body, queue=queue)
        except SendFailedError:
            assert time.monotonic() < deadline, "no send accepted within 30 s"
            await asyncio.sleep(0.05)


async def test_a_queue_moves_under_load_without_loss_duplicates_or_reordering(
    cluster: _Cluster,  # noqa: F811 - the fixture
) -> None:
    async with AdminClient(cluster.namesrv.address) as admin:
        await admin.create_topic(TOPIC, 2)
        names = [MessageQueue(TOPIC, g, q) for g in ("broker-a", "broker-b") for q in (0, 1)]
        got: dict[tuple[str, int], list[int]] = defaultdict(list)

        async def listener(message: Message) -> None:
            broker, queue_id, seq = message.body.decode().split(":")
            got[broker, int(queue_id)].append(int(seq))

        consumer = PushConsumer(
            cluster.namesrv.address,
            "movers",
            listener,
            orderly=True,
            consume_from=ConsumeFrom.FIRST_OFFSET,
            pull_wait=0.5,
            rebalance_interval=1.0,
            commit_interval=0.5,
        )
        consumer.subscribe(TOPIC)
        await consumer.start()
        sent = asyncio.Event()
        try:
            async with Producer(cluster.namesrv.address, send_timeout=5.0) as producer:

                async def produce() -> None:
                    for seq in range(PER_QUEUE):
                        for name in names:
                            body = f"{name.broker_name}:{name.queue_id}:{seq}".encode()
                            result = await _send(producer, body, name)
                            assert result.queue == name
                            assert result.queue_offset == seq  # offsets grow across the move
                        if seq == PER_QUEUE // 3:
                            sent.set()

                load = asyncio.create_task(produce())
                await sent.wait()
                end = await _move(admin, "broker-a", 1, "broker-b")
                await load
            assert PER_QUEUE // 3 < end < PER_QUEUE
            await _until(
                lambda: sum(map(len, got.values())) >= len(names) * PER_QUEUE,
                "the consumer got every message",
                60,
            )
        finally:
            await consumer.close()
        # every message once, each queue in the order sent
        assert dict(got) == {(n.broker_name, n.queue_id): list(range(PER_QUEUE)) for n in names}

        queue = cluster.controller.node.state.topics[TOPIC].queue_map.logical("broker-a", 1)
        assert queue is not None
        assert queue.segments == (
            QueueSegment("broker-a", 1, 0, end),
            QueueSegment("broker-b", 2, end),  # above broker-b's own queues 0 and 1
        )
        placement = await admin.topic_placement(TOPIC)
        assert placement is not None
        # each group holds and routes its physical queues: broker-b its 2 and the moved one
        assert [(g.broker_name, g.desired, g.state) for g in placement.groups] == [
            ("broker-a", 2, "ok"),
            ("broker-b", 3, "ok"),
        ]
        a, b = cluster.brokers["broker-a"], cluster.brokers["broker-b"]
        assert a.state.store.max_queue_offset(TOPIC, 1) == end
        assert b.state.store.min_queue_offset(TOPIC, 2) == end
        assert b.state.store.max_queue_offset(TOPIC, 2) == PER_QUEUE

    # the logical queue reads from 0 with contiguous offsets, across both segments
    async with PullConsumer(cluster.namesrv.address, "readers") as reader:
        assert sorted(await reader.queues(TOPIC)) == sorted(names)
        moved = MessageQueue(TOPIC, "broker-a", 1)
        assert await reader.min_offset(moved) == 0
        assert await reader.max_offset(moved) == PER_QUEUE
        messages = await reader.fetch_range(moved, 0, PER_QUEUE)
        assert [m.queue_offset for m in messages] == list(range(PER_QUEUE))
        assert [int(m.body.decode().split(":")[2]) for m in messages] == list(range(PER_QUEUE))
        assert {m.broker_name for m in messages[end:]} == {"broker-b"}
        await reader.commit(moved, PER_QUEUE)  # goes to the new segment
        assert await reader.committed(moved) == PER_QUEUE
        # the Spark source's read path: its bounds and one task's range, across the move
        bounds = await queue_bounds(reader, {TOPIC: [moved]})
        assert bounds[TOPIC][QueueKey("broker-a", 1)] == (0, PER_QUEUE)
        offsets: list[int] = []
        task = QueueRange(TOPIC, 1, "broker-a", 1, 0, PER_QUEUE)
        async for records in read_range(
            reader, task, fail_on_data_loss=True, max_bytes=1 << 20, failover_timeout=10.0
        ):
            offsets += [records.queue_offset(i) for i in range(len(records))]
        assert offsets == list(range(PER_QUEUE))

    # the old physical queue is sealed: a send straight to it is refused
    rpc = RpcClient()
    try:
        response = await send(rpc, a.address, TOPIC, b"late", queue_id=1)
        assert response.code == ResponseCode.NO_PERMISSION
        assert "sealed" in (response.remark or "")
    finally:
        await rpc.close()


async def test_bad_reassign_requests_are_refused_with_a_reason(
    cluster: _Cluster,  # noqa: F811 - the fixture
) -> None:
    async with AdminClient(cluster.namesrv.address) as admin:
        await admin.create_topic(TOPIC, 2)

        async def refused(**fields: object) -> str:
            header = ControllerReassignRequestHeader(**fields)  # type: ignore[arg-type]
            with pytest.raises(RemoteError) as caught:
                await admin.reassign(header)
            return caught.value.remark or ""

        move = {"action": "move", "topic": TOPIC, "broker_name": "broker-a", "queue_id": 1}
        assert "does not exist" in await refused(
            **{**move, "topic": "Nope"}, to_broker_name="broker-b"
        )
        assert "no queue 7" in await refused(**{**move, "queue_id": 7}, to_broker_name="broker-b")
        assert "not known" in await refused(**move, to_broker_name="broker-z")
        # a move while the source has no master stays on; a second one elsewhere is refused,
        # and so is deleting the topic meanwhile
        await cluster.stop("broker-a")
        await admin.reassign(ControllerReassignRequestHeader(**move, to_broker_name="broker-b"))  # type: ignore[arg-type]
        state = cluster.controller.node.state
        queue = state.topics[TOPIC].queue_map.logical("broker-a", 1)
        assert queue is not None
        assert queue.moving is not None
        assert "moving to broker-b already" in await refused(**move, to_broker_name="broker-a")
        with pytest.raises(RemoteError, match="wait for the move to finish"):
            await admin.delete_topic(TOPIC)
        # the source comes back: the leader's driver seals it and finishes the move
        await cluster.start("broker-a")
        await _until(
            lambda: (
                (q := state.topics[TOPIC].queue_map.logical("broker-a", 1)) is not None
                and q.moving is None
            ),
            "the move finished once broker-a had a master again",
            30,
        )


async def _ferry(made: _Cluster, *args: str) -> tuple[int, str, str]:
    """`ferry admin ...` as its own process against the in-process cluster."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ferrymq.cmd.ferry",
        "admin",
        "--namesrv",
        made.namesrv.address,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_cli_reassigns_drains_and_says_why_it_refuses(
    cluster: _Cluster,  # noqa: F811 - the fixture
) -> None:
    async with AdminClient(cluster.namesrv.address) as admin:
        await admin.create_topic(TOPIC, 2)
    code, out, err = await _ferry(
        cluster, "topic", "reassign", TOPIC, "--queue", "0", "--to", "broker-b", "--json"
    )
    assert code == 0, err
    (move,) = json.loads(out)["moves"]
    assert (move["fromBrokerName"], move["toBrokerName"], move["toQueueId"], move["state"]) == (
        "broker-a",
        "broker-b",
        2,
        "done",
    )
    code, out, err = await _ferry(cluster, "broker", "drain", "broker-a")
    assert code == 0, err
    assert out.splitlines() == [
        "moving Moves queue 1 of broker-a: broker-a/1 -> broker-b/3",
        "moved  Moves queue 1 of broker-a: broker-a/1 -> broker-b/3 at offset 0",
    ]
    for args, reason in (
        (("topic", "reassign", "Nope", "--queue", "0", "--to", "broker-b"), "does not exist"),
        (("broker", "drain", "broker-z"), "broker group broker-z is not known"),
    ):
        code, out, err = await _ferry(cluster, *args)
        assert code != 0
        assert len(err.strip().splitlines()) == 1, err
        assert reason in err


async def test_prepared_sink_rows_hold_the_seal_until_their_batch_commits(
    cluster: _Cluster,  # noqa: F811 - the fixture
) -> None:
    """An exactly-once sink's rows prepared for a queue land below the move's end offset."""
    async with (
        AdminClient(cluster.namesrv.address) as admin,
        SinkClient(cluster.namesrv.address) as sink,
    ):
        await admin.create_topic(TOPIC, 2)
        queue = MessageQueue(TOPIC, "broker-a", 1)
        rows = [BatchItem.of(f"row-{i}".encode(), {props.UNIQ_KEY: f"row-{i}"}) for i in range(3)]
        await sink.prepare(queue, "s1", 0, "t1", rows)
        body = await admin.reassign(
            ControllerReassignRequestHeader(
                action="move",
                topic=TOPIC,
                broker_name="broker-a",
                queue_id=1,
                to_broker_name="broker-b",
            )
        )
        # broker-a refuses the seal while the batch holds its rows (asked here as the leader does)
        seal = RemotingCommand(
            code=RequestCode.SEAL_QUEUE,
            ext_fields=to_ext_fields(
                SealQueueRequestHeader(topic=TOPIC, queue_id=1, topic_version=body.topic_version)
            ),
        )
        address = cluster.brokers["broker-a"].address
        deadline = time.monotonic() + 30
        async with RpcClient() as rpc:
            while "sink batch holds prepared rows" not in (
                (answer := await rpc.call(address, seal, 5)).remark or ""
            ):
                assert answer.code == ResponseCode.SYSTEM_BUSY, answer.remark  # not synced yet
                assert time.monotonic() < deadline, f"no refusal within 30 s: {answer.remark}"
                await asyncio.sleep(0.05)
        assert answer.code == ResponseCode.SYSTEM_BUSY
        (progress,) = await admin.move_progress(body.moves)
        assert progress.state == "moving"
        # a sealed queue takes no new prepared rows (and a sink's queues now leave it out)
        async with SinkClient(cluster.namesrv.address, retry_for=0.5) as impatient:
            with pytest.raises(RemoteError, match="sealed"):
                await impatient.prepare(queue, "s2", 0, "t1", rows)
            await impatient.routes.get(TOPIC, refresh=True)
            assert queue not in await impatient.queues(TOPIC)
        coordinator = await sink.coordinator(TOPIC)
        assert await sink.decide(coordinator, "s1", 0, {"t1": {"broker-a": 3}})
        assert await sink.commit("broker-a", "s1", 0, {"t1": 3}) == (3, False)
        deadline = time.monotonic() + 30
        while (progress := (await admin.move_progress(body.moves))[0]).state == "moving":
            assert time.monotonic() < deadline, "the move did not finish after the commit"
            await asyncio.sleep(0.05)
        assert (progress.state, progress.end_offset) == ("done", 3)
        while MessageQueue(TOPIC, "broker-b", 2) not in await sink.queues(TOPIC):
            assert time.monotonic() < deadline, "a sink does not write to the new queue"
            await asyncio.sleep(0.05)
            await sink.routes.get(TOPIC, refresh=True)


async def test_a_delayed_message_for_a_queue_sealed_meanwhile_lands_in_an_open_one(
    cluster: _Cluster,  # noqa: F811 - the fixture
) -> None:
    async with AdminClient(cluster.namesrv.address) as admin:
        await admin.create_topic(TOPIC, 2)
        async with Producer(cluster.namesrv.address) as producer:
            moved = MessageQueue(TOPIC, "broker-a", 1)
            await _send(producer, b"now", moved)
            await producer.send(TOPIC, b"later", queue=moved, delay_level=1)  # due in 1 s
        end = await _move(admin, "broker-a", 1, "broker-b")
        assert end == 1
        store = cluster.brokers["broker-a"].state.store
        await _until(lambda: store.max_queue_offset(TOPIC, 0) == 1, "the delivery", 15)
        assert store.max_queue_offset(TOPIC, 1) == end  # nothing past the sealed queue's end
    async with PullConsumer(cluster.namesrv.address, "readers") as reader:
        (message,) = await reader.fetch_range(MessageQueue(TOPIC, "broker-a", 0), 0, 1)
        assert message.body == b"later"


async def test_a_delayed_message_due_after_its_group_was_drained_goes_to_the_new_segment(
    cluster: _Cluster,  # noqa: F811 - the fixture
) -> None:
    """No open queue of the topic is left on broker-a: the delivery is forwarded to broker-b."""
    async with AdminClient(cluster.namesrv.address) as admin:
        await admin.create_topic(TOPIC, 2)
        async with Producer(cluster.namesrv.address) as producer:
            moved = MessageQueue(TOPIC, "broker-a", 1)
            await producer.send(TOPIC, b"later", queue=moved, delay_level=2)  # due in 5 s
        body = await admin.reassign(
            ControllerReassignRequestHeader(
                action="drain", topic=TOPIC, broker_name="broker-a", to_broker_name="broker-b"
            )
        )
        deadline = time.monotonic() + 30
        while any(p.state != "done" for p in await admin.move_progress(body.moves)):
            assert time.monotonic() < deadline, "the drain did not finish within 30 s"
            await asyncio.sleep(0.05)
        schedule = cluster.brokers["broker-a"].schedule
        assert schedule is not None
        assert schedule.delivered == 0, "delivered before the drain ended: nothing to show"
        store = cluster.brokers["broker-b"].state.store
        await _until(lambda: store.max_queue_offset(TOPIC, 3) == 1, "the forwarded delivery", 30)
        # one that cannot be forwarded is retried, then set aside once it failed long enough
        state = cluster.brokers["broker-a"].state
        item = BatchItem.of(b"nowhere", {})
        deliver = functools.partial(
            deliver_elsewhere, state, None, TOPIC, 1, item, born_host=bytes(8), born_timestamp_ms=1
        )
        with pytest.raises(RequestError, match="no forwarder"):
            await deliver(failing_since=state.clock())
        assert state.store.max_queue_offset(ASIDE_TOPIC, 0) == 0
        await deliver(failing_since=state.clock() - FORWARD_PATIENCE_S)
        (aside,) = state.store.get(ASIDE_TOPIC, 0, 0, 1).records
        assert decode_record(aside).properties[props.REAL_TOPIC] == TOPIC
    async with PullConsumer(cluster.namesrv.address, "readers") as reader:
        (message,) = await reader.fetch_range(moved, 0, 1)
        assert message.body == b"later"
        assert message.queue_offset == 0


async def test_a_closed_segments_end_long_polls_a_client_that_does_not_follow_segments(
    cluster: _Cluster,  # noqa: F811 - the fixture
) -> None:
    """The official push consumer pulls again at once on no new message: it must be held."""
    async with AdminClient(cluster.namesrv.address) as admin:
        await admin.create_topic(TOPIC, 2)
        async with Producer(cluster.namesrv.address) as producer:
            await _send(producer, b"before", MessageQueue(TOPIC, "broker-a", 1))
        assert await _move(admin, "broker-a", 1, "broker-b") == 1
    async with RpcClient() as rpc:
        address = cluster.brokers["broker-a"].address
        started = time.monotonic()
        response, records = await pull(rpc, address, TOPIC, 1, 1, suspend_ms=1000)
        held = time.monotonic() - started
    assert (response.code, records) == (ResponseCode.PULL_NOT_FOUND, [])
    assert response.ext_fields["ferrySealed"] == "true"
    assert held >= 0.9, f"answered after {held:.3f} s: not long-polled"


async def test_a_commit_back_in_an_older_segment_is_the_groups_offset(
    cluster: _Cluster,  # noqa: F811 - the fixture
) -> None:
    """A reset to an offset of the old segment is not hidden by a commit on the new one."""
    moved = MessageQueue(TOPIC, "broker-a", 1)
    async with AdminClient(cluster.namesrv.address) as admin:
        await admin.create_topic(TOPIC, 2)
        async with Producer(cluster.namesrv.address) as producer:
            await _send(producer, b"old", moved)
            assert await _move(admin, "broker-a", 1, "broker-b") == 1
            await producer.routes.get(TOPIC, refresh=True)
            await _send(producer, b"new", moved)
    async with PullConsumer(cluster.namesrv.address, "resetters") as reader:
        await reader.routes.get(TOPIC, refresh=True)
        await reader.commit(moved, 2)  # on broker-b's segment
        assert await reader.committed(moved) == 2
        await reader.commit(moved, 0)  # back on broker-a's
        assert await reader.committed(moved) == 0
        await reader.commit(moved, 1)  # read on: the old segment's end
        assert await reader.committed(moved) == 1
