"""The SPARK_HOME a local ferrymq session runs with: Spark's Python processes import installed code.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on the path of every Python process it
starts. Python compiles a module imported from a zip each time (zipimport keeps no bytecode
cache) and re-reads the zip's directory whenever import caches are invalidated, which PySpark's
workers do at start. Most workers fork from a daemon that pays this once, but Spark starts the
runner of a Python streaming source as a new process for every query: with the zip, that runner
spends about 0.5 s of CPU on importing PySpark before the query reads anything (measured with
`os.times()` in the runner: 0.5-0.9 s with the zip, 0.2-0.35 s without).

A pip-installed PySpark is both: the package in site-packages (bytecode cached) and a SPARK_HOME
(its `jars/`, `bin/`, and `python/lib/pyspark.zip`, a zip of the same modules). `spark_home`
makes a directory with links to everything of that SPARK_HOME but `python/`, so Spark's launcher
finds its jars and scripts there, the zip path it adds to PYTHONPATH does not exist, and Python
workers import the same PySpark from site-packages. It is used only where that is the same code:
no SPARK_HOME set by the user, a pip-installed PySpark the workers' Python (this interpreter)
imports from its own site-packages, and a local master (a cluster manager ships pyspark.zip to
remote executors from SPARK_HOME).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import site
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["installed_spark_home", "launch_home", "spark_home"]

log = logging.getLogger(__name__)

_SKIPPED = frozenset({"python", "__pycache__"})
"""Entries of the package directory the overlay leaves out (`python/` holds the zips)."""


def installed_spark_home() -> Path | None:
    """The directory of the pip-installed PySpark this interpreter imports, when it is one.

    None when PySpark is not installed, is not a pip install (no `jars/` beside its modules), or
    lies outside this interpreter's site-packages (then a worker could import another copy).
    """
    try:
        import pyspark
    except ImportError:
        return None
    package = Path(pyspark.__file__).resolve().parent
    if not (package / "jars").is_dir() or not (package / "python" / "lib").is_dir():
        return None
    sites = [Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]]
    if package.parent not in sites:
        return None
    return package


def spark_home(cache_dir: Path | None = None) -> Path | None:
    """A SPARK_HOME for a local session whose Python workers import PySpark from site-packages.

    Returns None (use Spark's own) when SPARK_HOME is set, when workers run another Python
    (`PYSPARK_PYTHON`), or when PySpark is not a pip install of this interpreter. The directory
    is made once per PySpark installation under `cache_dir` (default `~/.cache/ferrymq`), by a
    rename, so concurrent sessions never see half of one.
    """
    if os.environ.get("SPARK_HOME"):
        return None
    worker_python = os.environ.get("PYSPARK_PYTHON")
    this_python = Path(sys.executable).resolve()
    if worker_python is not None and Path(worker_python).resolve() != this_python:
        return None
    package = installed_spark_home()
    if package is None:
        return None
    import pyspark

    base = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ferrymq"
    digest = hashlib.sha256(str(package).encode()).hexdigest()[:12]
    home = base / f"spark-home-{pyspark.__version__}-{digest}"
    if _complete(home, package):
        return home
    try:
        base.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=base))
        try:
            staging.chmod(0o755)
            for entry in sorted(package.iterdir()):
                if entry.name not in _SKIPPED:
                    (staging / entry.name).symlink_to(entry)
            if home.exists() and not _complete(home, package):  # stale: the package changed
                shutil.rmtree(home, ignore_errors=True)
            staging.rename(home)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    except OSError as exc:
        if _complete(home, package):  # another session made it meanwhile
            return home
        log.warning("using Spark's own SPARK_HOME: cannot make %s (%s)", home, exc)
        return None
    return home


def _complete(home: Path, package: Path) -> bool:
    """Whether `home` links every entry of `package` the overlay keeps, and nothing else."""
    if not home.is_dir():
        return False
    wanted = {e.name for e in package.iterdir() if e.name not in _SKIPPED}
    present = {e.name for e in home.iterdir()}
    return present == wanted and all(
        (home / name).is_symlink() and (home / name).resolve() == (package / name).resolve()
        for name in wanted
    )


@contextlib.contextmanager
def launch_home(master: str) -> Iterator[Path | None]:
    """SPARK_HOME set to `spark_home()` while a local session's JVM starts, then as it was.

    Spark's launcher reads it once, when the JVM starts; the process environment is left as it
    was, so later subprocesses see the user's own.
    """
    home = spark_home() if master.startswith("local") else None
    if home is None:
        yield None
        return
    os.environ["SPARK_HOME"] = str(home)
    try:
        yield home
    finally:
        os.environ.pop("SPARK_HOME", None)
