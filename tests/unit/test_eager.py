"""rpc.eager: handlers run at once; only one that waits becomes a task, with the same semantics."""

import asyncio

import pytest

from ferrymq.rpc.eager import start_eagerly


async def test_a_coroutine_that_never_waits_runs_to_the_end_with_no_task() -> None:
    done: list[int] = []

    async def quick() -> None:
        done.append(1)

    assert start_eagerly(quick()) is None
    assert done == [1]


async def test_a_coroutine_that_waits_continues_in_a_task_from_where_it_stopped() -> None:
    steps: list[str] = []
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def slow() -> None:
        steps.append("before")
        steps.append(await gate)
        await asyncio.sleep(0)  # a bare yield
        await asyncio.sleep(0.01)
        steps.append("after")

    task = start_eagerly(slow())
    assert task is not None
    assert steps == ["before"]
    gate.set_result("woken")
    await task
    assert steps == ["before", "woken", "after"]


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    cleaned: list[str] = []

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("finally ran")

    task = start_eagerly(waits_forever())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["finally ran"]


async def test_errors_reach_whoever_owns_the_work() -> None:
    async def fails_at_once() -> None:
        raise ValueError("now")

    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise ValueError("later")

    with pytest.raises(ValueError, match="now"):
        start_eagerly(fails_at_once())
    task = start_eagerly(fails_later())
    assert task is not None
    with pytest.raises(ValueError, match="later"):
        await task


async def test_a_waiting_coroutine_can_catch_the_cancellation_and_finish() -> None:
    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # cleanup that itself waits

    task = start_eagerly(stubborn())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    await task
    assert task.done()
    assert not task.cancelled()
