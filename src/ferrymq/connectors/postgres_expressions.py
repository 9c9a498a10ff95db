"""The PostgreSQL sink's `fields.expressions`: columns computed by Spark SQL expressions.

`fields.expressions` is a Spark SQL select list, e.g.
`CAST(get_json_object(value, '$.id') AS BIGINT) AS id, upper(get_json_object(value, '$.n')) AS
name`, evaluated by Spark over each message row (`value` and `key` as UTF-8 text, `topic`,
`partition`, `offset`, `timestamp`, `tags`, `keys`, `msgId`, `storeTimestamp`, `brokerName`,
`queueId`). Each expression ends with `AS <column>`, a column of `fields` (which still gives the
columns' PostgreSQL types); a column no expression names is NULL.

This module owns the cheap check `/config/validate` runs without Spark (`parse_expressions`):
one expression per top-level comma (commas inside parentheses, quotes or backquotes do not
split), balanced parentheses, closed quotes, every alias a column of `fields`, none twice. What
only Spark can judge (an unknown function or column, a type that does not cast) fails the
task's start with Spark's AnalysisException message (`PostgresSink.build`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from ferrymq.connectors.postgres_columns import Column

__all__ = ["EXPRESSIONS_KEY", "Expression", "parse_expressions"]

EXPRESSIONS_KEY: Final = "fields.expressions"

_ALIAS: Final = re.compile(r"(?is)(.*\S)\s+AS\s+(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)\s*")

Expression = tuple[str, str]
"""(the column it fills, the whole expression as Spark reads it: `<expr> AS <column>`)."""


def _split(spec: str) -> list[str]:
    """Entries at parenthesis depth 0 outside quotes.

    Raises:
        ValueError: a parenthesis or a quote is not closed (or closed before it opens).
    """
    entries: list[str] = []
    current: list[str] = []
    depth = 0
    quote = ""
    chars = iter(spec)
    for char in chars:
        current.append(char)
        if quote:
            if char == "\\" and quote != "`":
                current.append(next(chars, ""))
            elif char == quote:
                quote = ""
        elif char in "'\"`":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"{EXPRESSIONS_KEY}: a ')' closes nothing in {spec!r}")
        elif char == "," and depth == 0:
            current.pop()
            entries.append("".join(current))
            current = []
    if quote:
        raise ValueError(f"{EXPRESSIONS_KEY}: a {quote} quote is not closed in {spec!r}")
    if depth:
        raise ValueError(f"{EXPRESSIONS_KEY}: {depth} '(' not closed in {spec!r}")
    entries.append("".join(current))
    return [e.strip() for e in entries]


def parse_expressions(spec: str, columns: Sequence[Column]) -> tuple[Expression, ...]:
    """The expressions of a `fields.expressions` value, each with the column it fills.

    Raises:
        ValueError: what is wrong with it (the message names the key and the expression).
    """
    names = {c.name for c in columns}
    found: list[Expression] = []
    for entry in _split(spec):
        if not entry:
            raise ValueError(f"{EXPRESSIONS_KEY}: an empty expression in {spec!r}")
        match = _ALIAS.fullmatch(entry)
        if match is None:
            raise ValueError(
                f"{EXPRESSIONS_KEY}: {entry!r} needs 'AS <column>' naming one of the fields "
                f"({', '.join(sorted(names))})"
            )
        alias = match.group(2)
        name = alias[1:-1].replace("``", "`") if alias.startswith("`") else alias
        if name not in names:
            raise ValueError(
                f"{EXPRESSIONS_KEY}: {entry!r} fills {name!r}, which is not one of the fields "
                f"({', '.join(sorted(names))})"
            )
        if any(name == done for done, _ in found):
            raise ValueError(f"{EXPRESSIONS_KEY}: {name} is computed more than once")
        found.append((name, entry))
    if not found:
        raise ValueError(f"{EXPRESSIONS_KEY}: name at least one expression, e.g. 'upper(x) AS x'")
    return tuple(found)
