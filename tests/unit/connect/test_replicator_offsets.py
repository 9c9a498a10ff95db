"""FerrymqReplicator's GET /offsets entries from the coordinator's positions (pure)."""

from ferrymq.connect.records import OffsetEntry
from ferrymq.connectors.replicator import FerrymqReplicator, offset_entries


def test_decided_positions_become_a_patch_body_of_the_connector_s_topics() -> None:
    task0 = {"b": {"broker-b": {"0": 4}, "broker-a": {"10": 7, "2": 1}}, "gone": {"x": {"0": 9}}}
    task1 = {"a": {"broker-a": {"0": 3}}}
    entries = offset_entries([task0, task1], ["a", "b"])
    assert [(e["partition"], e["offset"]) for e in entries] == [
        ({"topic": "a", "broker": "broker-a", "queue": 0}, {"offset": 3}),
        ({"topic": "b", "broker": "broker-a", "queue": 2}, {"offset": 1}),
        ({"topic": "b", "broker": "broker-a", "queue": 10}, {"offset": 7}),
        ({"topic": "b", "broker": "broker-b", "queue": 0}, {"offset": 4}),
    ]
    body = [OffsetEntry(e["partition"], e["offset"]) for e in entries]
    assert FerrymqReplicator().check_offsets({"topics": "a,b"}, body) == []
