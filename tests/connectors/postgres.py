"""The connector tests' PostgreSQL server: `ferrymq.connectors.pgserver` (Debian's package, a
temporary cluster, a free port, run as the `postgres` user when root, stopped by PID), which
`ferry demo` starts too."""

from ferrymq.connectors.pgserver import (
    PASSWORD,
    USER,
    Database,
    PostgresServer,
    binaries,
    start_postgres,
)

__all__ = ["PASSWORD", "USER", "Database", "PostgresServer", "binaries", "start_postgres"]
