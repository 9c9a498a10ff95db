"""POP consumption over remoting with the SDK's SimpleConsumer, against in-process brokers."""

import asyncio
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from ferrymq import Producer
from ferrymq.broker import popservice, send
from ferrymq.cli.stream import consume_command
from ferrymq.client.consumer import PullConsumer
from ferrymq.client.simple import ReceivedMessage, SimpleConsumer
from ferrymq.errors import RemoteError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster
from ferrymq.wire.broker import DeleteTopicRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.pop import AckMessageRequestHeader, NotificationRequestHeader

from .remoting import command, create_topic


async def _receive_until(
    consumer: SimpleConsumer, topic: str, count: int, *, invisible: float, timeout: float = 20.0
) -> list[ReceivedMessage]:
    """Receive until `count` messages came (or fail after `timeout` s)."""
    got: list[ReceivedMessage] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(got) < count:
        assert loop.time() < deadline, f"only {len(got)} of {count} messages within {timeout} s"
        got += await consumer.receive(
            topic, max_messages=count - len(got), invisible_duration=invisible, wait=0.5
        )
    return got


async def _send(cluster: LocalCluster, topic: str, n: int, queue_id: int | None = None) -> None:
    async with Producer(cluster.namesrv_addr) as producer:
        for i in range(n):
            queue = MessageQueue(topic, "broker-a", queue_id) if queue_id is not None else None
            await producer.send(topic, f"m{i}".encode(), queue=queue)


