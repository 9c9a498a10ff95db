"""A Spark driver in its own process, for the crash tests: `python driver.py JSON`.

JSON keys: mode (`read`: ferrymq -> Parquet, `write`: ferrymq -> ferrymq), servers, source,
target (a topic, or the Parquet directory), checkpoint, trigger (`available_now` or a processing
time), max_offsets, crash_after_commit (write mode: kill this whole driver, JVM included, right
after the sink committed that batch id and before Spark records it: the hardest window).
"""

import json
import os
import signal
import sys
from typing import Any

from pyspark.sql import SparkSession

from ferrymq.spark import FerryDataSource, register
from ferrymq.spark.sink import FerryStreamWriter

CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
}


def kill_driver(driver_pid: int) -> None:
    """SIGKILL the driver process and every process below it, by PID."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree = [driver_pid]
    frontier = [driver_pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        tree += children
        frontier += children
    me = os.getpid()
    for pid in [p for p in tree if p != me] + [me]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


class CrashingWriter(FerryStreamWriter):
    """The ferrymq stream writer, with a crash of the whole driver after one commit."""

    def __init__(self, *args: Any, crash_batch: int, driver_pid: int, marker: str) -> None:
        super().__init__(*args)
        self.crash_batch = crash_batch
        self.driver_pid = driver_pid
        self.marker = marker

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        super().commit(messages, batchId)
        if batchId == self.crash_batch and not os.path.exists(self.marker):
            with open(self.marker, "w") as done:
                done.write(str(batchId))
            kill_driver(self.driver_pid)


class CrashingSource(FerryDataSource):
    """`format("ferrymq_crashing")`: ferrymq with `CrashingWriter`."""

    @classmethod
    def name(cls) -> str:
        return "ferrymq_crashing"

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:  # noqa: N802
        from ferrymq.spark.options import parse_write_options

        options = dict(self.options)
        crash_batch = int(options.pop("crashbatch"))  # this test format's own options
        driver_pid = int(options.pop("driverpid"))
        marker = options.pop("marker")
        return CrashingWriter(
            parse_write_options(options),
            schema,
            crash_batch=crash_batch,
            driver_pid=driver_pid,
            marker=marker,
        )


def main() -> None:
    args = json.loads(sys.argv[1])
    builder = SparkSession.builder.master("local[2]").appName("ferrymq-crash-driver")
    for key, value in CONF.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(CrashingSource)
    reader = (
        spark.readStream.format("ferrymq")
        .option("servers", args["servers"])
        .option("subscribe", args["source"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args["max_offsets"]))
        .load()
    )
    if args["mode"] == "read":
        writer = (
            reader.selectExpr("value", "partition", "offset")
            .writeStream.format("parquet")
            .option("path", args["target"])
        )
    else:
        writer = reader.selectExpr("value", "key").writeStream.option("topic", args["target"])
        if args.get("crash_after_commit") is None:
            writer = writer.format("ferrymq").option("servers", args["servers"])
        else:
            writer = (
                writer.format("ferrymq_crashing")
                .option("servers", args["servers"])
                .option("crashBatch", str(args["crash_after_commit"]))
                .option("driverPid", str(os.getpid()))
                .option("marker", args["checkpoint"] + ".crashed")
            )
    writer = writer.option("checkpointLocation", args["checkpoint"])
    if args["trigger"] == "available_now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args["trigger"])
    query = writer.start()
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
