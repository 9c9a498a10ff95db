"""HA link authentication: the slave proves it holds a cluster admin account's secret.

ferrymq's own (RocketMQ's HA handshake carries no credentials). When the master's broker has ACL
on, the master sends a fresh random nonce as soon as a slave connects; the slave answers with an
access key and HMAC-SHA256(secretKey, "ferrymq-ha-auth" | nonce | slave broker id). The master
looks the key up among the ACL's admin accounts (the accounts internal request codes need) and
serves nothing before the proof matches. A fresh nonce per connection means a recorded answer
is worth nothing on another connection; the secret never travels.

Pure: no I/O (the nonce is handed in).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable
from typing import Final

from ferrymq.wire.ha import NONCE_BYTES, PROOF_BYTES, SlaveAuth

__all__ = ["SecretOf", "check_proof", "proof"]

SecretOf = Callable[[str], str | None]
"""An admin account's secret key by its access key (None: no such admin account)."""

_LABEL: Final = b"ferrymq-ha-auth\x00"
_BROKER_ID: Final = struct.Struct(">q")


def proof(secret_key: str, nonce: bytes, broker_id: int) -> bytes:
    """The 32-byte answer to `nonce` for slave `broker_id`."""
    message = _LABEL + nonce + _BROKER_ID.pack(broker_id)
    return hmac.new(secret_key.encode(), message, hashlib.sha256).digest()


def check_proof(secret_of: SecretOf, answer: SlaveAuth, nonce: bytes, broker_id: int) -> str | None:
    """None when `answer` proves an admin account for `nonce` and `broker_id`, else why not.

    The reason names the access key (never a secret), so the master's log says who failed.
    """
    if len(nonce) != NONCE_BYTES or len(answer.proof) != PROOF_BYTES:
        return "malformed nonce or proof"
    secret = secret_of(answer.access_key)
    if secret is None:
        return f"access key {answer.access_key[:64]!r} is not an admin account"
    if not hmac.compare_digest(proof(secret, nonce, broker_id), answer.proof):
        return f"wrong proof for access key {answer.access_key[:64]!r}"
    return None
