"""Riding out a failover: retry what the data source asks of ferrymq, then fail retryably.

A broker group without a master for a moment (its master died, the controller is electing a new
one) answers with connection errors, timeouts and refusals that pass. `with_failover` retries
an idempotent step (a pull, a listing of offsets) with back-off for up to the query's
`failoverTimeoutMs`, then raises `RetryableQueryError`; `retryable` turns such an error that
outlived the sink client's own retries into one. Restarting the query from its checkpoint after
one loses and repeats nothing: the offsets of every uncommitted micro-batch are read again and
the sink commits each batch once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from ferrymq.client.sink import RETRY_CODES
from ferrymq.errors import FerryError, RemoteError, RpcError

__all__ = ["RetryableQueryError", "is_transient", "retryable", "with_failover"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class RetryableQueryError(FerryError):
    """A step of the query met a failover (or an unreachable broker) longer than its retries.

    The query may be restarted from its checkpoint: nothing is lost or written twice.
    """

    def __init__(self, what: str, cause: BaseException) -> None:
        super().__init__(
            f"{what} failed while the cluster was unavailable ({cause}); this error is "
            "retryable: restart the query from its checkpoint, it loses and repeats nothing"
        )
        self.what = what


def is_transient(exc: BaseException) -> bool:
    """Whether an error is one a failover causes (and a later attempt may not meet)."""
    if isinstance(exc, RpcError):
        return True
    return isinstance(exc, RemoteError) and exc.code in RETRY_CODES


async def with_failover(what: str, attempt: Callable[[], Awaitable[T]], *, budget: float) -> T:
    """`attempt()` until it returns, retrying transient errors for up to `budget` seconds.

    Raises:
        RetryableQueryError: transient errors went on for `budget` seconds.
    """
    deadline = time.monotonic() + budget
    delay = 0.05
    while True:
        try:
            return await attempt()
        except FerryError as exc:
            if not is_transient(exc):
                raise
            if time.monotonic() + delay > deadline:
                raise RetryableQueryError(what, exc) from exc
            log.info("%s: %s; retrying", what, exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


@contextmanager
def retryable(what: str) -> Iterator[None]:
    """Raise a transient ferrymq error of the block as `RetryableQueryError`."""
    try:
        yield
    except FerryError as exc:
        if is_transient(exc):
            raise RetryableQueryError(what, exc) from exc
        raise
