"""What the PostgreSQL connectors share: where the database is, connecting with clear errors, names.

Owns the connection keys of both plugins, named as in Confluent's JDBC connectors so configs
carry over: `connection.url` (`postgresql://user:pass@host:port/db`, `postgres://...` and
`jdbc:postgresql://...` accepted, query parameters such as `sslmode` kept), `connection.user`
and `connection.password` (both win over the URL's). Rules:

1. A password is never logged, never put in an error and never shown: `PgTarget` keeps it out of
   its repr and its `display` form, and a plugin hands it to Spark only under an option key
   Spark's `spark.redaction.regex` hides (`password`).
2. Every failure to reach the database is a `PostgresConnectorError` that says what was being
   done, where (`display`) and PostgreSQL's own reason (wrong password, connection refused, no
   such database); the task's query ends with it and the runtime shows it as FAILED with the
   trace. Nothing here exits the process.
3. Table and column names are SQL identifiers built with `psycopg.sql.Identifier`, never pasted
   into SQL text; `table_name` splits an optional schema off.

psycopg 3 is imported here and in the two plugins only (issue 19: "psycopg only in connectors").
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql

from ferrymq.connect.plugin import ConfigKey, ConfigType
from ferrymq.errors import FerryError

__all__ = [
    "CONNECTION_KEYS",
    "CONNECT_TIMEOUT_S",
    "FencedError",
    "PgTarget",
    "PostgresConnectorError",
    "parse_target",
    "qualified",
    "table_name",
]

CONNECT_TIMEOUT_S: Final = 10
"""How long one connection attempt may take (an unreachable host fails after this)."""

CONNECTION_KEYS: Final = (
    ConfigKey(
        "connection.url",
        ConfigType.STRING,
        "The database: postgresql://[user[:password]@]host[:port]/database[?sslmode=...] "
        "(jdbc:postgresql:// accepted). Give the password in connection.password, which is "
        "never shown.",
        required=True,
        importance="HIGH",
        group="Connection",
    ),
    ConfigKey(
        "connection.user",
        ConfigType.STRING,
        "The database user (wins over the URL's).",
        importance="HIGH",
        group="Connection",
    ),
    ConfigKey(
        "connection.password",
        ConfigType.PASSWORD,
        "The user's password (wins over the URL's); never logged or shown.",
        importance="HIGH",
        group="Connection",
    ),
)

_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_$-]{0,62}")


class PostgresConnectorError(FerryError):
    """The database cannot be used as configured: unreachable, login refused, a table missing."""


class FencedError(PostgresConnectorError):
    """A newer owner of the task has written (or claimed) these queues: this writer is a zombie."""


@dataclass(frozen=True, slots=True)
class PgTarget:
    """Where a connector's database is and how to log in (picklable; the password is hidden)."""

    host: str
    port: int
    dbname: str
    user: str
    password: str = field(default="", repr=False)
    params: tuple[tuple[str, str], ...] = ()
    """Other libpq parameters from the URL's query (sslmode, ...)."""

    @property
    def display(self) -> str:
        """The database as errors and logs name it: no password."""
        user = f"{urllib.parse.quote(self.user)}@" if self.user else ""
        return f"postgresql://{user}{self.host}:{self.port}/{self.dbname}"

    def with_password(self, password: str) -> PgTarget:
        """The same target with this password."""
        return PgTarget(self.host, self.port, self.dbname, self.user, password, self.params)

    def without_password(self) -> PgTarget:
        """The same target with no password (what goes into a Spark option in plain text)."""
        return self.with_password("")

    def connect(self, purpose: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        """A new connection.

        Raises:
            PostgresConnectorError: it cannot be opened; says `purpose`, `display` and why.
        """
        kwargs: dict[str, Any] = dict(self.params)
        kwargs.setdefault("application_name", "ferrymq-connect")
        try:
            return psycopg.connect(
                host=self.host,
                port=self.port,
                dbname=self.dbname,
                user=self.user or None,
                password=self.password or None,
                connect_timeout=CONNECT_TIMEOUT_S,
                autocommit=autocommit,
                **kwargs,
            )
        except psycopg.OperationalError as exc:
            raise PostgresConnectorError(
                f"cannot connect to PostgreSQL at {self.display} ({purpose}): {_reason(exc)}"
            ) from None


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text.removeprefix("connection failed: ") or type(exc).__name__


def parse_target(config: Mapping[str, str]) -> PgTarget:
    """The database a config names (`connection.url`, `.user`, `.password`).

    Raises:
        ValueError: the URL is missing or not a PostgreSQL URL (the message never holds the
            password).
    """
    url = (config.get("connection.url") or "").strip()
    if not url:
        raise ValueError("connection.url is required: postgresql://host:port/database")
    url = url.removeprefix("jdbc:")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or 5432
    except ValueError as exc:
        raise ValueError(f"connection.url is not a URL: {exc}") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError(
            f"connection.url must start with postgresql:// (got {parts.scheme or 'no'} scheme)"
        )
    if not parts.hostname:
        raise ValueError("connection.url names no host: postgresql://host:port/database")
    dbname = urllib.parse.unquote(parts.path.lstrip("/"))
    if not dbname:
        raise ValueError("connection.url names no database: postgresql://host:port/database")
    params = tuple(sorted(urllib.parse.parse_qsl(parts.query)))
    if any(name in ("password", "user") for name, _ in params):
        raise ValueError("give user and password in connection.user / connection.password")
    user = config.get("connection.user") or urllib.parse.unquote(parts.username or "")
    password = config.get("connection.password") or urllib.parse.unquote(parts.password or "")
    return PgTarget(parts.hostname, port, dbname, user, password, params)


def table_name(text: str) -> tuple[str | None, str]:
    """(schema or None, table) of `table` or `schema.table`.

    Raises:
        ValueError: a part is not a plain identifier (letters, digits, `_`, `$`, `-`; at most 63).
    """
    parts = text.split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.fullmatch(p) for p in parts):
        raise ValueError(
            f"{text!r} is not a table name: table or schema.table, each of letters, digits, "
            "_ $ - (at most 63), not starting with a digit"
        )
    return (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])


def qualified(schema: str | None, table: str) -> sql.Identifier:
    """The table as an SQL identifier (schema-qualified when a schema is given)."""
    return sql.Identifier(schema, table) if schema else sql.Identifier(table)
