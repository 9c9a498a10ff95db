"""Spark's own registration of `pyspark_ferrymq` gets issue 19's env-map fix (registration.py).

With `ferrymq[spark]` installed Spark registers `pyspark_ferrymq.DefaultSource` by itself, once
per JVM, with an env map of its own that every session without `register` uses. The session's
`register` (here `local_session`'s) fills that map too: the source runner's four keys are there
before any query starts, so a query start adds none.
"""

from typing import Any

import pytest

from ferrymq.spark.registration import RUNNER_ENV_KEYS, auto_registered_env

pytestmark = [pytest.mark.spark]


def test_the_auto_registered_source_has_the_runner_keys_before_any_query(spark: Any) -> None:
    env = auto_registered_env(spark, "ferrymq")
    assert env is not None, "Spark did not register pyspark_ferrymq (is ferrymq installed?)"
    keys = {str(key) for key in env.keySet().toArray()}
    assert set(RUNNER_ENV_KEYS) <= keys, keys
    assert env.size() == len(keys)
    # a session that never called register: format("ferrymq") is that very source
    other = spark.newSession()._jsparkSession.sessionState().dataSourceManager()
    used = other.lookupDataSource("ferrymq").dataSourceCls().envVars()
    identity = spark.sparkContext._jvm.System.identityHashCode
    assert identity(used) == identity(env)
