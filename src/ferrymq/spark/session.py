"""A local SparkSession set up for ferrymq, and the pipeline `ferry demo` ends with.

`local_session` applies what the PySpark data source needs on one machine: workers run this
Python (`PYSPARK_PYTHON`), everything binds loopback, no UI, two shuffle partitions, no empty
micro-batches; Spark's Python processes import the installed PySpark (`home.launch_home`, which
saves every streaming query about 0.5 s of CPU at start); `format("ferrymq")` is registered
(`registration.register_data_source`: concurrent query starts cannot corrupt it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ferrymq.spark.home import launch_home
from ferrymq.spark.registration import register_data_source
from ferrymq.spark.source import FerryDataSource

__all__ = ["demo_aggregate", "local_session"]

CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}


def local_session(app: str, master: str = "local[2]") -> Any:
    """A SparkSession on this machine with `format("ferrymq")` registered.

    Spark finds a streaming sink's Python data source through the session active in the
    calling thread: start `writeStream.format("ferrymq")` queries from the thread that made the
    session (another thread gets `ClassNotFoundException: ferrymq.DefaultSource`).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app)
    for key, value in CONF.items():
        builder = builder.config(key, value)
    with launch_home(master):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register_data_source(spark, FerryDataSource)  # issue 19: registration.py
    return spark


def demo_aggregate(servers: str, topic: str, out: Path) -> list[dict[str, Any]]:
    """Read the demo topic, write orders and amounts per tag and queue to Parquet, read back.

    The demo's bodies are `order-NNNNNN amount=A`; the result has one row per (tags, brokerName,
    queueId) with the orders, the sum of their amounts and the offsets read.
    """
    spark = local_session("ferrymq-demo")
    try:
        orders = (
            spark.read.format("ferrymq")
            .option("servers", servers)
            .option("subscribe", topic)
            .option("includeFerryColumns", "true")
            .load()
        )
        aggregate = orders.selectExpr(
            "tags",
            "brokerName",
            "queueId",
            "offset",
            "cast(regexp_extract(cast(value as string), 'amount=(\\\\d+)', 1) as int) as amount",
        ).groupBy("tags", "brokerName", "queueId")
        aggregate.agg({"offset": "count", "amount": "sum"}).withColumnsRenamed(
            {"count(offset)": "orders", "sum(amount)": "amount"}
        ).write.mode("overwrite").parquet(str(out))
        rows = spark.read.parquet(str(out)).orderBy("tags", "brokerName", "queueId").collect()
        return [row.asDict() for row in rows]
    finally:
        spark.stop()
