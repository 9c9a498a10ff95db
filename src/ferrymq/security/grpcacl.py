"""ACL 1.0 on the gRPC endpoint: the 5.x clients' `authorization` header and the access decision.

Owns the pure core of checking a MessagingService v2 call against `plain_acl.yml`, as RocketMQ's
proxy does (it checks ACL itself, then calls the brokers as its own account):

- `parse_authorization` reads RocketMQ's v2 header, `MQv2-HMAC-SHA1 Credential=<AK>[/...],
  SignedHeaders=x-mq-date-time, Signature=<hex>`.
- `grpc_signature` is what the 5.x clients send: hex(HmacSHA1(secretKey, the `x-mq-date-time`
  value)).
- `decide_grpc` is `decide` (`acl.py`) for a call: global white addresses, the account, its own
  white address, the signature (UNAUTHORIZED), then DENY/PUB/SUB of each topic and group the call
  names (FORBIDDEN). No RPC of MessagingService is an admin one.
- `decide_grpc2` is the same for ACL 2.0 (`acl2.py`): the header's access key names a user, the
  signature's secret is its password (UNAUTHORIZED: no header, unknown or disabled user, wrong
  signature), then `acl2.authorize` for each topic and group (FORBIDDEN).

Rules: no I/O, no clock; a secret never in a repr or a message. As RocketMQ, the date is not
checked for freshness (the Python 5.x client writes local time with a `Z`): a captured header
replays, which TLS prevents.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from ferrymq.security.acl import (
    AclConfig,
    Perm,
    address_matches,
    refused_resource,
    shown_key,
)
from ferrymq.security.acl2 import AuthState, UserStatus, UserType, authorize
from ferrymq.security.acl2guard import wanted_access

__all__ = [
    "ALGORITHM",
    "AUTHORIZATION",
    "DATE_TIME",
    "Refusal",
    "decide_grpc",
    "decide_grpc2",
    "grpc_signature",
    "parse_authorization",
]

AUTHORIZATION: Final = "authorization"
DATE_TIME: Final = "x-mq-date-time"
ALGORITHM: Final = "MQv2-HMAC-SHA1"
_MAX_HEADER: Final = 4096
"""A longer `authorization` value is refused unread."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call is refused, and the v2 status it gets."""

    status: Literal["UNAUTHORIZED", "FORBIDDEN"]
    message: str


def parse_authorization(value: str) -> tuple[str, str] | None:
    """(access key, signature) of an `authorization` value; None when it is not one."""
    if len(value) > _MAX_HEADER:
        return None
    algorithm, _, rest = value.strip().partition(" ")
    if algorithm != ALGORITHM:
        return None
    items: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, item = part.strip().partition("=")
        if sep:
            items[key.strip()] = item.strip()
    # the Java client writes Credential=AK/region/service: the access key is the first part
    access_key = items.get("Credential", "").split("/", 1)[0]
    sent = items.get("Signature", "")
    if not access_key or not sent:
        return None
    return access_key, sent


def grpc_signature(secret_key: str, date_time: str) -> str:
    """hex(HmacSHA1(secret_key, date_time)), as the 5.x clients sign."""
    return hmac.digest(secret_key.encode("utf-8"), date_time.encode("utf-8"), "sha1").hex()


def decide_grpc(
    acl: AclConfig,
    *,
    metadata: Mapping[str, str],
    host: str,
    resources: Callable[[], Iterable[tuple[str, Perm]]],
) -> Refusal | None:
    """None if the call may run, else why not.

    `metadata`: the call's headers (lower-case keys). `resources`: the topics and groups (a group
    as its retry topic) the call needs, with the perm; called once the signature is right.
    """
    if any(address_matches(p, host) for p in acl.global_white_remote_addresses):
        return None
    parsed = parse_authorization(metadata.get(AUTHORIZATION, ""))
    if parsed is None:
        return Refusal("UNAUTHORIZED", "No accessKey is configured (no MQv2-HMAC-SHA1 header)")
    access_key, sent = parsed
    account = acl.accounts.get(access_key)
    if account is None:
        return Refusal("UNAUTHORIZED", f"No acl config for {shown_key(access_key)}")
    if account.white_remote_address and address_matches(account.white_remote_address, host):
        return None
    expected = grpc_signature(account.secret_key, metadata.get(DATE_TIME, ""))
    if not hmac.compare_digest(expected.encode("ascii"), sent.lower().encode("utf-8", "replace")):
        return Refusal(
            "UNAUTHORIZED", f"Check signature failed for accessKey={shown_key(access_key)}"
        )
    refused = refused_resource(access_key, account, resources)
    return None if refused is None else Refusal("FORBIDDEN", refused)


def decide_grpc2(
    state: AuthState,
    *,
    metadata: Mapping[str, str],
    host: str,
    resources: Callable[[], Iterable[tuple[str, Perm]]],
    authorization: bool = True,
) -> Refusal | None:
    """ACL 2.0's `decide_grpc`: None if the call may run, else why not.

    The user is the header's access key and its password the signing secret (as
    `acl2.authenticate` for remoting); with `authorization`, a Normal user needs its ACL's
    Pub / Sub on each of `resources` (a group as its retry topic).
    """
    parsed = parse_authorization(metadata.get(AUTHORIZATION, ""))
    if parsed is None:
        return Refusal("UNAUTHORIZED", "No accessKey is configured (no MQv2-HMAC-SHA1 header)")
    username, sent = parsed
    user = state.users.get(username)
    if user is None:
        return Refusal("UNAUTHORIZED", f"User:{shown_key(username)} is not found")
    if user.status is UserStatus.DISABLE:
        return Refusal("UNAUTHORIZED", f"User:{shown_key(username)} is disabled")
    expected = grpc_signature(user.password, metadata.get(DATE_TIME, ""))
    if not hmac.compare_digest(expected.encode("ascii"), sent.lower().encode("utf-8", "replace")):
        return Refusal("UNAUTHORIZED", f"check signature failed for User:{shown_key(username)}")
    if not authorization or user.user_type is UserType.SUPER:
        return None
    for resource, needed in resources():
        # QueryRoute's PUB or SUB: a policy allowing either action matches
        wanted, actions = wanted_access(
            resource, Perm.PUB | Perm.SUB if needed & Perm.ANY else needed
        )
        remark = authorize(state, user, wanted, actions, host)
        if remark is not None:
            return Refusal("FORBIDDEN", remark)
    return None