async def test_pop_ack_change_invisible_and_redelivery(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """Acked messages never come back; an unacked one comes back with attempt 2 after its
    invisible time; a changed one keeps away for its new time and its old handle is stale."""
    await create_topic(client, cluster.broker.address, "PopT", queues=2)
    await _send(cluster, "PopT", 6)
    async with SimpleConsumer(cluster.namesrv_addr, "G1") as consumer:
        first = await _receive_until(consumer, "PopT", 6, invisible=1.0)
        assert sorted(m.message.body for m in first) == [f"m{i}".encode() for i in range(6)]
        assert {m.delivery_attempt for m in first} == {1}
        acked, changed, left = first[:4], first[4], first[5]
        for received in acked:
            await consumer.ack(received)
        old_handle = changed.receipt_handle
        await consumer.change_invisible_duration(changed, 60.0)
        assert changed.receipt_handle != old_handle
        stale = ReceivedMessage(changed.message, old_handle, 1, "PopT")
        with pytest.raises(RemoteError) as refused:
            await consumer.ack(stale)
        assert refused.value.code == ResponseCode.NO_MESSAGE
        again = await _receive_until(consumer, "PopT", 1, invisible=30.0)
        assert [m.message.body for m in again] == [left.message.body]
        assert again[0].delivery_attempt == 2
        assert again[0].message.topic == "PopT"  # popped from the POP retry topic
        await consumer.ack(again[0])
        await consumer.ack(changed)  # the new handle is good
        assert await consumer.receive("PopT", invisible_duration=1.0, wait=1.5) == []


async def test_pop_state_survives_a_restart(cluster: LocalCluster, client: RpcClient) -> None:
    """An ack before a restart holds; a message in flight is acked after it by its old handle;
    one not acked comes back after its invisible time."""
    await create_topic(client, cluster.broker.address, "PopR", queues=1)
    await _send(cluster, "PopR", 3)
    async with SimpleConsumer(cluster.namesrv_addr, "G2") as consumer:
        got = await _receive_until(consumer, "PopR", 3, invisible=60.0)
        await consumer.ack(got[0])
        await consumer.change_invisible_duration(got[2], 0.3)
        await cluster.restart_broker(0)
        consumer.routes.invalidate("PopR")
        await consumer.ack(got[1])
        again = await _receive_until(consumer, "PopR", 1, invisible=30.0)
        assert [m.message.body for m in again] == [got[2].message.body]
        assert again[0].delivery_attempt == 2
        await consumer.ack(again[0])
        assert await consumer.receive("PopR", invisible_duration=1.0, wait=0.5) == []


async def test_fifo_pop_holds_a_queue_and_redelivers_in_order(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "PopF", queues=1)
    await _send(cluster, "PopF", 3, queue_id=0)
    async with (
        SimpleConsumer(cluster.namesrv_addr, "G3", fifo=True) as one,
        SimpleConsumer(cluster.namesrv_addr, "G3", fifo=True) as other,
    ):
        got = await _receive_until(one, "PopF", 3, invisible=0.5)
        assert [m.message.body for m in got] == [b"m0", b"m1", b"m2"]
        assert await other.receive("PopF", invisible_duration=0.5) == []  # the queue is held
        await one.ack(got[0])
        again = await _receive_until(other, "PopF", 2, invisible=30.0)
        assert [(m.message.body, m.delivery_attempt) for m in again] == [(b"m1", 2), (b"m2", 2)]
        for received in again:
            await other.ack(received)
        assert await one.receive("PopF", invisible_duration=1.0, wait=0.3) == []


@pytest.mark.parametrize("cluster", [{"max_reconsume_times": 1}], indirect=True)
async def test_past_max_reconsume_times_a_message_goes_to_the_dlq(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "PopD", queues=1)
    await _send(cluster, "PopD", 1)
    async with SimpleConsumer(cluster.namesrv_addr, "G4") as consumer:
        attempts = [
            m.delivery_attempt for m in await _receive_until(consumer, "PopD", 1, invisible=0.2)
        ]
        attempts += [
            m.delivery_attempt for m in await _receive_until(consumer, "PopD", 1, invisible=0.2)
        ]
        assert attempts == [1, 2]
        store = cluster.broker.store
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while store.max_queue_offset("%DLQ%G4", 0) < 1:
            assert loop.time() < deadline, "not dead-lettered"
            await asyncio.sleep(0.05)
        assert await consumer.receive("PopD", invisible_duration=1.0, wait=0.3) == []


async def test_pull_continues_where_pop_acked(cluster: LocalCluster, client: RpcClient) -> None:
    """Mixed group (served, as RocketMQ does): POP commits the group's offset below its lowest
    unacknowledged message; a pull consumer of the group reads on from there, and a pop after
    the pull consumer committed further starts at that commit."""
    await create_topic(client, cluster.broker.address, "PopM", queues=1)
    await _send(cluster, "PopM", 5)
    queue = MessageQueue("PopM", "broker-a", 0)
    async with (
        SimpleConsumer(cluster.namesrv_addr, "G5") as popper,
        PullConsumer(cluster.namesrv_addr, "G5") as puller,
    ):
        got = await _receive_until(popper, "PopM", 3, invisible=30.0)
        for received in got[:2]:
            await popper.ack(received)
        assert await puller.committed(queue) == 2  # offset 2 still in flight
        await popper.ack(got[2])
        assert await puller.committed(queue) == 3
        pulled = await puller.pull(queue, 3)
        assert [m.body for m in pulled.messages] == [b"m3", b"m4"]
        await puller.commit(queue, 5)
        await _send(cluster, "PopM", 1)
        last = await _receive_until(popper, "PopM", 1, invisible=30.0)
        assert [(m.message.body, m.message.queue_offset) for m in last] == [(b"m0", 5)]


async def test_a_bad_receipt_handle_is_refused(cluster: LocalCluster, client: RpcClient) -> None:
    header = AckMessageRequestHeader(
        consumer_group="G6", topic="PopB", queue_id=0, extra_info="garbage", offset=0
    )
    response = await client.call(
        cluster.broker.address, command(RequestCode.ACK_MESSAGE, header), 5
    )
    assert response.code == ResponseCode.SYSTEM_ERROR
    assert "8 fields" in (response.remark or "")


async def test_ferry_consume_pop_prints_and_acks(cluster: LocalCluster, client: RpcClient) -> None:
    await create_topic(client, cluster.broker.address, "PopC", queues=2)
    await _send(cluster, "PopC", 3)
    args = ["PopC", "--namesrv", cluster.namesrv_addr, "--group", "G7", "--pop", "--max", "3"]
    result = await asyncio.to_thread(
        CliRunner().invoke, consume_command, [*args, "--from", "earliest"]
    )
    assert result.exit_code == 0, result.output
    assert sorted(result.output.split()[:3]) == ["m0", "m1", "m2"]
    again = await asyncio.to_thread(
        CliRunner().invoke, consume_command, [*args, "--idle-exit", "0.5"]
    )
    assert again.exit_code == 0, again.output
    assert "consumed 0 message(s)" in again.output  # every one was acked


async def test_notification_answers_when_a_pop_would_find_a_message(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "PopN", queues=1)
    header = NotificationRequestHeader(
        consumer_group="G8", topic="PopN", queue_id=-1, poll_time=200, born_time=0
    )
    request = command(RequestCode.NOTIFICATION, header)
    empty = await client.call(cluster.broker.address, request, 5)
    assert (empty.code, empty.ext_fields["hasMsg"]) == (ResponseCode.SUCCESS, "false")
    header.poll_time = 10_000  # answered as soon as the message is there
    held = asyncio.ensure_future(
        client.call(cluster.broker.address, command(RequestCode.NOTIFICATION, header), 15)
    )
    await _send(cluster, "PopN", 1)
    assert (await held).ext_fields["hasMsg"] == "true"


async def test_a_topic_deleted_and_created_again_pops_from_its_start(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "PopX", queues=1)
    await _send(cluster, "PopX", 3)
    async with SimpleConsumer(cluster.namesrv_addr, "G9") as consumer:
        for received in await _receive_until(consumer, "PopX", 3, invisible=30.0):
            await consumer.ack(received)
        delete = command(RequestCode.DELETE_TOPIC_IN_BROKER, DeleteTopicRequestHeader(topic="PopX"))
        assert (await client.call(cluster.broker.address, delete, 5)).code == ResponseCode.SUCCESS
        await create_topic(client, cluster.broker.address, "PopX", queues=1)
        consumer.routes.invalidate("PopX")
        await _send(cluster, "PopX", 1)
        again = await _receive_until(consumer, "PopX", 1, invisible=30.0)
        assert [(m.message.body, m.message.queue_offset) for m in again] == [(b"m0", 0)]


async def test_a_pop_whose_retry_topic_name_would_be_invalid_is_refused(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "PopL", queues=1)
    group = "G" * 125  # %RETRY%<group>_PopL would be 137 characters, over 127
    async with SimpleConsumer(cluster.namesrv_addr, group) as consumer:
        with pytest.raises(RemoteError, match="not a valid topic name"):
            await consumer.receive("PopL", invisible_duration=30.0)


async def test_init_mode_max_starts_a_new_group_at_the_end(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await create_topic(client, cluster.broker.address, "PopI", queues=1)
    await _send(cluster, "PopI", 2)
    async with SimpleConsumer(cluster.namesrv_addr, "G10", from_first=False) as consumer:
        assert await consumer.receive("PopI", invisible_duration=30.0) == []
        await _send(cluster, "PopI", 1)  # the position taken at the first pop holds
        got = await _receive_until(consumer, "PopI", 1, invisible=30.0)
        assert [(m.message.body, m.message.queue_offset) for m in got] == [(b"m0", 2)]


async def test_an_ack_while_the_reviver_copies_is_not_delivered_again(
    cluster: LocalCluster, client: RpcClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A revive's copy is stored with awaits (a sync slave's ack): an ack meanwhile of the message
    being copied is refused (its copy comes), and one of a message later in the same pass holds
    (no copy). The injected fault: the first copy waits until the test acked both."""
    real_put = send.put_messages
    entered, release = asyncio.Event(), asyncio.Event()
    copying: list[bytes] = []

    async def slow_put(*args: Any, **kwargs: Any) -> Any:
        if not copying:
            copying.append(args[3][0].body)
            entered.set()
            await release.wait()
        return await real_put(*args, **kwargs)

    monkeypatch.setattr(popservice, "put_messages", slow_put)
    await create_topic(client, cluster.broker.address, "PopV", queues=1)
    await _send(cluster, "PopV", 2)
    async with SimpleConsumer(cluster.namesrv_addr, "G11") as consumer:
        got = await _receive_until(consumer, "PopV", 2, invisible=0.1)
        await asyncio.wait_for(entered.wait(), 20)
        first = next(m for m in got if m.message.body == copying[0])
        second = next(m for m in got if m.message.body != copying[0])
        with pytest.raises(RemoteError) as refused:
            await consumer.ack(first)  # being revived: its copy is on its way
        assert refused.value.code == ResponseCode.NO_MESSAGE
        await consumer.ack(second)  # expired, not revived yet: the ack holds
        release.set()
        again = await _receive_until(consumer, "PopV", 1, invisible=30.0)
        assert [(m.message.body, m.delivery_attempt) for m in again] == [(copying[0], 2)]
        await consumer.ack(again[0])
        assert await consumer.receive("PopV", invisible_duration=1.0, wait=1.0) == []


async def test_batch_ack_acks_and_refuses_a_huge_bit_set(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """BATCH_ACK_MESSAGE acks by bit set; one naming too many offsets is refused at once (a few
    MB of bit set used to hold the broker's loop for hours) and acks nothing."""
    await create_topic(client, cluster.broker.address, "PopBA", queues=1)
    await _send(cluster, "PopBA", 2)
    async with SimpleConsumer(cluster.namesrv_addr, "G12") as consumer:
        got = await _receive_until(consumer, "PopBA", 2, invisible=60.0)
        acks = [
            {"c": "G12", "t": "PopBA", "r": "0", "q": 0, "rq": 0, "it": 60_000}
            | {"so": m.handle.queue_offset, "pt": m.handle.pop_time_ms, "b": [0]}
            for m in got
        ]
        huge = msgspec.json.encode({"acks": [acks[0] | {"b": "/" * 12_000_000}]})
        both = msgspec.json.encode({"acks": acks})
        answer = await client.call(
            cluster.broker.address, command(RequestCode.BATCH_ACK_MESSAGE, body=huge), 10
        )
        assert answer.code == ResponseCode.SYSTEM_ERROR, answer.remark
        answer = await client.call(
            cluster.broker.address, command(RequestCode.BATCH_ACK_MESSAGE, body=both), 5
        )
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        assert cluster.broker.state.pop.in_flight_count(("G12", "PopBA", 0)) == 0


async def test_sdk_ack_batch_acks_two_queues_and_a_retry_and_skips_a_stale_handle(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """`SimpleConsumer.ack_batch` acks messages of 2 queues and of the POP retry topic in one
    BATCH_ACK_MESSAGE: none comes again after its invisible time while an unacked one does; a
    handle made stale by `change_invisible_duration` is skipped and its message comes again."""
    topic, state = "PopSB", cluster.broker.state
    retry_key = ("G15", "%RETRY%G15_PopSB", 0)
    await create_topic(client, cluster.broker.address, topic, queues=2)
    async with Producer(cluster.namesrv_addr) as producer:
        for i, body in enumerate((b"r", b"a", b"b", b"c", b"d")):
            await producer.send(topic, body, queue=MessageQueue(topic, "broker-a", i % 2))
    async with SimpleConsumer(cluster.namesrv_addr, "G15") as consumer:
        first = await _receive_until(consumer, topic, 5, invisible=60.0)
        r = next(m for m in first if m.message.body == b"r")
        await consumer.change_invisible_duration(r, 0.0)  # due now: revived to the retry topic
        [retried] = await _receive_until(consumer, topic, 1, invisible=2.0)
        assert (retried.message.body, retried.handle.retry, retried.delivery_attempt) == (
            b"r",
            True,
            2,
        )
        fresh = {m.message.body: m for m in first}
        for body in (b"a", b"b", b"c", b"d"):  # all due 2 s from now, as the retried one
            await consumer.change_invisible_duration(fresh[body], 2.0)
        c = fresh[b"c"]
        stale = ReceivedMessage(c.message, c.receipt_handle, 1, topic)
        await consumer.change_invisible_duration(c, 2.0)
        await consumer.ack_batch([retried, fresh[b"a"], fresh[b"b"], stale])  # d: not acked
        in_flight = [state.pop.in_flight_count(k) for k in [("G15", topic, 0), ("G15", topic, 1)]]
        assert (in_flight, state.pop.in_flight_count(retry_key)) == ([1, 1], 0)  # c, d
        again = await _receive_until(consumer, topic, 2, invisible=30.0)
        assert sorted((m.message.body, m.delivery_attempt) for m in again) == [(b"c", 2), (b"d", 2)]
        forged = ReceivedMessage(c.message, "0 1 1000 0 0 broker-a 0 70000", 1, topic)
        with pytest.raises(RemoteError) as refused:  # a bit set over the broker's bound
            await consumer.ack_batch([forged])
        assert refused.value.code == ResponseCode.SYSTEM_ERROR
        await consumer.ack_batch(again)
        assert await consumer.receive(topic, invisible_duration=1.0, wait=0.5) == []


async def test_an_idle_fifo_backlog_does_not_starve_revives(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """Over 1,024 expired orderly messages (a FIFO group whose consumer went away: they wait in
    place for its next pop) used to fill each revive pass's list, so an unordered message popped
    after them was never delivered again."""
    queues, per_queue = 36, 32
    await create_topic(client, cluster.broker.address, "PopFB", queues=queues)
    await create_topic(client, cluster.broker.address, "PopUB", queues=1)
    async with Producer(cluster.namesrv_addr) as producer:
        for queue_id in range(queues):
            bodies = [f"f{queue_id}-{i}".encode() for i in range(per_queue)]
            queue = MessageQueue("PopFB", "broker-a", queue_id)
            await producer.send_batch("PopFB", bodies, queue=queue)
        await producer.send("PopUB", b"u")
    async with (
        SimpleConsumer(cluster.namesrv_addr, "G13", fifo=True) as fifo,
        SimpleConsumer(cluster.namesrv_addr, "G14") as plain,
    ):
        for _ in range(queues):  # one queue per pop; each stays held for 3 s
            await fifo.receive("PopFB", max_messages=per_queue, invisible_duration=3.0)
        state, loop = cluster.broker.state, asyncio.get_running_loop()
        held = sum(state.pop.in_flight_count(("G13", "PopFB", q)) for q in range(queues))
        assert held > 1024, held
        [message] = await _receive_until(plain, "PopUB", 1, invisible=60.0)
        deadline = loop.time() + 20
        while (expired := sum(1 for _ in state.pop.expired(state.wall_ms()))) < held:
            assert loop.time() < deadline, f"only {expired} of {held} expired"
            await asyncio.sleep(0.1)
        await plain.change_invisible_duration(message, 0.0)  # due now, behind the FIFO backlog
        again = await _receive_until(plain, "PopUB", 1, invisible=30.0, timeout=10.0)
        assert [(m.message.body, m.delivery_attempt) for m in again] == [(b"u", 2)]


@pytest.mark.parametrize("cluster", [{"max_message_size": 2048}], indirect=True)
async def test_pop_events_of_one_turn_larger_than_a_record_are_logged(
    cluster: LocalCluster, client: RpcClient
) -> None:
    """One loop turn's POP events go to the metadata log in records a message may be: 40 acks
    in one batch (over 2 KB of events) used to make one record the store refused, again every
    second, so that ack and every later one answered 'not replicated' and the events piled up."""
    await create_topic(client, cluster.broker.address, "PopM", queues=1)
    async with Producer(cluster.namesrv_addr) as producer:
        await producer.send_batch("PopM", [b"m"] * 41, queue=MessageQueue("PopM", "broker-a", 0))
    async with SimpleConsumer(cluster.namesrv_addr, "G15") as consumer:
        got = await _receive_until(consumer, "PopM", 41, invisible=60.0)
        last, got = got[-1], got[:-1]
        acks = [
            {"c": "G15", "t": "PopM", "r": "0", "q": 0, "rq": 0, "it": 60_000}
            | {"so": m.handle.queue_offset, "pt": m.handle.pop_time_ms, "b": [0]}
            for m in got
        ]
        batch = msgspec.json.encode({"acks": acks})
        answer = await client.call(
            cluster.broker.address, command(RequestCode.BATCH_ACK_MESSAGE, body=batch), 5
        )
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        await consumer.ack(last)  # and the log goes on
        assert cluster.broker.state.pop.in_flight_count(("G15", "PopM", 0)) == 0
