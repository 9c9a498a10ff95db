"""Shared test configuration: Hypothesis profiles, uvloop, and a bound on every async test.

`HYPOTHESIS_PROFILE=ci` (what `make test` sets) is derandomized, so CI is a deterministic gate;
`dev` explores new examples on every run.

pytest-timeout's thread method (pyproject.toml) ends the whole run when a test overstays, so one
stuck await used to cost CI every later test and named no test (a CI run at c969e84 died that way,
its log showing only the main thread's `run_until_complete`). Each async test therefore runs inside
`asyncio.timeout` a little under its pytest-timeout: a hang fails that test alone, with the await
it was stuck on in the traceback, and the run goes on; the thread timeout stays the backstop for
a test stuck outside the loop.
"""

import asyncio
import functools
import inspect
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None, print_blob=True)
settings.register_profile(
    "soak", max_examples=5000, stateful_step_count=80, deadline=None, print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Async tests run on uvloop, the loop the servers run on."""
    return {"uvloop": uvloop.new_event_loop}


def _bounded(test: Callable[..., Awaitable[None]], seconds: float) -> Callable[..., Any]:
    @functools.wraps(test)
    async def bounded(*args: Any, **kwargs: Any) -> None:
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                await test(*args, **kwargs)
        except TimeoutError as error:
            if not deadline.expired():
                raise  # the test's own TimeoutError
            raise AssertionError(
                f"the test was still running after {seconds:.0f} s (cancelled; the traceback "
                "shows the await it was stuck on)"
            ) from error

    return bounded


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Bound every async test by `asyncio.timeout`: its pytest-timeout less a tenth (>= 5 s)."""
    default_s = float(config.getini("timeout") or 0)
    for item in items:
        if not isinstance(item, pytest.Function) or not inspect.iscoroutinefunction(item.obj):
            continue
        if getattr(item.obj, "is_hypothesis_test", False):
            continue  # pytest-asyncio runs its inner test; Hypothesis has its own deadlines
        marker = item.get_closest_marker("timeout")
        limit_s = float(marker.args[0]) if marker is not None and marker.args else default_s
        if limit_s > 0:
            item.obj = _bounded(item.obj, limit_s - max(5.0, limit_s / 10))
