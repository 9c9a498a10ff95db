"""Long polling: a pull that found nothing waits until its queue grows or time runs out.

RocketMQ's `PullRequestHoldService`, woken by the store's dispatch instead of a 5 s scan.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from ferrymq.rpc.deadline import wait_future

__all__ = ["LongPoll"]

_MAX_WAITERS: Final = 100_000
"""Held pulls across all queues; past this a pull returns at once (clients poll again)."""


class LongPoll:
    """Waiting pulls keyed by (topic, queue id)."""

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], list[tuple[int, asyncio.Future[None]]]] = {}
        self._count = 0

    async def wait(self, topic: str, queue_id: int, queue_offset: int, timeout: float) -> bool:
        """Wait until the queue holds an entry at `queue_offset` or `timeout` passes.

        Returns whether the queue grew (False on timeout, or when too many pulls wait).
        """
        if self._count >= _MAX_WAITERS or timeout <= 0:
            return False
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = (topic, queue_id)
        entry = (queue_offset, future)
        self._waiters.setdefault(key, []).append(entry)
        self._count += 1
        try:
            await wait_future(future, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove(entry)
                    self._count -= 1
                if not waiters:
                    del self._waiters[key]

    def notify(self, topic: str, queue_id: int, max_queue_offset: int) -> None:
        """The queue now ends at `max_queue_offset`: wake the pulls waiting below it."""
        for queue_offset, future in self._waiters.get((topic, queue_id), ()):
            if queue_offset < max_queue_offset and not future.done():
                future.set_result(None)

    def wake_all(self) -> None:
        """Wake every waiting pull (shutdown)."""
        for waiters in self._waiters.values():
            for _, future in waiters:
                if not future.done():
                    future.set_result(None)
