"""A PostgreSQL server for tests: Debian's package, a temporary cluster, a free port, stop by PID.

`postgres` refuses to run as root, so as root (CI) the cluster's directory belongs to the
`postgres` user the Debian package creates and every server command runs through
`runuser -u postgres --`; as any other user it runs as that user. The server listens on
127.0.0.1 only, on a port found free just before it starts (PostgreSQL cannot be told port 0;
a start that loses the port to someone else is retried on another), with its Unix socket in its
own directory. Connections over TCP need the password (`scram-sha-256`), so a test can log in
with a wrong one. Durability settings are off: the tests crash Spark drivers, never the server.
"""

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

import psycopg

USER = "postgres"
PASSWORD = "ferry-secret"


def binaries() -> Path:
    """The newest installed server's bin directory (`apt-get install postgresql`)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        raise AssertionError(
            "no PostgreSQL server: apt-get install -y postgresql (.ci/run installs it)"
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
    """A test's database: its URL with the password, and the connector keys that reach it."""

    name: str
    url: str
    bare_url: str
    """The URL without a password (the connectors take it in connection.password)."""

    @property
    def config(self) -> dict[str, str]:
        return {"connection.url": self.bare_url, "connection.password": PASSWORD}

    def query(self, text: str, *params: object) -> list[tuple[object, ...]]:
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
        return self.root / "data"

    def url(self, database: str = "postgres", password: str | None = PASSWORD) -> str:
        login = USER if password is None else f"{USER}:{password}"
        return f"postgresql://{login}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url(database), autocommit=True, connect_timeout=5)

    def create_database(self, name: str) -> "Database":
        """A fresh database."""
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return Database(name, self.url(name), self.url(name, password=None))

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster, by PID), SIGKILL after 20 s."""
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


def _initdb(root: Path) -> None:
    bin_dir = binaries()
    secret = root / "pwfile"
    secret.write_text(PASSWORD + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, USER, USER)
        shutil.chown(secret, USER, USER)
    subprocess.run(
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
        check=True,
        capture_output=True,
        timeout=120,
    )
    secret.unlink()


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
                raise AssertionError(
                    f"postgres not ready in {timeout} s: {log.read_text()[-2000:]}"
                ) from None
            time.sleep(0.1)


def start_postgres(timeout: float = 60.0) -> PostgresServer:
    """initdb into a new temporary directory and start a server on a free port."""
    # not pytest's tmp_path: its parents are private to root, and the server runs as `postgres`
    root = Path(tempfile.mkdtemp(prefix="ferry-pg-"))
    try:
        _initdb(root)
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
                            str(binaries() / "postgres"),
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
        raise AssertionError(f"postgres did not start: {log.read_text()[-2000:]}")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
