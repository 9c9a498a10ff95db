"""The Spark source and sink over TLS by their own options (`tls`, `tlsTrustCertPath`), not the
FERRYMQ_TLS environment: a TLS-only NameServer and broker (real processes, a CA made here)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ferrymq.client.admin import AdminClient
from ferrymq.security.tlscerts import issue_certificate, make_ca
from ferrymq.spark.clienttls import made_with
from ferrymq.spark.options import OptionError, TlsOption, parse_read_options, parse_write_options

from ..system.procs import start

pytestmark = pytest.mark.spark


def test_tls_options_are_checked() -> None:
    base = {"servers": "127.0.0.1:9876", "subscribe": "T"}
    with pytest.raises(OptionError, match="'tls': must be true or false, not 'yes'"):
        parse_read_options({**base, "tls": "yes"}, streaming=False)
    with pytest.raises(OptionError, match=r"tlsTrustCertPath.*only with tls=true"):
        parse_write_options({"servers": "x:1", "tlsTrustCertPath": "/etc/hosts"})
    with pytest.raises(OptionError, match="not a readable PEM CA file"):
        parse_read_options(
            {**base, "tls": "true", "tlsTrustCertPath": "/nonexistent/ca.pem"}, streaming=False
        )
    assert parse_read_options({**base, "TLS": "true"}, streaming=False).tls == TlsOption(True)
    no_tls = parse_read_options(base, streaming=False)
    assert no_tls.tls is None  # the process's TLS (FERRYMQ_TLS) applies


def test_spark_writes_and_reads_a_tls_broker_with_the_options(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without FERRYMQ_TLS, only the options can reach these TLS-only ports."""
    monkeypatch.delenv("FERRYMQ_TLS", raising=False)
    ca = make_ca(tmp_path / "tls")
    cert, key = issue_certificate(ca, tmp_path / "tls", "server")
    tls = ["--tls", "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca.cert_path)]
    namesrv = start(["namesrv", "--listen", "127.0.0.1:0", *tls], tmp_path, "namesrv")
    try:
        args = ["broker", "--listen", "127.0.0.1:0", "--namesrv", namesrv.addr]
        args += ["--store-dir", str(tmp_path / "store"), "--register-name-server-period", "1000"]
        broker = start([*args, *tls], tmp_path, "broker")
        try:
            option = TlsOption(True, str(ca.cert_path))

            async def create() -> None:
                async with made_with(option, lambda: AdminClient(namesrv.addr)) as admin:
                    await admin.create_topic("SparkTls", 2)

            asyncio.run(create())
            keys = {"tls": "true", "tlsTrustCertPath": str(ca.cert_path)}
            rows = spark.createDataFrame([("a",), ("b",), ("c",)], ["value"])
            writer = rows.write.format("ferrymq").option("servers", namesrv.addr)
            writer.option("topic", "SparkTls").options(**keys).mode("append").save()

            def reader() -> Any:
                read = spark.read.format("ferrymq").option("servers", namesrv.addr)
                return read.option("subscribe", "SparkTls")

            values = sorted(r.value.decode() for r in reader().options(**keys).load().collect())
            assert values == ["a", "b", "c"]
        finally:
            broker.stop()
    finally:
        namesrv.stop()
