"""The PostgreSQL sink's column spec (`fields`) and the mapping of one JSON message body to a row.

A sink's messages are JSON objects; the config's `fields` names the table's columns and their
PostgreSQL types, and each column takes the body's field of the same name (Kafka Connect's JDBC
sink maps a record's fields to columns by name the same way). Grammar, one entry per column,
separated by commas: `name type [not null]`, e.g.
`id bigint not null, name text, amount numeric(12,2), at timestamptz, tags jsonb`.

Rules:
1. Only the types below are accepted, and the SQL that declares a column is rebuilt from the
   matched type (never the config's text), so a spec cannot inject SQL:
   smallint, integer (int), bigint, real, double precision (float8), numeric/decimal[(p[,s])],
   boolean, text, varchar(n) / character varying(n), char(n), date, timestamp,
   timestamptz (timestamp with time zone), json, jsonb, uuid.
2. `row_of(body)` returns either the row (Python values psycopg writes with COPY) or the reason
   the body does not fit: not UTF-8 JSON, not an object, a `not null` or key field missing or
   null, a value of the wrong JSON type, out of the type's range, longer than varchar(n), with
   more digits than numeric(p,s), or an unparsable date. Such a body is malformed: it goes to the
   dead-letter topic or fails the task (`errors.tolerance`), and never reaches COPY, so one bad
   message cannot fail a whole transaction after the fact.
3. Fields of the body that are not columns are ignored; a missing nullable field is NULL.
   Timestamps take ISO 8601 text or epoch milliseconds (Kafka Connect's Timestamp); dates take
   ISO text; json/jsonb take any JSON value.
4. `row_reader(columns)` is `row_of` for one column spec, made once: msgspec decodes a body
   straight into a struct of the columns (type and range checks in C, other fields skipped),
   and only what C cannot do runs in Python (numeric, dates, UUIDs). Whatever that fast path
   does not accept as it is (a NUL escape, non-UTF-8 bytes, a missing NOT NULL field, any
   type or range miss) goes through `row_of`, so the rows and the reasons are `row_of`'s own.
5. `row_reader(columns, copy_text=True)` (the sink's writer, which COPYs in text format) keeps a
   timestamp that is RFC 3339 text (validated by `fromisoformat`) as its text, and a JSON number
   below its numeric column's limit by more than any rounding as `repr(number)`: PostgreSQL
   stores from that text exactly what it stores from `row_of`'s datetime and Decimal
   (tests/connectors/test_sink_rows.py checks it in a real server).
6. `bulk_reader(columns)` (the writer's vectorized path) maps a whole run of bodies at once:
   msgspec decodes them as one JSON array into rule 4's struct (the same checks, in C), Arrow
   arrays are built from the struct's fields, and what rule 4 checks in Python is checked on
   the arrays (numeric limits, RFC 3339 timestamps, dates in the calendar). It takes a run only
   when every body passes as it is and each column's text for a CSV COPY is what rule 5's row
   gives PostgreSQL (the same value); anything else (one malformed body, epoch milliseconds, a
   numeric string, a number near its limit) is None, and the caller maps that run body by body.
   Specs with date, uuid, json/jsonb or unbounded numeric columns have no bulk reader.
"""

from __future__ import annotations

import datetime
import decimal
import functools
import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec
from psycopg.types.json import Json, Jsonb

__all__ = [
    "BulkReader",
    "Column",
    "RowReader",
    "bulk_reader",
    "parse_fields",
    "row_of",
    "row_reader",
]

