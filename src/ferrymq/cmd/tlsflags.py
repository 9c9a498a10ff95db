"""The `--tls*` flags of the server and client commands, and installing the process's TLS.

A server command takes RocketMQ's `tls.*` keys from its `--config` file and these flags (flags
win), builds both sides' contexts once and installs them for the process (its listeners and every
connection it opens: to NameServers, controllers, masters, Raft peers). A client command takes
`--tls` and `--tls-ca` (and a client certificate when the server requires one).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from ferrymq.cmd.process import fail
from ferrymq.config import ConfigError
from ferrymq.security.tls import (
    TLS_ENV,
    ClientTls,
    client_env,
    install,
    settings_for,
    split_tls_keys,
    tls_config_from,
)

__all__ = ["client_tls", "install_tls", "tls_client_options", "tls_server_options"]

F = TypeVar("F", bound=Callable[..., Any])

_PATH: Final = click.Path(dir_okay=False, exists=True, path_type=Path)


def tls_server_options(command: F) -> F:
    """Add `--tls`, `--tls-mode`, `--tls-cert`, `--tls-key`, `--tls-ca`, `--tls-client-auth`."""
    options = [
        click.option(
            "--tls-client-auth",
            "tls__client_auth",
            type=click.Choice(["none", "optional", "require"]),
            help="tls.server.need.client.auth: ask clients (and peers) for a certificate.",
        ),
        click.option(
            "--tls-ca",
            "tls__ca",
            type=_PATH,
            help="CA file: trusted for servers this one connects to and for client certificates.",
        ),
        click.option(
            "--tls-key", "tls__key", type=_PATH, help="tls.server.keyPath (PEM; also the client's)."
        ),
        click.option(
            "--tls-cert",
            "tls__cert",
            type=_PATH,
            help="tls.server.certPath (PEM chain; also presented to peers that ask).",
        ),
        click.option(
            "--tls-mode",
            "tls__mode",
            type=click.Choice(["disabled", "permissive", "enforcing"]),
            help="tls.server.mode [default with --tls: enforcing].",
        ),
        click.option(
            "--tls",
            "tls__enable",
            is_flag=True,
            default=None,
            help="tlsEnable: TLS on this server's ports and its own connections.",
        ),
    ]
    for option in options:
        command = option(command)
    return command


def _flag_values(flags: Mapping[str, Any]) -> dict[str, str]:
    values: dict[str, str] = {}
    if flags.get("tls__enable"):
        values["tlsEnable"] = "true"
    if flags.get("tls__mode"):
        values["tls.server.mode"] = str(flags["tls__mode"])
    if flags.get("tls__cert"):
        values["tls.server.certPath"] = values["tls.client.certPath"] = str(flags["tls__cert"])
    if flags.get("tls__key"):
        values["tls.server.keyPath"] = values["tls.client.keyPath"] = str(flags["tls__key"])
    if flags.get("tls__ca"):
        values["tls.server.trustCertPath"] = str(flags["tls__ca"])
        values["tls.client.trustCertPath"] = str(flags["tls__ca"])
    if flags.get("tls__client_auth"):
        values["tls.server.need.client.auth"] = str(flags["tls__client_auth"])
    return values


def install_tls(values: Mapping[str, str], flags: MutableMapping[str, Any]) -> dict[str, str]:
    """Install the process's TLS from `values`' `tls.*` keys and the `tls__*` flags.

    Takes the `tls__*` entries out of `flags`; returns `values` without their TLS keys (what is
    left for the server's config class). Exits with one line naming the key on a bad value.
    """
    tls_values, rest = split_tls_keys(values)
    tls_values.update(_flag_values(flags))
    for name in [n for n in flags if n.startswith("tls__")]:
        del flags[name]
    try:
        config = tls_config_from(tls_values)
        install(settings_for(config))
    except ConfigError as exc:
        fail(str(exc))
    if config.enable:  # children (a Connect worker's Spark tasks) connect as this process does
        os.environ[TLS_ENV] = client_env(config)
    return rest


def tls_client_options(command: F) -> F:
    """Add `--tls`, `--tls-ca`, `--tls-cert`, `--tls-key` to a client command."""
    options = [
        click.option("--tls-key", type=_PATH, help="Client key (PEM), with --tls-cert."),
        click.option(
            "--tls-cert",
            type=_PATH,
            help="Client certificate (PEM), for servers that require one.",
        ),
        click.option(
            "--tls-ca",
            type=_PATH,
            envvar="FERRY_TLS_CA",
            help="CA that signed the servers' certificates (implies --tls) [env FERRY_TLS_CA].",
        ),
        click.option(
            "--tls", is_flag=True, default=False, envvar="FERRY_TLS", help="Connect with TLS."
        ),
    ]
    for option in options:
        command = option(command)
    return command


def client_tls(
    tls: bool, ca: Path | None, cert: Path | None = None, key: Path | None = None
) -> ClientTls:
    """The TLS a client command connects with (plain text without `--tls`/`--tls-ca`)."""
    values: dict[str, str] = {}
    if tls or ca is not None:
        values["tls.enable"] = "true"
    if ca is not None:
        values["tls.client.trustCertPath"] = str(ca)
    if cert is not None:
        values["tls.client.certPath"] = str(cert)
    if key is not None:
        values["tls.client.keyPath"] = str(key)
    try:
        return settings_for(tls_config_from(values), server_side=False).client
    except ConfigError as exc:
        fail(str(exc))
