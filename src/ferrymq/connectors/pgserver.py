"""A PostgreSQL server of one's own for `ferry demo` and the tests, stopped by PID.

Debian's package (`apt-get install postgresql`), a temporary cluster, a free port.

Rules:
- `postgres` refuses to run as root, so as root the cluster's directory belongs to the `postgres`
  user the Debian package creates and every server command runs through
  `runuser -u postgres --`; as any other user it runs as that user.
- The server listens on 127.0.0.1 only, on a port found free just before it starts (PostgreSQL
  cannot be told port 0; a start that loses the port to someone else is retried on another), with
  its Unix socket in its own directory. Its directory is a new one under the system's temporary
  directory, not a caller's (pytest's `tmp_path` parents are private to root).
- Connections over TCP need the password (`scram-sha-256`), so a caller can log in with a wrong
  one. Durability settings are off: a server that crashes is thrown away, never recovered.
- It is stopped by the postmaster's PID (fast shutdown, SIGKILL after 20 s), and its directory is
  removed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import psycopg

from ferrymq.errors import FerryError

__all__ = [
    "PASSWORD",
    "USER",
    "Database",
    "PostgresServer",
    "PostgresUnavailableError",
    "binaries",
    "start_postgres",
]

USER: Final = "postgres"
PASSWORD: Final = "ferry-secret"
INSTALL_HINT: Final = "apt-get install -y postgresql"


class PostgresUnavailableError(FerryError):
    """No PostgreSQL server can run here: the message says why and what to install."""


def binaries() -> Path:
    """The newest installed server's bin directory (`apt-get install postgresql`).

    Raises:
        PostgresUnavailableError: no server is installed.
    """
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        raise PostgresUnavailableError(
            f"no PostgreSQL server in /usr/lib/postgresql/*/bin: {INSTALL_HINT}"
        )
    return Path(found[-1]).parent


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", USER, "--", *command] if os.geteuid() == 0 else command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass(frozen=True)
class Database:
    """One database: its URL with the password, and the connector keys that reach it."""

    name: str
    url: str
    bare_url: str
    """The URL without a password (the connectors take it in connection.password)."""

    @property
    def config(self) -> dict[str, str]:
        """`connection.url` and `connection.password` for a PostgreSQL connector."""
        return {"connection.url": self.bare_url, "connection.password": PASSWORD}

    def query(self, text: str, *params: object) -> list[tuple[object, ...]]:
        """Run one statement (autocommit); its rows, if it returns any."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(text.encode(), params or None)
            return cursor.fetchall() if cursor.description else []


@dataclass
class PostgresServer:
    """A running server: its directory, port, process and log."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.root / "data"

    def url(self, database: str = "postgres", password: str | None = PASSWORD) -> str:
        """A libpq URL of a database (without the password when `password` is None)."""
        login = USER if password is None else f"{USER}:{password}"
        return f"postgresql://{login}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit connection to a database."""
        return psycopg.connect(self.url(database), autocommit=True, connect_timeout=5)

    def create_database(self, name: str) -> Database:
        """A fresh database (dropped first if it exists)."""
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"'.encode())
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return Database(name, self.url(name), self.url(name, password=None))

    def postmaster_pid(self) -> int | None:
        """The postmaster's PID from its pid file (None: not running)."""
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster, by PID), SIGKILL after 20 s; files removed."""
        pid = self.postmaster_pid()
        if pid is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)


def _initdb(bin_dir: Path, root: Path) -> None:
    secret = root / "pwfile"
    secret.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, USER, USER)
        shutil.chown(secret, USER, USER)
    done = subprocess.run(
        _as_postgres(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(root / "data"),
                "-U",
                USER,
                f"--pwfile={secret}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ]
        ),
        check=False,
        capture_output=True,
        timeout=120,
    )
    secret.unlink()
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace").strip()
        raise PostgresUnavailableError(f"initdb failed ({done.returncode}): {output[-1500:]}")


def _ready(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise OSError(f"postgres exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            psycopg.connect(
                f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{port}/postgres", connect_timeout=2
            ).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise PostgresUnavailableError(
                    f"postgres not ready in {timeout} s: {log.read_text()[-2000:]}"
                ) from None
            time.sleep(0.1)


def start_postgres(timeout: float = 60.0) -> PostgresServer:
    """Make a cluster (initdb) in a new temporary directory and start it on a free port.

    Raises:
        PostgresUnavailableError: no server is installed, as root there is no `postgres` user,
            or the server did not start (the message carries the end of its log).
    """
    bin_dir = binaries()
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        raise PostgresUnavailableError("as root the server runs through runuser, which is missing")
    root = Path(tempfile.mkdtemp(prefix="ferry-pg-"))
    try:
        try:
            _initdb(bin_dir, root)
        except LookupError as exc:  # shutil.chown: no such user
            raise PostgresUnavailableError(
                f"no {USER} user to run the server as ({exc}): {INSTALL_HINT} creates it"
            ) from None
        sockets = root / "sockets"
        sockets.mkdir()
        if os.geteuid() == 0:
            shutil.chown(sockets, USER, USER)
        log = root / "postgres.log"
        for _ in range(3):
            port = _free_port()
            with log.open("ab") as out:
                process = subprocess.Popen(
                    _as_postgres(
                        [
                            str(bin_dir / "postgres"),
                            "-D",
                            str(root / "data"),
                            "-p",
                            str(port),
                            "-k",
                            str(sockets),
                            "-c",
                            "listen_addresses=127.0.0.1",
                            "-c",
                            "fsync=off",
                            "-c",
                            "synchronous_commit=off",
                            "-c",
                            "full_page_writes=off",
                            "-c",
                            "max_connections=100",
                        ]
                    ),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            server = PostgresServer(root, port, process, log)
            try:
                _ready(port, process, log, timeout)
            except OSError:  # the port was taken meanwhile: another one
                server.process.wait(10)
                continue
            except BaseException:
                server.stop()
                raise
            return server
        raise PostgresUnavailableError(f"postgres did not start: {log.read_text()[-2000:]}")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
