"""The source's pure offset arithmetic: queue names, stable partitions, JSON, limits, splits."""

import itertools
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.spark.plan import (
    EARLIEST,
    LegacyOffsets,
    LegacyOffsetsError,
    PartitionCollisionError,
    QueueKey,
    QueueRange,
    cap_rows,
    check_group_codes,
    group_code,
    highs,
    is_stable_partition,
    legacy_topics,
    next_offsets,
    offsets_json,
    parse_offsets,
    partition_queue,
    plan_ranges,
    split_ranges,
    stable_partition,
)

pytestmark = pytest.mark.spark

A0, A1, B0 = QueueKey("broker-a", 0), QueueKey("broker-a", 1), QueueKey("broker-b", 0)
_names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20)


def colliding_names() -> tuple[str, str]:
    """Two broker names with one group code (found by search: 2**21-1 codes, birthday bound)."""
    seen: dict[int, str] = {}
    for i in itertools.count():
        name = f"g{i}"
        code = group_code(name)
        if code in seen:
            return seen[code], name
        seen[code] = name
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- stable partition numbers


@given(_names, st.integers(0, 1023))
def test_a_stable_partition_is_a_non_negative_int32_of_1024_or_more_that_names_its_queue(
    broker: str, queue_id: int
) -> None:
    partition = stable_partition(broker, queue_id)
    assert 1024 <= partition < 2**31
    assert is_stable_partition(partition)
    assert 1 <= group_code(broker) < 2**21
    assert partition_queue(partition) == (group_code(broker), queue_id)
    assert stable_partition(broker, queue_id) == partition  # a pure function of the name


@given(_names, st.integers(0, 1023), st.integers(0, 1023))
def test_queues_of_one_group_have_distinct_partitions(broker: str, a: int, b: int) -> None:
    assert (stable_partition(broker, a) == stable_partition(broker, b)) == (a == b)


def test_stable_partitions_are_fixed_numbers_positions_are_not() -> None:
    # what users put in their JSON and sinks: the numbers must never change between releases
    assert group_code("broker-a") == 653603
    assert stable_partition("broker-a", 4) == 669289476
    assert not is_stable_partition(1023)
    assert not is_stable_partition(2**31)
    with pytest.raises(ValueError, match="queue id 1024"):
        stable_partition("broker-a", 1024)
    with pytest.raises(ValueError, match="not a stable partition"):
        partition_queue(7)


def test_two_groups_with_one_code_fail_the_plan_naming_both() -> None:
    first, second = sorted(colliding_names())
    check_group_codes("T", [first, "broker-a"])
    with pytest.raises(PartitionCollisionError, match=f"{first!r} and {second!r}"):
        check_group_codes("T", [second, first, "broker-a"])
    end = {"T": {QueueKey(first, 0): 5, QueueKey(second, 0): 5}}
    with pytest.raises(PartitionCollisionError, match="rename one group"):
        plan_ranges({"T": {}}, end, from_earliest=True)


# ---------------------------------------------------------------- offsets JSON


def test_offsets_json_is_one_text_whatever_the_insertion_order() -> None:
    a = offsets_json(
        {"b": {QueueKey("x", 10): 1, QueueKey("x", 2): 5}, "a": {B0: 7, A1: 5, A0: 12}}
    )
    b = offsets_json(
        {"a": {A0: 12, A1: 5, B0: 7}, "b": {QueueKey("x", 2): 5, QueueKey("x", 10): 1}}
    )
    text = (
        '{"a": {"broker-a": {"0": 12, "1": 5}, "broker-b": {"0": 7}}, '
        '"b": {"x": {"2": 5, "10": 1}}}'
    )
    assert json.dumps(a) == json.dumps(b) == text
    assert parse_offsets(json.loads(text)) == {
        "a": {A0: 12, A1: 5, B0: 7},
        "b": {QueueKey("x", 2): 5, QueueKey("x", 10): 1},
    }


@given(
    st.dictionaries(
        st.sampled_from(["T", "U", "a"]),
        st.dictionaries(
            st.builds(
                QueueKey,
                st.sampled_from(["broker-a", "broker-b", "b10", "b9"]),
                st.integers(0, 1023),
            ),
            st.integers(0, 2**62),
        ),
    ),
    st.randoms(use_true_random=False),
)
def test_offsets_json_round_trips_and_never_depends_on_order(
    offsets: dict[str, dict[QueueKey, int]], rnd: random.Random
) -> None:
    shuffled: dict[str, dict[QueueKey, int]] = {}
    for topic in rnd.sample(list(offsets), len(offsets)):
        keys = rnd.sample(list(offsets[topic]), len(offsets[topic]))
        shuffled[topic] = {k: offsets[topic][k] for k in keys}
    text = json.dumps(offsets_json(offsets))
    assert json.dumps(offsets_json(shuffled)) == text
    assert parse_offsets(json.loads(text)) == offsets


# ---------------------------------------------------------------- old checkpoints


def test_an_old_checkpoint_of_a_one_group_topic_is_read_as_that_group_s_queues() -> None:
    old = {"T": {"0": 10, "1": 11, "2": 12}, "U": {"broker-a": {"0": 3}}}
    assert legacy_topics(old) == ["T"]
    route = {"T": [QueueKey("broker-b", i) for i in range(3)]}
    assert parse_offsets(old, route) == {
        "T": {QueueKey("broker-b", i): 10 + i for i in range(3)},
        "U": {A0: 3},
    }


