from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ferrymq.rpc.client import RpcClient
from ferrymq.testing import LocalCluster


@pytest.fixture
async def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[LocalCluster]:
    overrides = getattr(request, "param", {})
    async with LocalCluster(tmp_path, **overrides) as local:
        yield local


@pytest.fixture
async def client() -> AsyncIterator[RpcClient]:
    async with RpcClient() as rpc:
        yield rpc