_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_TYPES: Final = (
    (re.compile(r"smallint|int2"), "smallint"),
    (re.compile(r"integer|int|int4"), "integer"),
    (re.compile(r"bigint|int8"), "bigint"),
    (re.compile(r"real|float4"), "real"),
    (re.compile(r"double precision|float8|float"), "double precision"),
    (re.compile(r"(?:numeric|decimal)(?:\((\d+)(?:,(\d+))?\))?"), "numeric"),
    (re.compile(r"boolean|bool"), "boolean"),
    (re.compile(r"text"), "text"),
    (re.compile(r"(?:varchar|character varying)(?:\((\d+)\))?"), "varchar"),
    (re.compile(r"(?:char|character)(?:\((\d+)\))?"), "char"),
    (re.compile(r"date"), "date"),
    (re.compile(r"timestamp(?: without time zone)?"), "timestamp"),
    (re.compile(r"timestamptz|timestamp with time zone"), "timestamptz"),
    (re.compile(r"json"), "json"),
    (re.compile(r"jsonb"), "jsonb"),
    (re.compile(r"uuid"), "uuid"),
)
_decode: Final = msgspec.json.Decoder().decode
"""msgspec's JSON decoder: the same values as `json.loads`, three times faster."""
_MAX_NUMERIC_DIGITS: Final = 1000
"""numeric(p, s) takes 1 <= p <= 1000."""
_INT_RANGES: Final = {
    "smallint": (-(2**15), 2**15 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its name, its type (as declared in SQL) and whether it may be NULL."""

    name: str
    kind: str
    """The type family: smallint, integer, bigint, real, double precision, numeric, boolean,
    text, varchar, char, date, timestamp, timestamptz, json, jsonb, uuid."""
    not_null: bool = False
    length: int | None = None
    """varchar(n) / char(n): n; numeric(p, s): p."""
    scale: int | None = None
    """numeric(p, s): s."""

    @property
    def sql_type(self) -> str:
        """The type as SQL declares it (rebuilt from the parse, never the config's text)."""
        if self.kind == "numeric" and self.length is not None:
            return f"numeric({self.length},{self.scale or 0})"
        if self.kind in ("varchar", "char") and self.length is not None:
            return f"{self.kind}({self.length})"
        return self.kind


def _split(spec: str) -> list[str]:
    """Entries at parenthesis depth 0 (numeric(12,2) keeps its comma)."""
    entries: list[str] = []
    depth = 0
    current: list[str] = []
    for char in spec:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            entries.append("".join(current))
            current = []
        else:
            current.append(char)
    entries.append("".join(current))
    return [e.strip() for e in entries if e.strip()]


def _column(entry: str) -> Column:
    words = entry.split(None, 1)
    if len(words) != 2:
        raise ValueError(f"fields: {entry!r} needs a name and a type, e.g. 'id bigint'")
    name, rest = words
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"fields: {name!r} is not a column name (letters, digits, _; not starting with a digit)"
        )
    text = " ".join(rest.lower().replace(" (", "(").replace(", ", ",").split())
    not_null = text.endswith(" not null")
    text = text.removesuffix(" not null").removesuffix(" null")
    for pattern, kind in _TYPES:
        match = pattern.fullmatch(text)
        if match is None:
            continue
        length = scale = None
        if kind == "numeric" and match.group(1):
            length = int(match.group(1))
            scale = int(match.group(2) or 0)
            if not 1 <= length <= _MAX_NUMERIC_DIGITS or scale > length:
                raise ValueError(
                    f"fields: {name} {rest}: numeric(p,s) takes 1 <= p <= 1000, s <= p"
                )
        elif kind in ("varchar", "char") and match.group(1):
            length = int(match.group(1))
            if length < 1:
                raise ValueError(f"fields: {name} {rest}: a length of at least 1")
        return Column(name, kind, not_null, length, scale)
    raise ValueError(
        f"fields: {name} has the unsupported type {rest!r}; use smallint, integer, bigint, real, "
        "double precision, numeric(p,s), boolean, text, varchar(n), char(n), date, timestamp, "
        "timestamptz, json, jsonb or uuid"
    )


def parse_fields(spec: str, key_fields: Sequence[str] = ()) -> tuple[Column, ...]:
    """The columns of a `fields` spec; key fields are NOT NULL.

    Raises:
        ValueError: an entry is malformed, a type unsupported, a name repeated, or a key field
            is not a column.
    """
    columns = [_column(entry) for entry in _split(spec)]
    if not columns:
        raise ValueError("fields: name at least one column, e.g. 'id bigint, name text'")
    names = [c.name for c in columns]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"fields: {', '.join(repeated)} named more than once")
    missing = [k for k in key_fields if k not in names]
    if missing:
        raise ValueError(f"pk.fields: {', '.join(missing)} not among the fields")
    return tuple(
        Column(c.name, c.kind, True, c.length, c.scale) if c.name in key_fields else c
        for c in columns
    )


class _MalformedError(ValueError):
    """Why a value does not fit its column."""


def _int(column: Column, value: object) -> int:
    if type(value) is not int:
        raise _MalformedError(f"expected an integer, got {_show(value)}")
    low, high = _INT_RANGES[column.kind]
    if not low <= value <= high:
        raise _MalformedError(f"{value} is out of range for {column.kind}")
    return value


def _float(column: Column, value: object) -> float:
    if type(value) not in (int, float):
        raise _MalformedError(f"expected a number, got {_show(value)}")
    try:
        return float(value)  # type: ignore[arg-type]  # int or float, checked above
    except OverflowError:  # an integer beyond a double's range
        raise _MalformedError(f"{value} is out of range for {column.kind}") from None


@functools.lru_cache(maxsize=256)
def _numeric_limit(length: int, scale: int) -> decimal.Decimal:
    """The largest value of numeric(length, scale): 99.99 for numeric(4, 2), exact."""
    integral = "9" * (length - scale) or "0"
    return decimal.Decimal(f"{integral}.{'9' * scale}" if scale else integral)


def _numeric(column: Column, value: object) -> decimal.Decimal:
    if type(value) in (int, float):
        number = decimal.Decimal(str(value))
    elif isinstance(value, str):
        try:
            number = decimal.Decimal(value.strip())
        except decimal.InvalidOperation:
            raise _MalformedError(f"expected a number, got {_show(value)}") from None
    else:
        raise _MalformedError(f"expected a number, got {_show(value)}")
    if not number.is_finite():
        raise _MalformedError(f"{value} is not a finite number")
    if column.length is not None:
        scale = column.scale or 0
        limit = _numeric_limit(column.length, scale)
        if -limit <= number <= limit:  # rounds to at most `limit`: fits, no rounding needed
            return number
        try:  # PostgreSQL rounds to the scale (half away from zero), then counts digits
            with decimal.localcontext() as context:
                context.prec = 2 * _MAX_NUMERIC_DIGITS
                rounded = number.quantize(decimal.Decimal(1).scaleb(-scale), decimal.ROUND_HALF_UP)
        except decimal.InvalidOperation:
            raise _MalformedError(f"{value} has too many digits for {column.sql_type}") from None
        integral = rounded.adjusted() + 1 if rounded and rounded.adjusted() >= 0 else 0
        if integral > column.length - scale:
            raise _MalformedError(f"{value} has too many digits for {column.sql_type}")
    return number


def _text(column: Column, value: object) -> str:
    if not isinstance(value, str):
        raise _MalformedError(f"expected a string, got {_show(value)}")
    if "\x00" in value:
        raise _MalformedError("a string holds a NUL character, which PostgreSQL text cannot")
    if column.length is not None and len(value) > column.length:
        raise _MalformedError(f"{len(value)} characters, longer than {column.sql_type}")
    return value


def _timestamp(column: Column, value: object) -> datetime.datetime:
    aware = column.kind == "timestamptz"
    if type(value) is int:
        try:
            moment = datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
        except (ValueError, OverflowError, OSError):  # beyond years 1..9999
            raise _MalformedError(f"{value} ms is out of range for {column.kind}") from None
        return moment if aware else moment.replace(tzinfo=None)
    if not isinstance(value, str):
        raise _MalformedError(f"expected ISO 8601 text or epoch milliseconds, got {_show(value)}")
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise _MalformedError(f"{_show(value)} is not an ISO 8601 timestamp") from None
    return moment


_ISO_TIMESTAMP: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?"
    r"(?:Z|[+-][0-9]{2}:[0-9]{2})?"
)
"""The RFC 3339 timestamps PostgreSQL reads exactly as `str(datetime.fromisoformat(text))`."""


