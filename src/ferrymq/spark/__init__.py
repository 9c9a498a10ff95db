"""ferrymq for Spark: the `ferrymq` PySpark data source (the only package that imports pyspark).

```python
from ferrymq.spark import register
register(spark)
df = spark.read.format("ferrymq").options(servers="127.0.0.1:9876", subscribe="t").load()
```

Installing `ferrymq[spark]` also installs the top-level module `pyspark_ferrymq`, which Spark finds
by itself, so `format("ferrymq")` works without `register`; call `register` once per driver
anyway, before its queries start: Spark's own registration lacks issue 19's env-map fix
(`registration.py`), which `register` applies to it too.
"""

from __future__ import annotations

from typing import Any

from ferrymq.spark.registration import register_data_source
from ferrymq.spark.retry import RetryableQueryError
from ferrymq.spark.source import FerryDataSource

__all__ = ["FerryDataSource", "RetryableQueryError", "register"]


def register(spark: Any) -> None:
    """Make `format("ferrymq")` available in a SparkSession."""
    register_data_source(spark, FerryDataSource)