@pytest.mark.parametrize(
    ("old", "route", "why"),
    [
        (
            {"0": 1, "1": 2},
            [A0, B0],
            r"current route has 2 broker groups \(broker-a, broker-b\), and a position does not",
        ),
        (
            {"0": 1, "1": 2},
            [QueueKey("broker-a", i) for i in range(4)],
            r"old partitions 0..1 are not exactly the queue ids of broker-a now \(0..3\)",
        ),
        ({"0": 1}, [], "the topic has no route now"),
    ],
)
def test_an_old_checkpoint_that_does_not_map_safely_is_refused_with_what_to_do(
    old: dict[str, int], route: list[QueueKey], why: str
) -> None:
    with pytest.raises(LegacyOffsetsError, match=why) as refused:
        parse_offsets({"T": old}, {"T": route})
    message = str(refused.value)
    assert "topic T in the old positional layout" in message
    assert '{"0": 1' in message
    assert 'explicit startingOffsets in the new form ({"T": {"broker-a": {"0": 12}}})' in message
    assert "legacyOffsets=currentRoute" in message


def test_legacy_offsets_current_route_maps_positions_by_the_route_now() -> None:
    old = {"T": {"0": 10, "1": 11, "2": 12}}
    route = {"T": [B0, A1, A0]}  # in any order: positions follow (broker name, queue id)
    mapped = parse_offsets(old, route, LegacyOffsets.CURRENT_ROUTE)
    assert mapped == {"T": {A0: 10, A1: 11, B0: 12}}
    with pytest.raises(LegacyOffsetsError, match="position 2 is not one"):
        parse_offsets(old, {"T": [A0, B0]}, LegacyOffsets.CURRENT_ROUTE)


def test_offsets_of_neither_shape_are_an_error() -> None:
    with pytest.raises(ValueError, match="not integers"):
        parse_offsets({"T": {"broker-a": {"x": 1}}})
    with pytest.raises(ValueError, match="not an object"):
        parse_offsets({"T": [1]})


# ---------------------------------------------------------------- planning


def test_ranges_come_from_the_offsets_alone_and_never_drop_a_queue() -> None:
    start = {"T": {A0: 5, A1: 9, B0: 0}}
    end = {"T": {A0: 8, A1: 9, B0: 4, QueueKey("broker-c", 0): 7}}
    ranges = plan_ranges(start, end, from_earliest=False)
    assert [(r.key, r.start, r.end) for r in ranges] == [(A0, 5, 8), (B0, 0, 4)]
    assert all(r.partition == stable_partition(r.broker_name, r.queue_id) for r in ranges)
    # a queue of the end missing from the start (batch 0 replayed against a new initialOffset)
    # is read from the queue's min offset when the read starts at earliest
    joined = plan_ranges(start, end, from_earliest=True)
    assert [(r.key, r.start, r.end) for r in joined][-1] == (QueueKey("broker-c", 0), EARLIEST, 7)


def test_next_offsets_keep_absent_queues_and_add_new_ones_at_their_min_offset() -> None:
    start = {"T": {A0: 5, B0: 3}}
    bounds = {"T": {A0: (0, 9), A1: (2, 6)}}  # broker-b left the route; broker-a grew
    end, joined = next_offsets(start, bounds, None)
    assert end == {"T": {A0: 9, B0: 3, A1: 2}}
    assert joined == [("T", A1, 2)]
    target = highs({"T": {A0: (0, 7), B0: (0, 3)}})
    assert next_offsets(start, bounds, target)[0] == {"T": {A0: 7, B0: 3, A1: 2}}


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 5000)), min_size=1, max_size=8),
    st.integers(1, 3000),
)
def test_cap_rows_stays_near_the_limit_and_never_goes_back(
    queues: list[tuple[int, int]], limit: int
) -> None:
    start = {"t": {QueueKey("a", i): s for i, (s, _) in enumerate(queues)}}
    end = {"t": {QueueKey("a", i): s + lag for i, (s, lag) in enumerate(queues)}}
    capped = cap_rows(start, end, limit)
    keys = list(start["t"])
    total = sum(end["t"][k] - start["t"][k] for k in keys)
    taken = sum(capped["t"][k] - start["t"][k] for k in keys)
    assert all(start["t"][k] <= capped["t"][k] <= end["t"][k] for k in keys)
    assert taken == total if total <= limit else 0 < taken <= limit + len(queues)


def test_cap_rows_leaves_joining_queues_where_they_join() -> None:
    capped = cap_rows({"t": {A0: 0}}, {"t": {A0: 100, A1: 40}}, 10)
    assert capped == {"t": {A0: 10, A1: 40}}


def test_split_ranges_reaches_min_partitions_and_covers_every_offset() -> None:
    ranges = [QueueRange("t", 1024, "a", 0, 0, 1000), QueueRange("t", 1025, "a", 1, 5, 15)]
    pieces = split_ranges(ranges, 8)
    assert len(pieces) >= 8
    covered = sorted((p.partition, o) for p in pieces for o in range(p.start, p.end))
    assert covered == [(1024, o) for o in range(1000)] + [(1025, o) for o in range(5, 15)]
    assert split_ranges(ranges, None) == ranges
    early = QueueRange("t", 1026, "a", 2, EARLIEST, 50)
    assert split_ranges([early], 8) == [early]  # its start is known only when it is read
