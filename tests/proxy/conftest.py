from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ferrymq.proxy.server import GrpcEndpoint
from ferrymq.testing import LocalCluster

from .v5env import v5_python


@pytest.fixture(scope="session")
def v5() -> Path:
    """The official 5.x client's python (its own venv)."""
    return v5_python()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    # half messages are checked after 1 s, every 0.3 s: the check path is seen within seconds
    async with LocalCluster(
        tmp_path, transaction_timeout=1000, transaction_check_interval=300
    ) as local:
        yield local


@pytest.fixture
async def endpoint(cluster: LocalCluster) -> AsyncIterator[GrpcEndpoint]:
    server = GrpcEndpoint(cluster.namesrv_addr)
    await server.start()
    try:
        yield server
    finally:
        await server.close()
