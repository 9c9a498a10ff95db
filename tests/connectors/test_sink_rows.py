"""`row_reader`'s fast path (msgspec straight into a struct) gives exactly `row_of`'s answer.

The fast path may only hand a body over to `row_of` or return the row `row_of` returns: the same
values of the same types (Decimal digits, datetime zones, Json wrappers compared by content).
"""

import datetime
import decimal
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.types.json import Json, Jsonb

from ferrymq.connectors.postgres_columns import parse_fields, row_of, row_reader

COLUMNS = parse_fields(
    "id bigint not null, small smallint, n integer, r real, d double precision, "
    "price numeric(5,2), big numeric, tiny numeric(2,2), ok boolean, name text not null, "
    "code varchar(3), c char(2), day date, at timestamp, atz timestamptz, doc json, "
    "docb jsonb, ref uuid"
)
NAMES = [c.name for c in COLUMNS]

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**15, -(2**15) - 1, 2**31, 2**63 - 1, 2**63, 999, 1000, 10**400])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([999.994, 999.995, -999.995, 0.995, 0.994, 1e300, 123.45, 1e-7])
    | st.text(max_size=5)
    | st.sampled_from(
        [
            "12.5",
            " 7 ",
            "1e3",
            "NaN",
            "abc\x00",
            "\U0001f600\U0001f600",
            "2024-05-01",
            "20240501",
            "2024-05-01T10:00:00",
            "2024-05-01T10:00:00.1234567+02:00",
            "2024-05-01 10:00:00Z",
            "12345678-1234-5678-1234-567812345678",
            "{12345678-1234-5678-1234-567812345678}",
        ]
    )
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=5,
)


_EDGES: dict[
    str, st.SearchStrategy[Any]
] = {  # values at each column's edge, drawn for a random subset of the columns
    "small": st.sampled_from([2**15 - 1, 2**15, -(2**15), -(2**15) - 1, True]),
    "r": st.sampled_from([3, 1.5, 10**400, "1"]),
    "price": st.sampled_from([999.99, 999.994, 999.995, -999.995, "999.994 ", 1000, "1e2"]),
    "tiny": st.sampled_from([0.994, 0.995, -0.99, 1, "0.5"]),
    "code": st.sampled_from(["abc", "abcd", "\U0001f600" * 3, "\U0001f600" * 4]),
    "c": st.sampled_from(["ab", "abc", ""]),
    "day": st.sampled_from(["2024-05-01", "2024-W18-3", 20240501]),
    "at": st.sampled_from([1714557600000, "2024-05-01T10:00:00+02:00", 1.5, True]),
    "ref": st.sampled_from(["12345678-1234-5678-1234-567812345678", "x", 7]),
    "doc": _VALUES,
}


@st.composite
def bodies(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.none() | st.binary(max_size=40))
    fields = draw(st.dictionaries(st.sampled_from([*NAMES, "extra"]), _VALUES, max_size=8))
    if kind < 7:  # mostly rows that fit, so the fast path's own answers are compared too
        for name in draw(st.lists(st.sampled_from(sorted(_EDGES)), max_size=4, unique=True)):
            fields[name] = draw(_EDGES[name])
        fields.setdefault("id", draw(st.integers(-(2**63), 2**63 - 1)))
        fields.setdefault("name", draw(st.sampled_from(["a", "a\x00", "\U0001f600"]) | st.text()))
    text = json.dumps(fields, ensure_ascii=draw(st.booleans()))
    if kind == 8 and text != "{}":  # a repeated key (the last one counts) or bad UTF-8
        extra = draw(st.sampled_from(['"id": 5', '"id": "x"', '"name": null', '"extra": "\xff"']))
        text = text[:-1] + ", " + extra + "}"
        return text.encode("latin-1") if "\xff" in extra and text.isascii() else text.encode()
    return text.encode()


def _same(value: Any) -> Any:
    """A value with its type and exact form: Decimal digits, datetime zone, Json content."""
    if isinstance(value, Json | Jsonb):
        return (type(value).__name__, json.dumps(value.obj, sort_keys=True))
    if isinstance(value, decimal.Decimal | float | datetime.date):
        return (type(value).__name__, repr(value))
    return (type(value).__name__, value)


@settings(max_examples=400, deadline=None)
@given(body=bodies())
def test_the_fast_path_returns_what_row_of_returns(body: bytes | None) -> None:
    fast, slow = row_reader(COLUMNS)(body), row_of(COLUMNS, body)
    if isinstance(slow, str):
        assert fast == slow
    else:
        assert isinstance(fast, tuple)
        assert [_same(v) for v in fast] == [_same(v) for v in slow]


def test_bad_utf_8_inside_a_string_is_malformed_not_a_crash() -> None:
    body = b'{"id": 1, "name": "a", "extra": "\xff"}'
    assert row_of(COLUMNS, body) == row_reader(COLUMNS)(body) == "the body is not UTF-8 text"
