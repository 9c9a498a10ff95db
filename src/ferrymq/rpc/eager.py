"""Eager start of request handlers: run a coroutine now, make a task only if it waits.

Most broker requests finish without waiting (an ASYNC_FLUSH send, an offset query), and a task
per request costs more than the handler itself. Python 3.12's `asyncio.eager_task_factory` does
this for a whole loop; ferrymq supports 3.11, so this is the same idea for one call site, written
by hand: step the coroutine once; if it returned, there is nothing to schedule; if it yielded a
future, a task takes over from exactly that point.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["start_eagerly"]


class _Waiting:
    """Hands the future a coroutine yielded outside any task to the task that resumes it."""

    __slots__ = ("yielded",)

    def __init__(self, yielded: object) -> None:
        self.yielded = yielded

    def __await__(self) -> Generator[Any, None, None]:
        yield self.yielded  # the future (still flagged as blocking) or None for a bare yield


async def _resume(coro: Coroutine[Any, None, None], yielded: object) -> None:
    while True:
        try:
            await _Waiting(yielded)
        except BaseException as exc:  # noqa: BLE001 - cancellation is thrown in to pass on
            try:
                yielded = coro.throw(exc)
            except StopIteration:
                return
            continue
        try:
            yielded = coro.send(None)
        except StopIteration:
            return


def start_eagerly(coro: Coroutine[Any, None, None]) -> asyncio.Task[None] | None:
    """Run `coro` until it first waits; None if it finished, else the task running the rest.

    An exception the coroutine raises before waiting propagates to the caller.
    """
    try:
        yielded = coro.send(None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_resume(coro, yielded))
