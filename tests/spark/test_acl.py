"""The Spark source and sink with ACL credentials (issue 23): options reach every executor."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient

from .conftest import Ferry, start_ferry

pytestmark = pytest.mark.spark

ACL = """
accounts:
- {accessKey: spark-user, secretKey: spark-secret, defaultTopicPerm: PUB|SUB,
   defaultGroupPerm: SUB}
- {accessKey: admin-key, secretKey: admin-secret, admin: true}
"""
KEYS = {"accessKey": "spark-user", "secretKey": "spark-secret"}


@pytest.fixture(scope="module")
def acl_ferry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ferry]:
    root = tmp_path_factory.mktemp("acl-ferry")
    acl_file = root / "plain_acl.yml"
    acl_file.write_text(ACL)
    cluster = start_ferry(root / "c", "--acl-enable", "true", "--acl-file", str(acl_file))
    try:
        asyncio.run(_create(cluster.servers))
        yield cluster
    finally:
        cluster.stop()


async def _create(servers: str) -> None:
    async with AdminClient(servers, access_key="admin-key", secret_key="admin-secret") as admin:
        await admin.create_topic("SparkAcl", 2)


def test_spark_writes_and_reads_with_credentials_and_is_refused_without(
    spark: Any, acl_ferry: Ferry, tmp_path: Path
) -> None:
    rows = spark.createDataFrame([("a",), ("b",), ("c",)], ["value"])
    writer = rows.write.format("ferrymq").option("servers", acl_ferry.servers)
    writer.option("topic", "SparkAcl").options(**KEYS).mode("append").save()

    def reader() -> Any:
        return (
            spark.read.format("ferrymq")
            .option("servers", acl_ferry.servers)
            .option("subscribe", "SparkAcl")
        )

    values = sorted(r.value.decode() for r in reader().options(**KEYS).load().collect())
    assert values == ["a", "b", "c"]
    with pytest.raises(Exception, match="No accessKey is configured"):
        reader().option("failoverTimeoutMs", "1000").load().count()  # no 30 s of retries
    log = (acl_ferry.root / "broker.log").read_text()
    assert "spark-secret" not in log
