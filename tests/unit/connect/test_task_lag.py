"""A task's lag comes from its query's progress: each source's latestOffset minus endOffset."""

import json

from ferrymq.connectors.runtime import lag


def _source(end: object, latest: object) -> dict[str, str]:
    return {"endOffset": json.dumps(end), "latestOffset": json.dumps(latest)}


def test_lag_sums_every_queue_behind_the_last_batch() -> None:
    end = {"orders": {"broker-a": {"0": 10, "1": 7}}}
    latest = {"orders": {"broker-a": {"0": 15, "1": 7}, "broker-b": {"0": 3}}}
    # queue 0 is 5 behind, queue 1 caught up; broker-b's queue is new (no end offset yet)
    assert lag([_source(end, latest)]) == 5
    assert lag([_source(end, latest), _source({"t": 1}, {"t": 4})]) == 8


def test_no_latest_offset_is_no_lag_figure() -> None:
    assert lag([]) is None
    assert lag([{"endOffset": "{}", "latestOffset": None}]) is None
    assert lag([_source({"t": "x"}, {"t": "y"})]) == 0
