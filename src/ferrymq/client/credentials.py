"""ACL 1.0 credentials of the SDK's clients (issue 23): one place that turns keys into a signer."""

from __future__ import annotations

from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import Credentials, credentials_of

__all__ = ["Credentials", "with_credentials"]


def with_credentials(
    rpc: RpcClient | None,
    access_key: str | None,
    secret_key: str | None,
    credentials: Credentials | None = None,
) -> RpcClient:
    """`rpc` (or a new client) that signs every request with the keys, when they are given.

    Raises:
        ValueError: only one of the keys is given, or keys and `credentials` both.
    """
    if credentials is not None and (access_key or secret_key):
        raise ValueError("give access_key/secret_key or credentials, not both")
    credentials = credentials or credentials_of(access_key, secret_key)
    if rpc is None:
        return RpcClient(credentials=credentials)
    if credentials is not None:
        rpc.credentials = credentials
    return rpc