def _timestamp_text(column: Column) -> Callable[[Column, Any], Any]:
    """`_timestamp` for a text COPY: RFC 3339 text itself once valid (no datetime to format)."""
    match, parse = _ISO_TIMESTAMP.fullmatch, datetime.datetime.fromisoformat

    def convert(column: Column, value: Any) -> str | datetime.datetime:
        if type(value) is str and match(value):
            try:
                parse(value)
            except ValueError:
                raise _MalformedError(f"{_show(value)} is not an ISO 8601 timestamp") from None
            return value
        return _timestamp(column, value)

    return convert


def _numeric_text(column: Column) -> Callable[[Column, Any], Any]:
    """`_numeric` for a text COPY: a JSON int or finite float's own digits when it surely fits.

    Below 10**(p - s - 1) a number fits numeric(p, s) whatever the rounding to s digits;
    PostgreSQL reads `repr(float)` (`1e-07` too) as it reads `Decimal(str(float))`. Anything
    else (strings, numbers near the limit, non-finite) takes `_numeric`.
    """
    digits = _MAX_NUMERIC_DIGITS if column.length is None else column.length - (column.scale or 0)
    bound = 10 ** (digits - 1) if digits >= 1 else 0

    def convert(column: Column, value: Any) -> str | decimal.Decimal:
        kind = type(value)
        if (kind is float or kind is int) and -bound < value < bound:
            return repr(value)
        return _numeric(column, value)

    return convert


