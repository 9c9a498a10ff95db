"""Shared test configuration: Hypothesis profiles.

`HYPOTHESIS_PROFILE=ci` (what `make test` sets) is derandomized, so CI is a deterministic gate;
`dev` explores new examples on every run.
"""

import asyncio
import os
from collections.abc import Callable

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
