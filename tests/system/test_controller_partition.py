"""The controller leader partitioned away in a private network namespace, then healed.

The scenario (partition_scenario.py) runs in `unshare --net --pid`: its own loopback, its own
nftables, and every process it starts dies with it. Needs root and nft.
"""

from pathlib import Path

import pytest

from .netns import needs_netns, run_scenario

pytestmark = [pytest.mark.system, needs_netns]


def test_a_partitioned_leader_commits_nothing_and_rejoins_without_disturbing(
    tmp_path: Path,
) -> None:
    outcome = run_scenario("partition_scenario", tmp_path)
    assert outcome["old_leader"] != outcome["new_leader"]