def _date(column: Column, value: object) -> datetime.date:
    if not isinstance(value, str):
        raise _MalformedError(f"expected an ISO 8601 date, got {_show(value)}")
    try:
        return datetime.date.fromisoformat(value)
    except ValueError:
        raise _MalformedError(f"{_show(value)} is not an ISO 8601 date") from None


def _boolean(column: Column, value: object) -> bool:
    if type(value) is not bool:
        raise _MalformedError(f"expected true or false, got {_show(value)}")
    return value


def _uuid(column: Column, value: object) -> uuid.UUID:
    try:
        return uuid.UUID(str(value)) if isinstance(value, str) else _no_uuid(value)
    except ValueError:
        raise _MalformedError(f"{_show(value)} is not a UUID") from None


def _no_uuid(value: object) -> uuid.UUID:
    raise _MalformedError(f"expected a UUID string, got {_show(value)}")


def _json(column: Column, value: object) -> Any:
    return Jsonb(value) if column.kind == "jsonb" else Json(value)


_CONVERT: Final = {
    "smallint": _int,
    "integer": _int,
    "bigint": _int,
    "real": _float,
    "double precision": _float,
    "numeric": _numeric,
    "boolean": _boolean,
    "text": _text,
    "varchar": _text,
    "char": _text,
    "date": _date,
    "timestamp": _timestamp,
    "timestamptz": _timestamp,
    "json": _json,
    "jsonb": _json,
    "uuid": _uuid,
}


