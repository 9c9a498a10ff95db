"""Spark's discovery hook: PySpark registers `DefaultSource` of every `pyspark_*` module.

Spark builds that registration in the JVM, without issue 19's env-map fix: `ferrymq.spark.register`
adds it (`ferrymq/spark/registration.py`).
"""

from ferrymq.spark.source import FerryDataSource as DefaultSource

__all__ = ["DefaultSource"]
