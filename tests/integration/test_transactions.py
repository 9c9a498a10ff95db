"""The transactional producer on a real broker: decisions, back-checks, a restarted producer."""

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from ferrymq.client.consumer import PullConsumer
from ferrymq.client.message import Message
from ferrymq.client.transaction import TransactionProducer, TransactionState
from ferrymq.errors import TopicNotFoundError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster

from .remoting import create_topic

FAST_CHECKS = {"transaction_timeout": 100, "transaction_check_interval": 150}

pytestmark = pytest.mark.parametrize("cluster", [FAST_CHECKS], indirect=True)


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def visible(cluster: LocalCluster, topic: str) -> list[bytes]:
    async with PullConsumer(cluster.namesrv_addr, "Reader") as consumer:
        queue = MessageQueue(topic, cluster.broker.config.broker_name, 0)
        return [m.body for m in await consumer.fetch_range(queue, 0, 100)]


async def setup_topic(cluster: LocalCluster, client: RpcClient) -> None:
    await create_topic(client, cluster.broker.address, "Tx", 1)
    await cluster.broker.register()


async def check_pass_later(cluster: LocalCluster) -> int:
    """Run one back-check pass as if a minute had passed; returns the checks it sent."""
    state = cluster.broker.state
    transactions = cluster.broker.transactions
    assert transactions is not None
    wall_ms = state.wall_ms
    state.wall_ms = lambda: wall_ms() + 60_000
    try:
        return await transactions.check_once()
    finally:
        state.wall_ms = wall_ms


def decide_by_body(checked: list[bytes]) -> Callable[[Message], Awaitable[TransactionState]]:
    async def check(message: Message) -> TransactionState:
        checked.append(message.body)
        assert message.topic == "Tx"
        assert message.transaction_id == message.msg_id
        if message.body.startswith(b"commit"):
            return TransactionState.COMMIT
        if message.body.startswith(b"rollback"):
            return TransactionState.ROLLBACK
        return TransactionState.UNKNOWN

    return check


def decide(state: TransactionState) -> Callable[[Message], Awaitable[TransactionState]]:
    async def execute(message: Message) -> TransactionState:
        return state

    return execute


async def test_commit_is_visible_and_rollback_never_is(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await setup_topic(cluster, client)
    checked: list[bytes] = []
    async with TransactionProducer(
        cluster.namesrv_addr, "TXG", decide_by_body(checked)
    ) as producer:
        committed = await producer.send_in_transaction(
            "Tx", b"yes", decide(TransactionState.COMMIT), keys="k1"
        )
        rolled_back = await producer.send_in_transaction(
            "Tx", b"no", decide(TransactionState.ROLLBACK)
        )
        assert (committed.state, committed.end_sent) == (TransactionState.COMMIT, True)
        assert (rolled_back.state, rolled_back.end_sent) == (TransactionState.ROLLBACK, True)
        assert await visible(cluster, "Tx") == [b"yes"]
        # a check pass long after the transaction timeout finds nothing to ask about
        assert await check_pass_later(cluster) == 0
        assert await visible(cluster, "Tx") == [b"yes"]
        assert checked == []
        with pytest.raises(TopicNotFoundError):
            await producer.send_in_transaction("Nope", b"x", decide(TransactionState.COMMIT))


async def test_unknown_outcomes_are_resolved_by_the_check_listener(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await setup_topic(cluster, client)
    checked: list[bytes] = []

    async def fails(message: Message) -> TransactionState:
        raise RuntimeError("the local database went away")

    async with TransactionProducer(
        cluster.namesrv_addr, "TXG", decide_by_body(checked)
    ) as producer:
        first = await producer.send_in_transaction(
            "Tx", b"commit-1", decide(TransactionState.UNKNOWN)
        )
        await producer.send_in_transaction("Tx", b"rollback-1", decide(TransactionState.UNKNOWN))
        raised = await producer.send_in_transaction("Tx", b"commit-2", fails)
        assert (first.state, first.end_sent) == (TransactionState.UNKNOWN, False)
        assert raised.state is TransactionState.UNKNOWN
        assert await visible(cluster, "Tx") == []

        async def resolved() -> bool:
            return producer.checks_answered >= 3

        await wait_until(resolved)

        async def committed() -> bool:
            return sorted(await visible(cluster, "Tx")) == [b"commit-1", b"commit-2"]

        await wait_until(committed)
        assert sorted(set(checked)) == [b"commit-1", b"commit-2", b"rollback-1"]
        assert await check_pass_later(cluster) == 0  # every decision stuck
        assert sorted(await visible(cluster, "Tx")) == [b"commit-1", b"commit-2"]


async def test_a_restarted_producer_answers_checks_for_its_group(
    cluster: LocalCluster, client: RpcClient
) -> None:
    await setup_topic(cluster, client)

    async def never_asked(message: Message) -> TransactionState:
        raise AssertionError("the first producer is gone")

    async with TransactionProducer(cluster.namesrv_addr, "TXG", never_asked) as first:
        await first.send_in_transaction(
            "Tx", b"commit-after-restart", decide(TransactionState.UNKNOWN)
        )
        await first.send_in_transaction(
            "Tx", b"rollback-after-restart", decide(TransactionState.UNKNOWN)
        )
    assert await visible(cluster, "Tx") == []

    checked: list[bytes] = []
    async with TransactionProducer(cluster.namesrv_addr, "TXG", decide_by_body(checked)) as second:

        async def committed() -> bool:
            return await visible(cluster, "Tx") == [b"commit-after-restart"]

        await wait_until(committed)

        async def both_answered() -> bool:
            return second.checks_answered >= 2

        await wait_until(both_answered)
    assert sorted(set(checked)) == [b"commit-after-restart", b"rollback-after-restart"]
