"""Waiting on a future with a time limit, from inside or outside a task.

`asyncio.timeout` needs a current task; request handlers start eagerly, outside any task
(`rpc.eager`), so they bound their waits with this instead: a timer that fails the caller's
own future. It also costs less than a timeout context (no task cancellation and uncancel).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

__all__ = ["wait_future"]

T = TypeVar("T")


def _expire(future: asyncio.Future[T]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


async def wait_future(future: asyncio.Future[T], timeout: float) -> T:
    """Await `future`, a future the caller owns, for at most `timeout` seconds.

    Raises:
        TimeoutError: it was not done in time; the future itself now holds that error.
    """
    handle = future.get_loop().call_later(timeout, _expire, future)
    try:
        return await future
    finally:
        handle.cancel()
