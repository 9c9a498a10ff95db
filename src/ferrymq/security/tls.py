"""TLS settings: RocketMQ's `tls.*` keys, the one place SSLContexts are built, the process's choice.

Every listener (remoting, HA, controller) and every outgoing connection (SDK, CLI, broker to
NameServer and controller, slave to master, Raft) takes its TLS from here: servers and clients
given no explicit `ServerTls` / `ClientTls` use the process's (`install`), as RocketMQ's
`TlsSystemConfig` is one set of system properties per JVM.

Keys (RocketMQ `remoting/.../TlsSystemConfig.java`; `tlsEnable` is the broker.conf spelling of
`tls.enable`):

- `tls.enable` / `tlsEnable`: this process's clients use TLS; alone, it also makes the servers'
  mode `enforcing`.
- `tls.server.mode`: `disabled`, `permissive` (plain and TLS on one port, told apart by the first
  byte, as RocketMQ does) or `enforcing` (TLS only).
- `tls.server.certPath`, `tls.server.keyPath`, `tls.server.keyPassword`: the server's PEM
  certificate chain and key.
- `tls.server.need.client.auth`: `none`, `optional` or `require` a client certificate, checked
  against `tls.server.trustCertPath`. `tls.server.authClient=true` alone means `require`.
- `tls.client.certPath`, `tls.client.keyPath`, `tls.client.keyPassword`: the client's certificate
  (for servers that require one); `tls.client.trustCertPath`: the CA the server's certificate must
  chain to (the system's CAs when not given).
- `tls.client.authServer`: verify the server's certificate and name. ferrymq's default is `true`
  (RocketMQ's is `false`): a security setting never fails open.
- `tls.test.mode.enable`: a server without a certificate makes itself a self-signed one, and a
  client trusts any server (RocketMQ's test mode). Default `false` here (RocketMQ: `true`).
"""

from __future__ import annotations

import contextvars
import enum
import json
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

from ferrymq.config import ConfigError

__all__ = [
    "PLAIN_CLIENT",
    "PLAIN_SERVER",
    "TLS_ENV",
    "TLS_KEYS",
    "ClientAuth",
    "ClientTls",
    "ServerTls",
    "TlsConfig",
    "TlsMode",
    "TlsSettings",
    "client_env",
    "install",
    "process_client_tls",
    "process_server_tls",
    "restore",
    "settings_for",
    "split_tls_keys",
    "tls_config_from",
]


_E = TypeVar("_E", bound=enum.StrEnum)


class TlsMode(enum.StrEnum):
    """`tls.server.mode`."""

    DISABLED = "disabled"
    PERMISSIVE = "permissive"
    ENFORCING = "enforcing"


class ClientAuth(enum.StrEnum):
    """`tls.server.need.client.auth`."""

    NONE = "none"
    OPTIONAL = "optional"
    REQUIRE = "require"


TLS_KEYS: Final = (
    "tlsEnable",
    "tls.enable",
    "tls.server.mode",
    "tls.server.certPath",
    "tls.server.keyPath",
    "tls.server.keyPassword",
    "tls.server.need.client.auth",
    "tls.server.authClient",
    "tls.server.trustCertPath",
    "tls.client.certPath",
    "tls.client.keyPath",
    "tls.client.keyPassword",
    "tls.client.trustCertPath",
    "tls.client.authServer",
    "tls.test.mode.enable",
)
"""Every TLS key ferrymq honours (the fail-closed check lets these through)."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """The `tls.*` keys of one process, typed."""

    enable: bool = False
    server_mode: TlsMode = TlsMode.DISABLED
    server_cert_path: Path | None = None
    server_key_path: Path | None = None
    server_key_password: str | None = field(default=None, repr=False)
    server_need_client_auth: ClientAuth = ClientAuth.NONE
    server_trust_cert_path: Path | None = None
    client_cert_path: Path | None = None
    client_key_path: Path | None = None
    client_key_password: str | None = field(default=None, repr=False)
    client_trust_cert_path: Path | None = None
    client_auth_server: bool = True
    test_mode: bool = False


def _bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(key, f"expected true or false, not {value!r}")
    return lowered == "true"


def _choice(key: str, value: str, kind: type[_E]) -> _E:
    try:
        return kind(value.strip().lower())
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise ConfigError(key, f"expected one of {allowed}, not {value!r}") from None


def split_tls_keys(values: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split config values into (the TLS keys, the rest)."""
    tls = {k: v for k, v in values.items() if k in TLS_KEYS}
    return tls, {k: v for k, v in values.items() if k not in TLS_KEYS}


