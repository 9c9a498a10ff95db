"""RocketMQ's tls.* keys (issue 23): typed, defaults that fail closed, errors naming the key."""

from pathlib import Path

import pytest

from ferrymq.config import ConfigError
from ferrymq.security.tls import (
    TLS_KEYS,
    ClientAuth,
    TlsMode,
    settings_for,
    split_tls_keys,
    tls_config_from,
)
from ferrymq.security.tlscerts import issue_certificate, make_ca


def test_tls_enable_alone_means_enforcing_servers_and_verifying_clients() -> None:
    config = tls_config_from({"tlsEnable": "true"})
    assert config.enable
    assert config.server_mode is TlsMode.ENFORCING
    assert config.client_auth_server
    assert tls_config_from({}).server_mode is TlsMode.DISABLED
    assert tls_config_from({"tls.enable": "true", "tls.server.mode": "permissive"}).server_mode is (
        TlsMode.PERMISSIVE
    )


def test_auth_client_alone_requires_a_client_certificate(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    values = {"tls.server.authClient": "true", "tls.server.trustCertPath": str(ca.cert_path)}
    assert tls_config_from(values).server_need_client_auth is ClientAuth.REQUIRE


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"tls.server.mode": "sometimes"}, "tls.server.mode"),
        ({"tlsEnable": "yes"}, "tlsEnable"),
        ({"tls.server.certPath": "/nonexistent/cert.pem"}, "tls.server.certPath"),
        ({"tls.server.need.client.auth": "require"}, "tls.server.trustCertPath"),
        ({"tls.client.authServer": "maybe"}, "tls.client.authServer"),
    ],
)
def test_a_bad_value_names_its_key(values: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as error:
        tls_config_from(values)
    assert error.value.key == key


def test_a_tls_server_without_its_certificate_fails_closed_unless_in_test_mode() -> None:
    with pytest.raises(ConfigError) as error:
        settings_for(tls_config_from({"tls.server.mode": "enforcing"}))
    assert error.value.key == "tls.server.certPath"
    test_mode = {"tls.server.mode": "enforcing", "tls.test.mode.enable": "true"}
    assert settings_for(tls_config_from(test_mode)).server.context is not None


def test_an_encrypted_key_loads_with_its_password_and_not_without(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    ca = make_ca(tmp_path)
    cert, key = issue_certificate(ca, tmp_path, "server")
    loaded = serialization.load_pem_private_key(key.read_bytes(), None)
    key.write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"s3cret"),
        )
    )
    values = {"tls.server.mode": "enforcing", "tls.server.certPath": str(cert)}
    values["tls.server.keyPath"] = str(key)
    with pytest.raises(ConfigError):
        settings_for(tls_config_from({**values, "tls.server.keyPassword": "wrong"}))
    config = tls_config_from({**values, "tls.server.keyPassword": "s3cret"})
    assert "s3cret" not in repr(config)
    assert settings_for(config).server.context is not None


def test_split_takes_every_tls_key_and_only_them() -> None:
    values = dict.fromkeys(TLS_KEYS, "x") | {"brokerName": "a", "tls.config.file": "f"}
    tls, rest = split_tls_keys(values)
    assert set(tls) == set(TLS_KEYS)
    assert rest == {"brokerName": "a", "tls.config.file": "f"}  # not honoured: still refused


def test_a_process_nothing_installed_tls_in_takes_the_client_side_from_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ferrymq.security import tls

    ca = make_ca(tmp_path)
    config = tls_config_from({"tls.enable": "true", "tls.client.trustCertPath": str(ca.cert_path)})
    monkeypatch.setenv(tls.TLS_ENV, tls.client_env(config))
    monkeypatch.setattr(tls, "_from_env", [])
    context = tls.process_client_tls().context
    assert context is not None
    assert context.get_ca_certs()[0]["subject"] == ((("commonName", "ferrymq local CA"),),)
    assert tls.process_server_tls().context is None  # servers never take TLS from there
    monkeypatch.setenv(tls.TLS_ENV, "[1]")
    monkeypatch.setattr(tls, "_from_env", [])
    with pytest.raises(ConfigError):
        tls.process_client_tls()