def _show(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def row_of(columns: Sequence[Column], body: bytes | None) -> tuple[Any, ...] | str:
    """The row a message body gives, or the reason it is malformed."""
    if body is None:
        return "the message has no body (null value)"
    try:
        document = _decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # bad UTF-8 in a string: the latter
        try:
            body.decode()
        except UnicodeDecodeError:
            return "the body is not UTF-8 text"
        return f"the body is not JSON: {exc}"
    if not isinstance(document, dict):
        return f"the body is JSON but not an object: {_show(document)}"
    row: list[Any] = []
    for column in columns:
        value = document.get(column.name)
        if value is None:
            if column.not_null:
                return f"field {column.name}: missing or null, but the column is NOT NULL"
            row.append(None)
            continue
        try:
            row.append(_CONVERT[column.kind](column, value))
        except _MalformedError as exc:
            return f"field {column.name} ({column.sql_type}): {exc}"
    return tuple(row)


RowReader = Callable[[bytes | None], tuple[Any, ...] | str]
"""`row_of` bound to one column spec: a body's row, or the reason it is malformed."""

_POST: Final[dict[str, Callable[[Column, Any], Any]]] = {
    "numeric": _numeric,
    "date": _date,
    "timestamp": _timestamp,
    "timestamptz": _timestamp,
    "uuid": _uuid,
    "json": _json,
    "jsonb": _json,
}
"""Conversions the fast path leaves to Python, on values of the types `_fast_type` accepts."""
_POST_TEXT: Final[dict[str, Callable[[Column], Callable[[Column, Any], Any]]]] = {
    "numeric": _numeric_text,
    "timestamp": _timestamp_text,
    "timestamptz": _timestamp_text,
}
"""For `copy_text` readers, per column kind: the converter of one column (its limits bound
once) giving numbers and timestamps as the text PostgreSQL reads."""


def _fast_type(column: Column) -> Any:
    """The msgspec type of a column's values in the fast path.

    It accepts exactly the values `row_of` takes as they are, or more only where `_POST` checks
    them (with `row_of`'s own converter).
    """
    kind = column.kind
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        return Annotated[int, msgspec.Meta(ge=low, le=high)]
    if kind in ("real", "double precision"):
        return int | float  # converted by _float: JSON ints too, as `row_of` does
    if kind == "numeric":
        return int | float | str
    if kind == "boolean":
        return bool
    if kind in ("text", "varchar", "char"):
        if column.length is not None:
            return Annotated[str, msgspec.Meta(max_length=column.length)]
        return str
    if kind in ("timestamp", "timestamptz"):
        return int | str
    if kind in ("date", "uuid"):
        return str
    return Any  # json, jsonb: any JSON value


@functools.lru_cache(maxsize=64)
def _row_struct(columns: tuple[Column, ...]) -> type[msgspec.Struct]:
    """The struct the fast paths decode a body into: field `f<i>` is column i (`_fast_type`)."""
    fields = [(f"f{i}", _fast_type(c) | None, None) for i, c in enumerate(columns)]
    names = {f"f{i}": c.name for i, c in enumerate(columns)}
    return msgspec.defstruct("Row", fields, rename=names, gc=False)  # decoded JSON has no cycles


@functools.lru_cache(maxsize=64)
def row_reader(columns: tuple[Column, ...], *, copy_text: bool = False) -> RowReader:
    """`row_of(columns, body)` as one function, with the fast path of rule 4.

    `copy_text`: rows for a text-format COPY only. The fast path hands numeric and timestamp
    values over as text (rule 5) instead of Decimal and datetime, which cost more to make and
    to format again than the rest of the row.
    """
    decode = msgspec.json.Decoder(_row_struct(columns)).decode
    astuple = msgspec.structs.astuple
    required = tuple(i for i, c in enumerate(columns) if c.not_null)
    floats = tuple(i for i, c in enumerate(columns) if c.kind in ("real", "double precision"))
    post = tuple(
        (i, c, _POST_TEXT[c.kind](c) if copy_text and c.kind in _POST_TEXT else _POST[c.kind])
        for i, c in enumerate(columns)
        if c.kind in _POST
    )
    slow = functools.partial(row_of, columns)

    def read(body: bytes | None) -> tuple[Any, ...] | str:
        # NUL escapes (text refuses them) and non-UTF-8 bytes (the struct decoder skips unknown
        # fields without checking them) take row_of's path
        if body is None or b"\\u0000" in body or not (body.isascii() or _is_utf8(body)):
            return slow(body)
        try:
            values = astuple(decode(body))
        except (msgspec.DecodeError, UnicodeDecodeError):
            return slow(body)
        for i in required:
            if values[i] is None:
                return slow(body)
        if not post and not floats:
            return tuple(values)
        row = list(values)
        try:
            for i in floats:
                if row[i] is not None:
                    row[i] = float(row[i])
            for i, column, convert in post:
                value = row[i]
                if value is not None:
                    row[i] = convert(column, value)
        except (_MalformedError, OverflowError):
            return slow(body)
        return tuple(row)

    return read


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode()
    except UnicodeDecodeError:
        return False
    return True


BulkReader = Callable[[Sequence[bytes | None]], Any]
"""`bulk_reader` bound to one column spec: the bodies' rows as a `pyarrow.Table` (a column per
spec column, in order), or None when the run must be mapped body by body."""

_BULK_KINDS: Final = frozenset(
    {*_INT_RANGES, "real", "double precision", "numeric", "boolean", "text", "varchar", "char"}
    | {"timestamp", "timestamptz"}
)
_RFC3339: Final = (
    r"^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[T ]([01][0-9]|2[0-3]):[0-5][0-9]:"
    r"[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?$"
)
"""Timestamps the bulk path takes: `_ISO_TIMESTAMP`'s text with every field in its range, so
that `fromisoformat` accepts it once its date is in the calendar and its year is not 0."""
_EXACT_DOUBLE: Final = 2**53
"""Integers below this are exact as doubles (and so is the text Arrow writes for them)."""


def bulk_reader(columns: tuple[Column, ...]) -> BulkReader | None:
    """The vectorized `row_reader(columns, copy_text=True)` of rule 6 (None: no bulk path)."""
    if not all(c.kind in _BULK_KINDS for c in columns):
        return None
    if any(c.kind == "numeric" and c.length is None for c in columns):
        return None  # unbounded numeric keeps a number's own scale ("5" vs "5.0"): row by row
    import operator

    import pyarrow as pa
    import pyarrow.compute as pc

    row_type: Any = _row_struct(columns)
    decode = msgspec.json.Decoder(list[row_type]).decode
    getters = [operator.attrgetter(f"f{i}") for i in range(len(columns))]
    required = [c.not_null for c in columns]

    def limit(column: Column) -> float:
        digits = (column.length or 0) - (column.scale or 0)
        return min(10 ** (digits - 1), _EXACT_DOUBLE) if digits >= 1 else 0

    def array(column: Column, values: list[Any]) -> Any:
        kind = column.kind
        if kind in _INT_RANGES:  # ranges checked by the struct
            return pa.array(values, pa.int64())
        if kind in ("real", "double precision"):  # ints beyond 2**53 raise: row by row
            return pa.array(values, pa.float64())
        if kind == "numeric":  # a numeric string raises; a number near the limit returns None
            numbers = pa.array(values, pa.float64())
            inside = pc.all(pc.less(pc.abs(numbers), limit(column))).as_py()
            return numbers if inside in (True, None) else None
        if kind == "boolean":
            return pa.array(values, pa.bool_())
        texts = pa.array(values, pa.string())  # epoch milliseconds raise
        if kind in ("timestamp", "timestamptz") and texts.null_count < len(texts):
            if not pc.all(pc.match_substring_regex(texts, pattern=_RFC3339)).as_py():
                return None
            if pc.any(pc.starts_with(texts, pattern="0000")).as_py():
                return None
            pc.cast(pc.utf8_slice_codeunits(texts, 0, 10), pa.date32())  # Feb 30 raises
        return texts

    def read(bodies: Sequence[bytes | None]) -> Any:
        try:
            joined = b"[" + b",".join(bodies) + b"]"  # type: ignore[arg-type]  # None: TypeError
        except TypeError:
            return None
        if b"\\u0000" in joined or not (joined.isascii() or _is_utf8(joined)):
            return None
        try:
            rows = decode(joined)
        except msgspec.DecodeError:
            return None
        if len(rows) != len(bodies):  # a body of several values, e.g. '{...},{...}'
            return None
        arrays = []
        for column, get, not_null in zip(columns, getters, required, strict=True):
            try:
                made = array(column, list(map(get, rows)))
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                return None
            if made is None or (not_null and made.null_count):
                return None
            arrays.append(made)
        return pa.Table.from_arrays(arrays, names=[c.name for c in columns])

    return read
