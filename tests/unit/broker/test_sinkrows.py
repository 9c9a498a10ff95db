"""A prepared sink row's properties read back without a full decode equal what a full decode
gives (`decode_properties` is the model); other layouts are left to the full decode."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ferrymq.broker.sinkrows import (
    OWN_PROPERTIES,
    Tags,
    encode_tags,
    parse_tags,
    places,
    prepared,
    runs,
    split_row,
    uniq_key,
)
from ferrymq.wire.properties import decode_properties
from ferrymq.wire.records import BatchItem

_NAMES = ["UNIQ_KEY", "XUNIQ_KEY", "KEYS", "a", "", "REAL_TOPIC", "FERRY_SINK", "CRC32", "REAL_QID"]
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x01\x02"), max_size=6)
_item = st.builds(lambda n, v: f"{n}\x01{v}", st.sampled_from(_NAMES), _text) | st.sampled_from(
    ["junk", "UNIQ_KEY\x01a\x01b", "\x01", ""]
)
raw_properties = st.builds(
    lambda items, end: ("\x02".join(items) + ("\x02" if end and items else "")).encode(),
    st.lists(_item, max_size=6),
    st.booleans(),
)
tags = st.builds(Tags, _text, st.integers(-1, 2**40), _text, _text, st.integers(0, 2**31 - 1))


def _stored(properties: bytes, digits: int) -> bytes:
    """The properties as the store keeps them: the CRC32 item appended."""
    return properties + f"CRC32\x01{digits:010d}\x02".encode()


@given(raw_properties, tags, st.integers(0, 2**31 - 1))
def test_a_prepared_row_splits_into_its_own_properties_and_its_tags(
    raw: bytes, row_tags: Tags, digits: int
) -> None:
    stored = _stored(prepared(BatchItem(b"body", raw), encode_tags(row_tags)).properties, digits)
    split = split_row(stored)
    assert split is not None
    own, got = split
    assert got == row_tags
    whole = decode_properties(stored)
    assert decode_properties(own) == {k: v for k, v in whole.items() if k not in OWN_PROPERTIES}
    assert decode_properties(own) == {
        k: v for k, v in decode_properties(raw).items() if k not in OWN_PROPERTIES
    }
    assert uniq_key(own) == whole.get("UNIQ_KEY")


@given(raw_properties)
def test_uniq_key_reads_what_decode_properties_reads(raw: bytes) -> None:
    assert uniq_key(raw) == decode_properties(raw).get("UNIQ_KEY")


def test_other_layouts_are_left_to_the_full_decode() -> None:
    legacy = b"REAL_TOPIC\x01T\x02a\x01b\x02FERRY_SINK\x01s\x02FERRY_SINK_BATCH\x011\x02"
    legacy += b"FERRY_SINK_TXN\x01t\x02REAL_QID\x010\x02"  # a tag overrode a row's own property
    decision = b"FERRY_SINK_OP\x01decide\x02"
    for properties in (legacy, decision, b"", b"XFERRY_SINK\x01s\x02", b"a\x01b\x02"):
        assert split_row(_stored(properties, 7)) is None
    assert parse_tags(b"FERRY_SINK\x01s\x02FERRY_SINK_BATCH\x01x\x02") is None
    good = encode_tags(Tags("s", 3, "t", "T", 1))
    assert parse_tags(good) == Tags("s", 3, "t", "T", 1)
    assert parse_tags(good[:-1]) is None
    assert parse_tags(b"\xff" + good) is None


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 600_000)), max_size=12))
def test_runs_group_back_to_back_rows_and_give_every_row_back(
    steps: list[tuple[int, int]],
) -> None:
    rows: list[tuple[int, int]] = []
    at = 100
    for gap, size in steps:  # a gap of 0: the next row follows the previous one in the log
        at += gap
        rows.append((at, size))
        at += size
    found = list(runs(rows))
    assert [row for start, sizes in found for row in places(start, sizes)] == rows
    for (start, sizes), (after, _) in itertools.pairwise(found):
        assert start + sum(sizes) != after or sum(sizes) >= 1 << 20, "two runs that are one"
