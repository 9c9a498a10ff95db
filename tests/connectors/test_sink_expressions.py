"""PostgresSink's `fields.expressions` checked at /config/validate time, without Spark."""

import pytest

from ferrymq.connect.plugin import config_infos
from ferrymq.connectors.postgres_columns import parse_fields
from ferrymq.connectors.postgres_expressions import parse_expressions
from ferrymq.connectors.postgres_sink import PostgresSink, read_mode

COLUMNS = parse_fields("id bigint not null, name text")
CONFIG = {
    "name": "s",
    "connector.class": "PostgresSink",
    "topics": "t",
    "connection.url": "postgresql://app@db.example/shop",
    "fields": "id bigint not null, name text",
}


def test_a_select_list_splits_at_top_level_commas_only() -> None:
    spec = "CAST(get_json_object(value, '$.a,b') AS BIGINT) AS id, concat(key, ',') AS `name`"
    assert parse_expressions(spec, COLUMNS) == (
        ("id", "CAST(get_json_object(value, '$.a,b') AS BIGINT) AS id"),
        ("name", "concat(key, ',') AS `name`"),
    )


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("upper(name)", "needs 'AS <column>'"),
        ("CAST(x AS BIGINT)", "needs 'AS <column>'"),
        ("upper(x) AS other", "fills 'other', which is not one of the fields (id, name)"),
        ("x AS id, y AS id", "id is computed more than once"),
        ("upper(x AS name", "1 '(' not closed"),
        ("upper(x)) AS name", "a ')' closes nothing"),
        ("concat(x, 'a) AS name", "a ' quote is not closed"),
        ("x AS id,, y AS name", "an empty expression"),
    ],
)
def test_a_malformed_list_is_refused_with_its_reason(spec: str, reason: str) -> None:
    with pytest.raises(ValueError, match=r"fields\.expressions") as refused:
        parse_expressions(spec, COLUMNS)
    assert reason in str(refused.value)


def test_validate_reports_the_expressions_and_refuses_them_in_ranges_mode() -> None:
    def errors(config: dict[str, str]) -> dict[str, list[str]]:
        infos = config_infos("PostgresSink", PostgresSink(), config)
        return {c["value"]["name"]: c["value"]["errors"] for c in infos["configs"]}

    good = {**CONFIG, "fields.expressions": "upper(value) AS name, offset AS id"}
    assert config_infos("PostgresSink", PostgresSink(), good)["error_count"] == 0
    assert read_mode(good) == "rows"
    assert read_mode(CONFIG) == "ranges"
    ranges = errors({**good, "ferrymq.read.mode": "ranges"})["ferrymq.read.mode"]
    assert ranges == [
        "fields.expressions are evaluated by Spark over the message rows: they need "
        "ferrymq.read.mode=rows (the default when fields.expressions is set)"
    ]
    [unnamed] = errors({**CONFIG, "fields.expressions": "upper(value)"})["fields.expressions"]
    assert "'upper(value)' needs 'AS <column>'" in unnamed
