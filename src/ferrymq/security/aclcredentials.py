"""ACL 1.0 credentials of a client process: a credentials file, and the process's default.

A command installs the credentials it was given once (`install_credentials`); every `RpcClient`
made afterwards without its own signs with them, as every connection of a `--tls` command uses the
process's TLS. Without installed ones, FERRY_ACCESS_KEY and FERRY_SECRET_KEY of the environment
are the process's (a Connect worker exports its keys so its Spark executors sign too). The
credentials file is RocketMQ's `tools.yml` shape, `accessKey: ...` and
`secretKey: ...` lines (`key=value` works too). Errors name the file and the key, never a secret.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from ferrymq.config import ConfigError, parse_properties
from ferrymq.security.acl import AclConfigError, Credentials

__all__ = [
    "ACCESS_KEY_ENV",
    "SECRET_KEY_ENV",
    "export_credentials",
    "install_credentials",
    "load_credentials_file",
    "process_credentials",
]

ACCESS_KEY_ENV: Final = "FERRY_ACCESS_KEY"
SECRET_KEY_ENV: Final = "FERRY_SECRET_KEY"

_FILE_LIMIT: Final = 64 * 1024

_installed: Credentials | None = None


def load_credentials_file(path: Path) -> Credentials:
    """`accessKey` and `secretKey` (and an optional `securityToken`) from a file.

    Raises:
        AclConfigError: unreadable, or a key missing (the message names the file).
    """
    try:
        with path.open("rb") as file:
            data = file.read(_FILE_LIMIT + 1)
    except OSError as exc:
        raise AclConfigError(f"credentials file {path}: {exc.strerror or exc}") from None
    if len(data) > _FILE_LIMIT:
        raise AclConfigError(f"credentials file {path}: larger than {_FILE_LIMIT} bytes")
    try:
        values = parse_properties(data.decode("utf-8"), str(path))
    except (UnicodeDecodeError, ConfigError):
        raise AclConfigError(f"credentials file {path}: not 'key: value' lines") from None
    values = {k: v.strip().strip("\"'") for k, v in values.items()}
    missing = [key for key in ("accessKey", "secretKey") if not values.get(key)]
    if missing:
        raise AclConfigError(f"credentials file {path}: no {' or '.join(missing)}")
    return Credentials(values["accessKey"], values["secretKey"], values.get("securityToken"))


def install_credentials(credentials: Credentials | None) -> None:
    """Sign every later request of this process's clients with `credentials` (None: unsigned)."""
    global _installed
    _installed = credentials


def process_credentials() -> Credentials | None:
    """The credentials installed for this process, else FERRY_ACCESS_KEY and FERRY_SECRET_KEY.

    The environment reaches the processes a command starts (a Connect worker's Spark executors),
    where nothing was installed.
    """
    if _installed is not None:
        return _installed
    access_key, secret_key = os.environ.get(ACCESS_KEY_ENV), os.environ.get(SECRET_KEY_ENV)
    if access_key and secret_key:
        return Credentials(access_key, secret_key)
    return None


def export_credentials(credentials: Credentials) -> None:
    """Install `credentials` and put them in the environment of the processes started later."""
    install_credentials(credentials)
    os.environ[ACCESS_KEY_ENV] = credentials.access_key
    os.environ[SECRET_KEY_ENV] = credentials.secret_key
