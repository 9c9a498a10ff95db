"""Output helpers: one JSON document, or a Rich table, for every read command."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click
import msgspec
from rich.console import Console
from rich.table import Table

__all__ = ["emit_json", "emit_table", "to_jsonable"]


def to_jsonable(value: Any) -> Any:
    """Plain JSON values from bodies (msgspec structs keep RocketMQ's camelCase names)."""
    return msgspec.to_builtins(value)


def emit_json(value: Any) -> None:
    """Print one JSON document."""
    click.echo(json.dumps(to_jsonable(value), ensure_ascii=False))


def emit_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a Rich table."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    Console().print(table)
