"""The endpoint's start keeps its event loop serving while the v2 schema loads.

A first start builds the schema with `pip download` (minutes at worst, `proxy.stubs.build`); in a
broker with `enableProxy` that loop is the broker's, which must go on answering meanwhile.
"""

import asyncio
import time

import pytest

from ferrymq.proxy import server as server_module
from ferrymq.proxy import stubs
from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.proxy.stubs import V2


async def test_the_schema_loads_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    real_load = stubs.load

    def slow_load() -> V2:  # the injected fault: a slow download of the client's wheel
        time.sleep(0.5)
        return real_load()

    monkeypatch.setattr(server_module, "load", slow_load)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.get_running_loop().create_task(tick())
    endpoint = GrpcEndpoint("127.0.0.1:9")  # no cluster: starting connects nowhere
    try:
        await endpoint.start()
    finally:
        ticker.cancel()
        await endpoint.close()
    assert ticks >= 10, f"the loop ran {ticks} times while the schema loaded"
