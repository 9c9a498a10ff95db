"""The endpoint's bounded tables of cluster clients (transaction relays, consumers, pullers).

Owns when such a client is opened and closed: opened on first use of its key, closed when no call
has used it for `idle_s` (unless `pinned` says a connected client still needs it) or, past `cap`
entries, least recently used first. An entry a call is using (`use`) is never closed under it.
`to_close` decides (pure); `Pool` applies, closing in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["EntryState", "Pool", "to_close"]

log = logging.getLogger(__name__)

V = TypeVar("V")


@dataclass(slots=True)
class EntryState:
    """What deciding needs of an entry: when a call last used it and how many use it now."""

    last_used: float
    busy: int = 0


def to_close(
    entries: Mapping[str, EntryState],
    now: float,
    *,
    cap: int,
    idle_s: float,
    pinned: Callable[[str], bool] = lambda _: False,
) -> list[str]:
    """The keys to close: the idle ones, then the least recently used until `cap` remain.

    `entries` iterates least recently used first. Busy entries are never chosen (the table may
    then stay above `cap` until they finish); pinned ones only to come down to `cap`.
    """
    chosen = [
        key
        for key, state in entries.items()
        if state.busy == 0 and now - state.last_used >= idle_s and not pinned(key)
    ]
    excess = len(entries) - len(chosen) - cap
    if excess > 0:
        taken = set(chosen)
        for key, state in entries.items():
            if excess <= 0:
                break
            if state.busy == 0 and key not in taken:
                chosen.append(key)
                excess -= 1
    return chosen


class Pool(Generic[V]):
    """Clients by key, opened by `make`, closed by `close` as `to_close` decides."""

    def __init__(
        self,
        name: str,
        make: Callable[[str], Awaitable[V]],
        close: Callable[[V], Awaitable[None]],
        *,
        cap: int,
        idle_s: float,
        pinned: Callable[[str], bool] = lambda _: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.cap = cap
        self.idle_s = idle_s
        self._make = make
        self._close = close
        self._pinned = pinned
        self._clock = clock
        self._values: dict[str, V] = {}
        self._states: OrderedDict[str, EntryState] = OrderedDict()
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.closed_total = 0
        """Entries closed so far (idle or evicted)."""

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def values(self) -> list[V]:
        """The open clients."""
        return list(self._values.values())

    @contextlib.asynccontextmanager
    async def use(self, key: str) -> AsyncIterator[V]:
        """The key's client (opened if need be), not closed before the block ends."""
        self._start_sweeper()
        while key not in self._values:  # (again if closed before this call got it)
            opening = self._opening.get(key)
            if opening is None:
                opening = asyncio.get_running_loop().create_task(self._open(key))
                self._opening[key] = opening
            await asyncio.shield(opening)  # a waiter cancelled: the client is still kept
        value = self._values[key]
        state = self._states[key]
        state.busy += 1
        state.last_used = self._clock()
        self._states.move_to_end(key)
        try:
            if len(self._values) > self.cap:
                self.sweep()
            yield value
        finally:
            state.busy -= 1
            state.last_used = self._clock()

    async def _open(self, key: str) -> None:
        try:
            value = await self._make(key)
        finally:
            del self._opening[key]
        self._values[key] = value
        self._states[key] = EntryState(self._clock())

    def _start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(max(min(self.idle_s / 4, 30.0), 0.05))
            self.sweep()

    def sweep(self) -> int:
        """Close what `to_close` chooses now; returns how many."""
        chosen = to_close(
            self._states, self._clock(), cap=self.cap, idle_s=self.idle_s, pinned=self._pinned
        )
        for key in chosen:
            value = self._values.pop(key)
            del self._states[key]
            task = asyncio.get_running_loop().create_task(self._close_one(key, value))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        self.closed_total += len(chosen)
        return len(chosen)

    async def _close_one(self, key: str, value: V) -> None:
        try:
            await self._close(value)
        except Exception:  # a close that fails leaves nothing for the table to do
            log.exception("closing the %s of %s failed", self.name, key)

    async def close_pending(self) -> None:
        """Wait for the closes under way."""
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def close(self) -> None:
        """Close every client (and wait for closes under way)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for opening in list(self._opening.values()):
            opening.cancel()
        values = list(self._values.values())
        self._values.clear()
        self._states.clear()
        for value in values:
            with contextlib.suppress(Exception):
                await self._close(value)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
