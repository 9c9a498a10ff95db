"""ACL 1.0 credentials of the SDK's clients (issue 23): one place that turns keys into a signer."""

from __future__ import annotations

from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import credentials_of

__all__ = ["with_credentials"]


def with_credentials(
    rpc: RpcClient | None, access_key: str | None, secret_key: str | None
) -> RpcClient:
    """`rpc` (or a new client) that signs every request with the keys, when they are given.

    Raises:
        ValueError: only one of the keys is given.
    """
    credentials = credentials_of(access_key, secret_key)
    if rpc is None:
        return RpcClient(credentials=credentials)
    if credentials is not None:
        rpc.credentials = credentials
    return rpc
