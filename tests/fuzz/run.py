"""Run one fuzz target under atheris: `python -m tests.fuzz.run TARGET [libFuzzer args]`.

The target's seeds (`seeds.py`) are written to a fresh corpus directory that libFuzzer grows
(pass your own directory as an argument to keep it). `make fuzz` runs every target for a while;
`test_fuzz.py` runs `all` (every target in one process, the first byte choosing) for seconds. A
finding (an exception outside `EXPECTED_ERRORS`, or a failed round trip) stops the run with a
traceback and a `crash-*` reproducer in the working directory.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["ferrymq"]):
    from tests.fuzz.seeds import SEEDS
    from tests.fuzz.targets import TARGETS


_NAMES = sorted(TARGETS)


def _all(data: bytes) -> None:
    """Every target in one process: the first byte picks it, the rest is its input."""
    if data:
        TARGETS[_NAMES[data[0] % len(_NAMES)]](data[1:])


def _seeds(name: str) -> list[bytes]:
    if name != "all":
        return SEEDS[name]
    return [bytes([i]) + seed for i, n in enumerate(_NAMES) for seed in SEEDS[n]]


def main() -> None:
    """Fuzz the target named by the first argument; the rest go to libFuzzer."""
    if len(sys.argv) < 2 or sys.argv[1] not in {*TARGETS, "all"}:
        sys.stderr.write(f"usage: python -m tests.fuzz.run {{all,{','.join(_NAMES)}}} [args]\n")
        sys.exit(2)
    name = sys.argv[1]
    args = sys.argv[2:]
    if not any(not a.startswith("-") for a in args):
        corpus = Path(tempfile.mkdtemp(prefix=f"ferrymq-fuzz-{name}-"))
        for i, seed in enumerate(_seeds(name)):
            (corpus / f"seed-{i}").write_bytes(seed)
        args.append(str(corpus))
    target = _all if name == "all" else TARGETS[name]
    atheris.Setup([sys.argv[0], "-timeout=2", "-rss_limit_mb=1024", *args], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
