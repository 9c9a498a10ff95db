"""A Connect task's Spark driver in its own process, for the crash tests: `python driver.py JSON`.

It does what a worker's task runtime does for its tasks: one local SparkSession
(`ferrymq.spark.session.local_session` on the worker's default master), and for each task the
plugin's `build` with a `TaskContext`; then it waits. The test kills this process tree by PID
(or a test crash point does); a query that fails ends the driver with exit code 3 and the trace
on stderr.

JSON keys: plugin (`PostgresSink` or `PostgresSource`), config (the connector config), servers,
connector, incarnation, tasks: [{task, generation, checkpoint}].
"""

import json
import sys
import time
import traceback
from typing import Any

from ferrymq.connect.plugin import ConnectorPlugin, Plugins, TaskContext
from ferrymq.connectors.runtime import SPARK_MASTER
from ferrymq.spark.session import local_session


def main() -> None:
    args = json.loads(sys.argv[1])
    _, plugin_class = Plugins().resolve(args["plugin"])
    plugin: ConnectorPlugin = plugin_class()
    spark = local_session("ferrymq-connector-driver", SPARK_MASTER)  # a worker's default
    configs = plugin.task_configs(args["config"], len(args["tasks"]))
    queries: list[Any] = []
    for task in args["tasks"]:
        context = TaskContext(
            connector=args["connector"],
            incarnation=args["incarnation"],
            task=task["task"],
            generation=task["generation"],
            cluster_id="tests",
            namesrv_addr=args["servers"],
            checkpoint_dir=task["checkpoint"],
        )
        queries.append(plugin.build(spark, configs[task["task"]], context))
    sys.stdout.write("DRIVER STARTED\n")
    sys.stdout.flush()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        for query in queries:
            if not query.isActive:
                error = query.exception()
                sys.stderr.write(f"QUERY ENDED: {error}\n")
                if error is not None:
                    traceback.print_exception(error)
                sys.stderr.flush()
                sys.exit(3)
        time.sleep(0.2)
    sys.exit(4)


if __name__ == "__main__":
    main()
