"""Every decoder survives arbitrary bytes: seeds replayed, Hypothesis bytes, a short atheris run.

The long run is `make fuzz` (each target on its own); here atheris fuzzes all targets in one
process for a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .seeds import SEEDS
from .targets import TARGETS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_seed_is_accepted_by_its_target(name: str) -> None:
    assert SEEDS[name], f"{name} has no seed"
    for seed in SEEDS[name]:
        TARGETS[name](seed)


def _mutated(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    """A seed with a few bytes overwritten, cut short or extended."""

    @st.composite
    def mutate(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(st.sampled_from(seeds)))
        for _ in range(draw(st.integers(0, 4))):
            if data:
                data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        cut = draw(st.integers(0, len(data)))
        return bytes(data[:cut]) + draw(st.binary(max_size=16))

    return mutate()


@pytest.mark.parametrize("name", sorted(TARGETS))
@given(data=st.data())
def test_random_and_mutated_bytes_raise_only_typed_errors(name: str, data: st.DataObject) -> None:
    target = TARGETS[name]
    target(data.draw(st.binary(max_size=300), label="random"))
    target(data.draw(_mutated(SEEDS[name]), label="mutated"))


def test_atheris_finds_nothing_in_every_target_in_a_few_seconds(tmp_path: Path) -> None:
    pytest.importorskip("atheris")
    completed = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.run", "all", "-max_total_time=6"],
        cwd=ROOT,
        capture_output=True,
        timeout=90,
        check=False,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
    )
    tail = completed.stderr.decode(errors="replace")[-3000:]
    assert completed.returncode == 0, f"the fuzzer found something:\n{tail}"
    assert "Done" in tail, tail