def tls_config_from(values: Mapping[str, str]) -> TlsConfig:
    """The TLS config of RocketMQ-keyed strings (other keys are not looked at).

    Raises:
        ConfigError: a value does not convert, a server mode lacks its certificate, or a
            certificate file is missing; the message names the key.
    """

    def path(key: str) -> Path | None:
        raw = values.get(key, "").strip()
        if not raw:
            return None
        found = Path(raw).expanduser()
        if not found.is_file():
            raise ConfigError(key, f"no such file: {found}")
        return found

    enable = any(_bool(k, values[k]) for k in ("tlsEnable", "tls.enable") if k in values)
    mode_value = values.get("tls.server.mode")
    if mode_value is not None:
        mode = _choice("tls.server.mode", mode_value, TlsMode)
    else:
        mode = TlsMode.ENFORCING if enable else TlsMode.DISABLED
    need = ClientAuth.NONE
    if "tls.server.need.client.auth" in values:
        need = _choice(
            "tls.server.need.client.auth", values["tls.server.need.client.auth"], ClientAuth
        )
    elif _bool("tls.server.authClient", values.get("tls.server.authClient", "false")):
        need = ClientAuth.REQUIRE
    config = TlsConfig(
        enable=enable,
        server_mode=mode,
        server_cert_path=path("tls.server.certPath"),
        server_key_path=path("tls.server.keyPath"),
        server_key_password=values.get("tls.server.keyPassword") or None,
        server_need_client_auth=need,
        server_trust_cert_path=path("tls.server.trustCertPath"),
        client_cert_path=path("tls.client.certPath"),
        client_key_path=path("tls.client.keyPath"),
        client_key_password=values.get("tls.client.keyPassword") or None,
        client_trust_cert_path=path("tls.client.trustCertPath"),
        client_auth_server=_bool(
            "tls.client.authServer", values.get("tls.client.authServer", "true")
        ),
        test_mode=_bool("tls.test.mode.enable", values.get("tls.test.mode.enable", "false")),
    )
    if config.server_need_client_auth is not ClientAuth.NONE and not (
        config.server_trust_cert_path
    ):
        raise ConfigError(
            "tls.server.trustCertPath",
            f"required by tls.server.need.client.auth={config.server_need_client_auth}",
        )
    return config


@dataclass(frozen=True, slots=True)
class ServerTls:
    """How a listener treats a new connection: `context` is None only when `mode` is DISABLED."""

    mode: TlsMode
    context: ssl.SSLContext | None
    source: TlsConfig | None = None
    """The keys `context` was made from: its files are watched and reloaded (`tlsreload`)."""


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How a client connects: TLS with `context`, or plain text when it is None."""

    context: ssl.SSLContext | None


PLAIN_SERVER: Final = ServerTls(TlsMode.DISABLED, None)
PLAIN_CLIENT: Final = ClientTls(None)


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Both sides of one process's TLS."""

    server: ServerTls = PLAIN_SERVER
    client: ClientTls = PLAIN_CLIENT


def _self_signed() -> tuple[Path, Path]:
    """A throw-away certificate for `tls.test.mode.enable` (RocketMQ: SelfSignedCertificate)."""
    from ferrymq.security.tlscerts import issue_certificate, make_ca

    where = Path(tempfile.mkdtemp(prefix="ferrymq-tls-test-"))
    ca = make_ca(where)
    return issue_certificate(ca, where, "server", hosts=("127.0.0.1", "localhost"))


def server_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The listeners' SSLContext, or None when `tls.server.mode` is disabled."""
    if config.server_mode is TlsMode.DISABLED:
        return None
    cert, key = config.server_cert_path, config.server_key_path
    if cert is None or key is None:
        if not config.test_mode:
            missing = "tls.server.certPath" if cert is None else "tls.server.keyPath"
            raise ConfigError(missing, f"required by tls.server.mode={config.server_mode}")
        cert, key = _self_signed()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key, password=config.server_key_password)
    if config.server_trust_cert_path is not None:
        context.load_verify_locations(cafile=config.server_trust_cert_path)
    context.verify_mode = {
        ClientAuth.NONE: ssl.CERT_NONE,
        ClientAuth.OPTIONAL: ssl.CERT_OPTIONAL,
        ClientAuth.REQUIRE: ssl.CERT_REQUIRED,
    }[config.server_need_client_auth]
    return context


