"""The TLS of the data source's clients: the `tls` / `tlsTrustCertPath` options made a context.

Owns turning a source's or sink's `TlsOption` into the `ClientTls` its clients connect with, on
the driver and in every executor: `client_tls(option)` makes the clients created inside it use
that TLS (an RpcClient reads its TLS when made). Without the options, clients keep the process's
TLS (`FERRYMQ_TLS`). A context is built once per option value and process.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from ferrymq.security.tls import (
    ClientTls,
    TlsConfig,
    TlsSettings,
    client_context,
    install,
    process_server_tls,
    restore,
)
from ferrymq.spark.options import TlsOption

__all__ = ["client_tls", "made_with"]

T = TypeVar("T")


@functools.lru_cache(maxsize=8)
def _client(option: TlsOption) -> ClientTls:
    trust = Path(option.trust_cert_path) if option.trust_cert_path else None
    return ClientTls(client_context(TlsConfig(enable=option.enable, client_trust_cert_path=trust)))


@contextlib.contextmanager
def client_tls(option: TlsOption | None) -> Iterator[None]:
    """Clients made inside this block use `option`'s TLS (None: the process's)."""
    if option is None:
        yield
        return
    token = install(TlsSettings(server=process_server_tls(), client=_client(option)))
    try:
        yield
    finally:
        restore(token)


def made_with(option: TlsOption | None, make: Callable[[], T]) -> T:
    """`make()` (a client) under `option`'s TLS."""
    with client_tls(option):
        return make()
