"""The credential flags of the client commands (ACL 1.0, issue 23).

`ferry --access-key AK --secret-key SK ...`, or FERRY_ACCESS_KEY / FERRY_SECRET_KEY in the
environment, or `--credentials-file FILE` (FERRY_CREDENTIALS_FILE; `accessKey: ...` and
`secretKey: ...` lines). Flags and variables win over the file. The secret is never echoed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ferrymq.security.acl import AclConfigError, Credentials, credentials_of
from ferrymq.security.aclcredentials import install_credentials, load_credentials_file

__all__ = ["acl_client_options", "install_client_credentials"]

F = TypeVar("F", bound=Callable[..., Any])


def acl_client_options(command: F) -> F:
    """Add `--access-key`, `--secret-key` and `--credentials-file` (with their variables)."""
    options = [
        click.option(
            "--credentials-file",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar="FERRY_CREDENTIALS_FILE",
            help="ACL credentials: a file of accessKey/secretKey lines (FERRY_CREDENTIALS_FILE).",
        ),
        click.option(
            "--secret-key",
            envvar="FERRY_SECRET_KEY",
            show_envvar=True,
            help="ACL secret key (better in FERRY_SECRET_KEY or a file than on a command line).",
        ),
        click.option(
            "--access-key",
            envvar="FERRY_ACCESS_KEY",
            show_envvar=True,
            help="ACL access key: every request is signed (servers with aclEnable=true).",
        ),
    ]
    for option in options:
        command = option(command)
    return command


def install_client_credentials(
    access_key: str | None, secret_key: str | None, credentials_file: Path | None
) -> Credentials | None:
    """Install the credentials the flags name for every client of this process.

    Raises:
        click.UsageError: only one of the keys, or an unusable file.
    """
    try:
        credentials = credentials_of(access_key, secret_key)
        if credentials is None and credentials_file is not None:
            credentials = load_credentials_file(credentials_file)
    except ValueError as exc:  # AclConfigError is a ValueError too
        message = str(exc) if isinstance(exc, AclConfigError) else "give both keys or neither"
        raise click.UsageError(f"--access-key/--secret-key: {message}") from None
    install_credentials(credentials)
    return credentials