def client_context(config: TlsConfig) -> ssl.SSLContext | None:
    """The clients' SSLContext, or None when `tls.enable` is off."""
    if not config.enable:
        return None
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH,
        cafile=str(config.client_trust_cert_path) if config.client_trust_cert_path else None,
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if config.test_mode or not config.client_auth_server:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.client_cert_path is not None:
        context.load_cert_chain(
            config.client_cert_path,
            config.client_key_path,
            password=config.client_key_password,
        )
    return context


def settings_for(config: TlsConfig, *, server_side: bool = True) -> TlsSettings:
    """Build both sides' contexts from `config` (a client-only process: `server_side=False`).

    Raises:
        ConfigError: a server mode without its certificate, or a certificate, key or CA file
            that does not load (names the key).
    """
    server = PLAIN_SERVER
    try:
        if server_side:
            server = ServerTls(config.server_mode, server_context(config), config)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError("tls.server.certPath", f"cannot load: {exc}") from None
    try:
        client = ClientTls(client_context(config))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError("tls.client.trustCertPath", f"cannot load: {exc}") from None
    return TlsSettings(server, client)


TLS_ENV: Final = "FERRYMQ_TLS"
"""Client-side `tls.*` keys as a JSON object, for a process nothing installed TLS in: Spark's
Python workers (of a Connect worker, which sets it for its children, or of a job given it in
`spark.executorEnv`). Read once, at the first connection."""

_CLIENT_KEYS: Final = (
    "tls.enable",
    "tls.client.certPath",
    "tls.client.keyPath",
    "tls.client.keyPassword",
    "tls.client.trustCertPath",
    "tls.client.authServer",
    "tls.test.mode.enable",
)

_PROCESS: Final[contextvars.ContextVar[TlsSettings]] = contextvars.ContextVar("ferrymq_tls")
_from_env: list[TlsSettings] = []
"""The settings `TLS_ENV` gave, once read (a list: set once, no `global`)."""


def client_env(config: TlsConfig) -> str:
    """`TLS_ENV`'s value for children of a process running `config` (its client side)."""
    values = {
        "tls.enable": str(config.enable).lower(),
        "tls.client.certPath": str(config.client_cert_path or ""),
        "tls.client.keyPath": str(config.client_key_path or ""),
        "tls.client.keyPassword": config.client_key_password or "",
        "tls.client.trustCertPath": str(config.client_trust_cert_path or ""),
        "tls.client.authServer": str(config.client_auth_server).lower(),
        "tls.test.mode.enable": str(config.test_mode).lower(),
    }
    return json.dumps({k: v for k, v in values.items() if v})


def _env_settings() -> TlsSettings:
    if not _from_env:
        raw = os.environ.get(TLS_ENV, "")
        settings = TlsSettings()
        if raw:
            try:
                values = json.loads(raw)
            except ValueError:
                raise ConfigError(TLS_ENV, "not a JSON object") from None
            if not isinstance(values, dict):
                raise ConfigError(TLS_ENV, "not a JSON object")
            keys = {str(k): str(v) for k, v in values.items() if k in _CLIENT_KEYS}
            settings = settings_for(tls_config_from(keys), server_side=False)
        _from_env.append(settings)
    return _from_env[0]


def install(settings: TlsSettings) -> contextvars.Token[TlsSettings]:
    """Make `settings` this context's TLS (a server command calls it before its loop starts)."""
    return _PROCESS.set(settings)


def restore(token: contextvars.Token[TlsSettings]) -> None:
    """Undo the `install` that returned `token`."""
    _PROCESS.reset(token)


def process_server_tls() -> ServerTls:
    """The listeners' TLS in this context (plain when nothing was installed)."""
    settings = _PROCESS.get(None)
    return PLAIN_SERVER if settings is None else settings.server


def process_client_tls() -> ClientTls:
    """The clients' TLS in this context: the installed one, else `TLS_ENV`'s, else plain.

    Raises:
        ConfigError: `TLS_ENV` is set but unusable (names the key).
    """
    settings = _PROCESS.get(None)
    return (_env_settings() if settings is None else settings).client
