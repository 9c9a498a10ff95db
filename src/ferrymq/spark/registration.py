"""Registering a PySpark Python data source so concurrent query starts cannot corrupt it (issue 19).

Spark 4.3's Python data sources share one `java.util.HashMap` of environment variables: the
registered `SimplePythonFunction`'s `envVars`, which every function made from the registration
(the reader and writer factories that each micro-batch's task binary holds) points to. Each
streaming query's `PythonStreamingSourceRunner.init()` puts four entries into that map in place,
from the query's own thread, without a lock. Two queries initialising their sources at the same
moment (a driver restarting two tasks) can leave the map's `size` one above its entries, and from
then on every task binary holding the map fails to deserialise with `java.io.OptionalDataException`
(HashMap.readObject under scala's DefaultSerializationProxy.readObject, in ResultTask.runTask):
all queries of the process fail at once. A map whose `size` is bumped by one shows exactly that.

`register_data_source` registers as `spark.dataSource.register` does and puts those four keys
into the map before the registration is visible, so a runner's put only replaces a value: no
structural change, nothing to race. Only the keys matter: every runner sets the three per-process
values itself before it starts a Python process (the source runner in this map, PythonPlannerRunner
in its copy, BasePythonRunner in the task's copy), and SPARK_PYTHON_RUNTIME is the runner's own.

Spark's own registration of an installed `pyspark_*` module's `DefaultSource` (how
`pyspark_ferrymq` makes `format("ferrymq")` work without `register`) cannot take the fix by
itself: the JVM runs a lookup worker that only returns the pickled class, builds the function
and its env map itself, and keeps that one source for every session of the JVM
(`DataSourceManager.dataSourceBuilders`); no ferrymq code runs in the driver then.
`register_data_source` therefore also fills that auto-registered source's map
(`fill_auto_registered`), so one `register(spark)` (or `local_session`) per driver, before its
queries start, covers both: this session's registration (looked up first) and the JVM-wide one
that sessions without it use. A driver that never calls it keeps Spark's unfixed map.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Final

__all__ = [
    "RUNNER_ENV_KEYS",
    "auto_registered_env",
    "fill_auto_registered",
    "register_data_source",
    "runner_env",
]

RUNNER_ENV_KEYS: Final = (
    "SPARK_LOCAL_DIRS",
    "SPARK_AUTH_SOCKET_TIMEOUT",
    "SPARK_BUFFER_SIZE",
    "SPARK_PYTHON_RUNTIME",
)
"""What PythonStreamingSourceRunner.init() puts into the shared map (Spark 4.3.0)."""

_UDPS: Final = "org.apache.spark.sql.execution.datasources.v2.python.UserDefinedPythonDataSource"
_MANAGER: Final = "org.apache.spark.sql.execution.datasources.DataSourceManager$"


def runner_env(spark: Any) -> dict[str, str]:
    """The runner's keys, with this session's configured values (each runner sets its own)."""
    conf = spark.sparkContext.getConf()
    local = os.environ.get("SPARK_LOCAL_DIRS") or conf.get("spark.local.dir", tempfile.gettempdir())
    timeout = conf.get("spark.python.authenticate.socketTimeout", "15s")
    return {
        "SPARK_LOCAL_DIRS": str(local),
        "SPARK_AUTH_SOCKET_TIMEOUT": str(timeout).removesuffix("s"),
        "SPARK_BUFFER_SIZE": str(conf.get("spark.buffer.size", "65536")),
        "SPARK_PYTHON_RUNTIME": "PYTHON_WORKER",
    }


def register_data_source(spark: Any, source: type[Any]) -> None:
    """`spark.dataSource.register(source)` with the runner's entries already in its env map."""
    from pyspark.sql.udf import _wrap_function

    sc = spark.sparkContext
    wrapped = _wrap_function(sc, source)  # what DataSourceRegistration.register wraps
    env = wrapped.envVars()
    for key, value in runner_env(spark).items():
        env.put(key, value)
    registered = getattr(sc._jvm, _UDPS)(wrapped)
    spark._jsparkSession.dataSource().registerPython(source.name(), registered)
    fill_auto_registered(spark, source.name())


def auto_registered_env(spark: Any, name: str) -> Any | None:
    """The env map of Spark's auto-registered source `name` (JVM-wide); None when it has none."""
    # the session's manager computes Spark's static sources once per JVM (the lookup worker)
    spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name)
    manager = getattr(getattr(spark.sparkContext._jvm, _MANAGER), "MODULE$")
    builders = manager.dataSourceBuilders()  # Option[Map[normalized name, source]]
    if not builders.isDefined():
        return None
    found = builders.get().get(name.lower())
    return found.get().dataSourceCls().envVars() if found.isDefined() else None


def fill_auto_registered(spark: Any, name: str) -> None:
    """Put the runner's keys into the map of Spark's auto-registered source `name`, if any."""
    env = auto_registered_env(spark, name)
    if env is None:
        return
    for key, value in runner_env(spark).items():
        if not env.containsKey(key):
            env.put(key, value)
