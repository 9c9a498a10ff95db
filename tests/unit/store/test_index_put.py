"""The key index's C path (`accel.index_put`) writes what `IndexFile.put`, the reference, does."""

import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import StoreError
from ferrymq.store import index
from ferrymq.store.index import IndexFile, index_key_hash

_keys = st.lists(
    st.tuples(
        st.sampled_from(["T", "Orders", "%RETRY%G", "t\u00e9"]),
        st.text(min_size=1, max_size=12),  # any text: surrogate pairs included
        st.integers(0, 2**62),
        st.integers(1_700_000_000_000, 1_700_000_000_000 + 2**40),
    ),
    min_size=1,
    max_size=60,
)


def _state(f: IndexFile) -> tuple[object, ...]:
    return (
        bytes(f._map),
        f.begin_timestamp_ms,
        f.end_timestamp_ms,
        f.begin_log_offset,
        f.end_log_offset,
        f.hash_slot_count,
        f.index_count,
    )


@pytest.mark.skipif(index._accel is None, reason="the C accelerator is not built")
@given(runs=st.lists(_keys, min_size=1, max_size=4), slots=st.integers(1, 64))
def test_put_many_in_c_writes_the_bytes_put_writes(
    runs: list[list[tuple[str, str, int, int]]], slots: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        capacity = 1 + sum(len(run) for run in runs)
        by_c = IndexFile(Path(tmp) / "c", slots, capacity, create=True)
        by_python = IndexFile(Path(tmp) / "py", slots, capacity, create=True)
        try:
            for run in runs:
                by_c.put_many(run)
                for topic, key, log_offset, stored_ms in run:
                    if by_python.index_count == 1:
                        by_python.begin_timestamp_ms = stored_ms
                        by_python.begin_log_offset = log_offset
                    by_python.put(index_key_hash(topic, key), log_offset, stored_ms)
            by_c.write_header()
            by_python.write_header()
            assert _state(by_c) == _state(by_python)
            topic, key, log_offset, _ = runs[-1][-1]
            assert log_offset in by_c.query(index_key_hash(topic, key), 1000, 0, 2**62)
        finally:
            by_c.close()
            by_python.close()


def test_keys_that_do_not_fit_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "small", 8, 3, create=True)
    before = bytes(f._map)
    with pytest.raises(StoreError, match="do not fit"):
        f.put_many([("T", f"k{i}", i, 1_700_000_000_000) for i in range(3)])
    assert bytes(f._map) == before
    assert f.index_count == 1
    f.put_many([("T", "a", 5, 1_700_000_000_000), ("T", "b", 6, 1_700_000_001_000)])
    assert f.index_count == 3
    assert f.query(index_key_hash("T", "b"), 10, 0, 2**62) == [6]
    f.close()
