"""A master partitioned away from the controllers and its slaves (issue 7), in a private network
namespace: it stops taking writes within its lease, a new master takes over, nothing acknowledged
is lost, and after healing it rejoins as a slave. Needs root, nft and unshare."""

from pathlib import Path

import pytest

from .netns import needs_netns, run_scenario

pytestmark = [pytest.mark.system, needs_netns]


def test_a_partitioned_master_stops_within_its_lease_and_rejoins_as_a_slave(
    tmp_path: Path,
) -> None:
    outcome = run_scenario("master_partition_scenario", tmp_path)
    assert outcome["old_master"] != outcome["new_master"]
    assert isinstance(outcome["acknowledged"], int)
    assert outcome["acknowledged"] > 0
