"""Spark's discovery hook: PySpark registers `DefaultSource` of every `pyspark_*` module."""

from ferrymq.spark.source import FerryDataSource as DefaultSource

__all__ = ["DefaultSource"]
