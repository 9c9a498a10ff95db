"""The pure offset arithmetic of the source: stable JSON, read limits, splits."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.spark.plan import QueueRange, cap_rows, offsets_json, parse_offsets, split_ranges

pytestmark = pytest.mark.spark


def test_offsets_json_is_one_text_whatever_the_insertion_order() -> None:
    a = offsets_json({"b": {10: 1, 2: 5}, "a": {0: 3}})
    b = offsets_json({"a": {0: 3}, "b": {2: 5, 10: 1}})
    assert json.dumps(a) == json.dumps(b) == '{"a": {"0": 3}, "b": {"2": 5, "10": 1}}'
    assert parse_offsets(json.loads(json.dumps(a))) == {"a": {0: 3}, "b": {2: 5, 10: 1}}


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 5000)), min_size=1, max_size=8),
    st.integers(1, 3000),
)
def test_cap_rows_stays_near_the_limit_and_never_goes_back(
    queues: list[tuple[int, int]], limit: int
) -> None:
    start = {"t": {i: s for i, (s, _) in enumerate(queues)}}
    end = {"t": {i: s + lag for i, (s, lag) in enumerate(queues)}}
    capped = cap_rows(start, end, limit)
    total = sum(end["t"][i] - start["t"][i] for i in start["t"])
    taken = sum(capped["t"][i] - start["t"][i] for i in start["t"])
    assert all(start["t"][i] <= capped["t"][i] <= end["t"][i] for i in start["t"])
    assert taken == total if total <= limit else 0 < taken <= limit + len(queues)


def test_split_ranges_reaches_min_partitions_and_covers_every_offset() -> None:
    ranges = [QueueRange("t", 0, "a", 0, 0, 1000), QueueRange("t", 1, "a", 1, 5, 15)]
    pieces = split_ranges(ranges, 8)
    assert len(pieces) >= 8
    covered = sorted((p.partition, o) for p in pieces for o in range(p.start, p.end))
    assert covered == [(0, o) for o in range(1000)] + [(1, o) for o in range(5, 15)]
    assert split_ranges(ranges, None) == ranges
