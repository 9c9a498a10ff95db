"""The official 5.x Python client's own virtual environment (made once, cached outside the repo).

PyPI `rocketmq-python-client` installs the top-level module `rocketmq`, as the 4.x client of
tests/compat does, so it lives in its own venv under ~/.cache/ferrymq (`.ci/run` makes it before
the test run; a missing one is made on first use: `ferrymq.proxy.stubs.client_python`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ferrymq.proxy.stubs import client_python

__all__ = ["v5_python"]


def v5_python() -> Path:
    """The venv's python, the venv made first when missing."""
    return client_python()


if __name__ == "__main__":  # `python -m tests.proxy.v5env` (.ci/run): make it now
    sys.stdout.write(f"{v5_python()}\n")
