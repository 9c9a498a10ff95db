"""A full disk between a record's append and its consume-queue entry leaves no hole in the queue.

Needs root for the private mount namespace and its tmpfs (`disk_full_scenario.py`).
"""

from pathlib import Path

import pytest

from .netns import needs_netns, run_scenario

pytestmark = [pytest.mark.system, needs_netns]


def test_a_full_disk_holds_unindexed_records_and_indexes_them_once_space_returns(
    tmp_path: Path,
) -> None:
    outcome = run_scenario("disk_full_scenario", tmp_path, timeout=60)
    assert outcome["appended_while_full"] == [204, 205, 206]
    assert outcome["dispatch_raised"] is None, "a failed index write reached the caller"
    assert "No space left on device" in str(outcome["dispatch_error"])
    # while full: the indexed records stay readable, the held ones are not served yet
    assert outcome["read_while_full"] == [[q, f"m{q}"] for q in range(200, 204)]
    assert outcome["dispatch_error_after"] is None
    every = [[q, f"m{q}"] for q in range(200, 208)]
    assert outcome["read_after"] == every, "a queue skipped or lost a stored message"
    assert outcome["read_after_restart"] == every
