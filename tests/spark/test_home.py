"""The SPARK_HOME of local sessions: Spark's Python processes import the installed PySpark."""

import os
import sys
from pathlib import Path
from typing import Any

import pyspark
import pytest

from ferrymq.spark.home import installed_spark_home, launch_home, spark_home

pytestmark = pytest.mark.spark

_LEFT_OUT = {"python", "__pycache__"}


@pytest.fixture
def plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)


@pytest.mark.usefixtures("plain_env")
def test_links_everything_of_the_installed_pyspark_but_its_zips(tmp_path: Path) -> None:
    package = installed_spark_home()
    assert package is not None
    assert (package / "python" / "lib" / "pyspark.zip").is_file()
    home = spark_home(tmp_path)
    assert home is not None
    assert home.parent == tmp_path
    assert not (home / "python").exists()
    assert (home / "bin" / "spark-submit").resolve() == (package / "bin" / "spark-submit").resolve()
    assert (home / "jars").resolve() == (package / "jars").resolve()
    kept = sorted(p.name for p in package.iterdir() if p.name not in _LEFT_OUT)
    assert sorted(p.name for p in home.iterdir()) == kept
    assert spark_home(tmp_path) == home
    assert [p.name for p in tmp_path.iterdir()] == [home.name]  # no staging directory left


@pytest.mark.usefixtures("plain_env")
def test_a_damaged_home_is_made_again(tmp_path: Path) -> None:
    home = spark_home(tmp_path)
    assert home is not None
    (home / "jars").unlink()
    (home / "python").mkdir()
    assert spark_home(tmp_path) == home
    assert (home / "jars").is_symlink()
    assert not (home / "python").exists()


def test_none_when_the_user_chose_a_home_or_another_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "mine"))
    assert spark_home(tmp_path) is None
    monkeypatch.delenv("SPARK_HOME")
    other = tmp_path / "python3"
    other.touch()
    monkeypatch.setenv("PYSPARK_PYTHON", str(other))
    assert spark_home(tmp_path) is None
    assert list(tmp_path.iterdir()) == [other]


@pytest.mark.usefixtures("plain_env")
def test_set_only_while_a_local_session_launches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with launch_home("local[2]") as home:
        assert home is not None
        assert os.environ["SPARK_HOME"] == str(home)
        assert home.parent == tmp_path / "ferrymq"
    assert "SPARK_HOME" not in os.environ
    with launch_home("spark://127.0.0.1:7077") as home:
        assert home is None
        assert "SPARK_HOME" not in os.environ


def test_the_session_workers_import_pyspark_from_site_packages(spark: Any) -> None:
    jvm_home = Path(spark._jvm.java.lang.System.getenv("SPARK_HOME"))
    assert (jvm_home / "jars").is_dir()
    assert not (jvm_home / "python").exists()
    found = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: __import__("pyspark").__file__)
        .collect()
    )
    assert found == [pyspark.__file__]
    assert ".zip" not in found[0]
