"""`row_reader`'s fast path (msgspec straight into a struct) gives exactly `row_of`'s answer.

Its `copy_text` rows (numbers and timestamps as text) are stored by a real PostgreSQL exactly as
`row_of`'s rows are.

The fast path may only hand a body over to `row_of` or return the row `row_of` returns: the same
values of the same types (Decimal digits, datetime zones, Json wrappers compared by content).
"""

import datetime
import decimal
import json
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Json, Jsonb

from ferrymq.connectors.postgres_columns import parse_fields, row_of, row_reader

from .postgres import Database

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
    "atz": st.sampled_from(
        [
            "2024-05-01T10:00:00.5Z",
            "2024-02-30T10:00:00Z",
            "2024-05-01 23:59:59.999999-03:30",
            "2024-05-01T10:00:00.1234567+02:00",
            "2024-05-01T10:00:00",
            "0001-01-01T00:00:00+00:00",
            1714557600000,
        ]
    ),
    "big": st.sampled_from([1e300, -1e-7, 0.1 + 0.2, -0.0, 10**30, 2.5e-320]),
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


def _stored(conn: psycopg.Connection[Any], table: str, rows: list[tuple[Any, ...]]) -> list[Any]:
    """What PostgreSQL stores from each row by a text COPY (as text), or its error's state."""
    names = ", ".join(c.name for c in COLUMNS)
    declared = ", ".join(f"{c.name} {c.sql_type}" for c in COLUMNS)
    conn.execute(f"CREATE TABLE {table} (ord integer, {declared})")
    stored: list[Any] = []
    for ord_, row in enumerate(rows):
        try:
            with (
                conn.transaction(),
                conn.cursor().copy(f"COPY {table} (ord, {names}) FROM STDIN") as copy,
            ):
                copy.write_row((ord_, *row))
            found = conn.execute(f"SELECT {names} FROM {table} WHERE ord = %s", [ord_]).fetchone()
            stored.append(tuple(None if v is None else str(v) for v in found or ()))
        except psycopg.DataError as exc:
            stored.append(exc.sqlstate)
    conn.execute(f"DROP TABLE {table}")
    return stored


_TEXT_PATH = ("price", "big", "tiny", "at", "atz")
"""The columns whose values `copy_text` keeps as text."""


@st.composite
def fitting_bodies(draw: st.DrawFn) -> bytes:
    """Mostly rows that fit, with numbers and timestamps at the text path's edges."""
    numbers = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**20), 10**20)
    zones = st.sampled_from(
        [
            None,
            datetime.UTC,
            *(datetime.timezone(datetime.timedelta(minutes=m)) for m in (120, -210)),
        ]
    )
    moments = st.datetimes(timezones=zones).map(
        lambda moment: moment.isoformat(sep=" " if moment.microsecond % 2 else "T")
    )
    fields: dict[str, Any] = {"id": draw(st.integers(0, 2**40)), "name": "n"}
    for name in _TEXT_PATH:
        if name in ("at", "atz"):
            fields[name] = draw(moments | _EDGES["atz"] | st.integers(-(2**62), 2**62))
        else:
            fields[name] = draw(_EDGES.get(name, numbers) | numbers)
    return json.dumps(fields).encode()


@pytest.mark.postgres
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=st.lists(bodies() | fitting_bodies(), min_size=20, max_size=60))
def test_copy_text_rows_are_stored_as_row_of_rows_are(
    database: Database, batch: list[bytes | None]
) -> None:
    read = row_reader(COLUMNS, copy_text=True)
    fast_rows: list[tuple[Any, ...]] = []
    slow_rows: list[tuple[Any, ...]] = []
    for body in batch:
        fast, slow = read(body), row_of(COLUMNS, body)
        if isinstance(slow, str):
            assert fast == slow
        else:
            assert isinstance(fast, tuple)
            fast_rows.append(fast)
            slow_rows.append(slow)
    texts = sum(isinstance(v, str) for row in fast_rows for v in (row[5:8] + row[13:15]))
    assert texts > 0 or len(fast_rows) < 5  # the text path is exercised
    with psycopg.connect(database.url, autocommit=True) as conn:
        assert _stored(conn, "fast", fast_rows) == _stored(conn, "slow", slow_rows)
