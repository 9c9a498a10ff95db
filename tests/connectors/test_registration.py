"""Issue 19's OptionalDataException: a query start must not change the registered source's env map.

`ferrymq.spark.register` (and `local_session`, the connectors' `build`) register through
`spark/registration.py`. Every query's PythonStreamingSourceRunner puts entries into the one
HashMap the registration shares with every task binary of every query; when that put adds keys,
two queries starting at once can corrupt the map and every later task of the process fails to
deserialise. Here a `ferrymq` query runs one micro-batch in the session (a real broker): the
map holds the same keys, and as many entries as its size says, before and after. With a plain
`spark.dataSource.register`, the map gains the four keys at the query's start and this fails.
"""

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from ferrymq.spark import register
from ferrymq.spark.registration import RUNNER_ENV_KEYS

from ..spark.conftest import Ferry
from .conftest import create_topic, produce_json

pytestmark = [pytest.mark.spark]


def env_map(spark: Any) -> tuple[dict[str, str], int]:
    """The registered `ferrymq` function's env map: its entries, and the size it claims."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    env = manager.lookupDataSource("ferrymq").dataSourceCls().envVars()
    entries: dict[str, str] = {}
    found = env.entrySet().iterator()
    while found.hasNext():
        entry = found.next()
        entries[str(entry.getKey())] = str(entry.getValue())
    return entries, int(env.size())


@pytest.mark.timeout(120)
def test_a_query_start_adds_no_key_to_the_shared_env_map(
    spark: Any, ferry: Ferry, tmp_path: Path
) -> None:
    register(spark)  # a fresh registration: a fresh map
    before, size = env_map(spark)
    assert size == len(before)
    assert set(RUNNER_ENV_KEYS) <= set(before), before.keys()
    asyncio.run(create_topic(ferry.servers, "RegEnv", 1))
    asyncio.run(produce_json(ferry.servers, "RegEnv", [{"id": 1}]))
    query = (
        spark.readStream.format("ferrymq")
        .option("servers", ferry.servers)
        .option("subscribe", "RegEnv")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .start()
    )
    try:
        deadline = time.monotonic() + 90
        while query.lastProgress is None:  # batch 0 ran: the source runner put its entries
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "no micro-batch in 90 s"
            time.sleep(0.1)
        assert query.lastProgress["numInputRows"] == 1
    finally:
        query.stop()
    after, size = env_map(spark)
    assert (sorted(after), size) == (sorted(before), len(before))
