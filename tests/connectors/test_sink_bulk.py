"""The sink writer's bulk path (rule 7 of postgres_sink) stores exactly what the row path stores.

The same messages go through `write_task` twice into a real PostgreSQL, once with every queue run
mapped in bulk where it can be and once body by body, into two tables, whose contents (as text),
written/skipped/dead counts and stored offsets are compared; insert and upsert modes.
"""

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ferrymq.connect.plugin import TaskContext
from ferrymq.connectors.postgres_columns import bulk_reader, parse_fields
from ferrymq.connectors.postgres_sink import (
    SinkCommit,
    create_offsets_tables,
    sink_spec,
    write_task,
)

from .conftest import stored_offsets
from .postgres import PASSWORD, Database

pytestmark = [pytest.mark.postgres]

FIELDS = (
    "id bigint not null, small smallint, n integer, r real, d double precision, "
    "price numeric(7,2), ok boolean, name text, code varchar(5), c char(3), at timestamp, "
    "atz timestamptz"
)
_TEXTS = [
    "",
    "plain",
    'a "quoted", comma',
    "line\nbreak\r\nand\ttab",
    "back\\slash \\N \\. end",
    "\\.",
    "x\n\\.\ny",
    "NULL",
    "é\u00e9 \U0001f600 ß",
    " lead and trail ",
]
_MOMENTS = [
    "2024-05-01T10:00:00Z",
    "2024-05-01 10:00:00.5+02:00",
    "2024-02-29T23:59:59.999999-03:30",
    "0001-01-01T00:00:00+00:00",
    "2024-12-31T00:00:00.123",
    "2024-06-30T12:34:56",
]


def _clean(i: int, rng: random.Random) -> dict[str, Any]:
    """A body every column takes as it is (the bulk path's own case), with fields left out."""
    body: dict[str, Any] = {
        "id": i,
        "small": rng.choice([-(2**15), 2**15 - 1, 0, 7]),
        "n": rng.choice([-(2**31), 2**31 - 1, 42]),
        "r": rng.choice([0.1, 1.5, 3, -2.5e-30, 123456.789, 2**24 + 1]),
        "d": rng.choice([0.1 + 0.2, 1e-300, 5, -0.0, 2**52 + 1, 1e300]),
        "price": rng.choice([0.005, 0.015, 1234.56, -9999.994, 3, 0.125, 1e-7, -0.0]),
        "ok": rng.choice([True, False]),
        "name": rng.choice(_TEXTS),
        "code": rng.choice(["", "abcde", "\U0001f600" * 5, "a,b"]),
        "c": rng.choice(["", "ab", "abc"]),
        "at": rng.choice(_MOMENTS),
        "atz": rng.choice(_MOMENTS),
        "extra": rng.choice([1, "x", [1, {"y": None}], None]),
    }
    for name in rng.sample(sorted(body), 3):  # missing fields, and explicit nulls
        if name != "id":
            if rng.random() < 0.5:
                del body[name]
            else:
                body[name] = None
    return body


_ROW_PATH_ONLY: list[
    dict[str, Any]
] = [  # valid bodies the bulk path does not vouch for: the run goes row by row
    {"at": 1714557600000},
    {"price": "12.5"},
    {"price": 99999.99},
    {"d": 2**60},
    {"atz": "2024-05-01T10:00:00.1234567+02:00"},
]


def _batch(
    topic: str, bodies: Sequence[bytes | None], first: int, queue: int = 0
) -> pa.RecordBatch:
    count = len(bodies)
    return pa.RecordBatch.from_pydict(
        {
            "topic": [topic] * count,
            "brokerName": ["broker-a"] * count,
            "queueId": pa.array([queue] * count, pa.int32()),
            "offset": pa.array(range(first, first + count), pa.int64()),
            "key": pa.array([None] * count, pa.binary()),
            "value": pa.array(bodies, pa.binary()),
        }
    )


def _encode(body: dict[str, Any], rng: random.Random) -> bytes:
    return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()


def _write_both(
    database: Database, tmp_path: Path, mode: dict[str, str], runs: list[list[pa.RecordBatch]]
) -> None:
    """Each list of batches is one writer task; the same tasks through both paths, compared."""
    results: dict[str, list[SinkCommit]] = {}
    for path, bulk_rows in (("bulk", 1), ("rows", 0)):
        config = {
            "name": f"sink-{path}",
            "connector.class": "PostgresSink",
            "topics": "T",
            **database.config,
            "fields": FIELDS,
            "auto.create": "true",
            "table.name.format": f"{path}_${{topic}}",
            "errors.tolerance": "all",  # no dead-letter topic: malformed bodies are skipped
            "batch.size": "50",
            **mode,
        }
        context = TaskContext(config["name"], "inc-1", 0, 1, "tests", "127.0.0.1:9", str(tmp_path))
        spec = sink_spec(config, context)
        with spec.target.with_password(PASSWORD).connect("tests", autocommit=True) as conn:
            create_offsets_tables(conn)
        results[path] = [
            write_task(spec, PASSWORD, iter(batches), bulk_rows=bulk_rows) for batches in runs
        ]
    assert results["bulk"] == results["rows"]
    assert stored_offsets(database, "sink-bulk") == stored_offsets(database, "sink-rows")
    names = [entry.split()[0] for entry in FIELDS.split(", ")]
    listed = ", ".join(f"{n}::text" for n in names)
    bulk = database.query(f'SELECT {listed} FROM "bulk_T" ORDER BY id')
    rows = database.query(f'SELECT {listed} FROM "rows_T" ORDER BY id')
    assert bulk == rows
    assert len(bulk) > 100


def test_insert_mode_stores_the_same_rows_both_ways(database: Database, tmp_path: Path) -> None:
    rng = random.Random(19)
    clean = [_encode(_clean(i, rng), rng) for i in range(300)]
    reader = bulk_reader(parse_fields(FIELDS))
    assert reader is not None
    assert reader(clean) is not None  # the bulk path takes this run
    odd = [_encode({"id": 1000 + i, **extra}, rng) for i, extra in enumerate(_ROW_PATH_ONLY)]
    malformed: list[bytes | None] = [b"not json", b'{"id": "x"}', b'{"name": "no id"}', None]
    for body in odd + [b for b in malformed if b is not None]:  # each one alone is refused
        assert reader([*clean[:5], body]) is None
    assert reader([b'{"id": 1},{"id": 2}', b'{"id": 3}']) is None  # two values in one body
    mixed: list[bytes | None] = list(clean[100:200])
    mixed[10:10] = odd
    mixed[50:50] = malformed
    _write_both(
        database,
        tmp_path,
        {},
        [
            [_batch("T", clean[:100], 0), _batch("T", clean[200:], 0, queue=1)],
            [_batch("T", mixed, 100)],
            # a replay of offsets 50..149 of queue 0: 100 skipped, the 50 new ones written
            [_batch("T", clean[50:100] + [_encode({"id": 2000 + i}, rng) for i in range(50)], 50)],
        ],
    )


def test_upsert_mode_merges_the_same_rows_both_ways(database: Database, tmp_path: Path) -> None:
    rng = random.Random(20)
    first = [_encode(_clean(i % 120, rng), rng) for i in range(300)]  # keys repeat in a run
    second = [_encode(_clean(i % 150, rng), rng) for i in range(200)]
    second[7] = b"[]"  # this run goes row by row
    _write_both(
        database,
        tmp_path,
        {"insert.mode": "upsert", "pk.mode": "record_value", "pk.fields": "id"},
        [[_batch("T", first, 0)], [_batch("T", second, 300), _batch("T", first[:90], 0, 1)]],
    )
