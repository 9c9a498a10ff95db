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
- `stale_date` refuses a rightly signed call whose `x-mq-date-time` (`20231025T101010Z`, what the
  5.x clients sign) is missing, malformed or further than `max_skew` seconds from `now`
  (UNAUTHORIZED): a captured call replays only inside that window. RocketMQ checks no date.

Rules: no I/O, no clock (the caller passes `now`); a secret never in a repr or a message.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
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
    "DEFAULT_MAX_CLOCK_SKEW",
    "Refusal",
    "decide_grpc",
    "decide_grpc2",
    "grpc_signature",
    "parse_authorization",
    "parse_date_time",
    "stale_date",
]

AUTHORIZATION: Final = "authorization"
DATE_TIME: Final = "x-mq-date-time"
ALGORITHM: Final = "MQv2-HMAC-SHA1"
_MAX_HEADER: Final = 4096
"""A longer `authorization` value is refused unread."""
DEFAULT_MAX_CLOCK_SKEW: Final = 14 * 3600 + 900.0
"""Seconds a signed `x-mq-date-time` may be from the endpoint's clock, either way: AWS SigV4's
15 minutes beyond the widest time-zone offset (UTC-12 .. UTC+14), because the official 5.x
Python and Java clients stamp their host's local time with a `Z`. A fleet on UTC clocks sets 900."""


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


def parse_date_time(value: str) -> float | None:
    """Epoch seconds of `yyyyMMddTHHmmssZ` (UTC); None when the value is not one."""
    if len(value) != 16 or value[8] != "T" or value[15] != "Z":
        return None
    day, clock = value[:8], value[9:15]
    if not (day.isascii() and day.isdigit() and clock.isascii() and clock.isdigit()):
        return None
    try:
        return datetime(
            int(day[:4]),
            int(day[4:6]),
            int(day[6:]),
            int(clock[:2]),
            int(clock[2:4]),
            int(clock[4:]),
            tzinfo=UTC,
        ).timestamp()
    except ValueError:  # month 13, 25 h, ...
        return None


def stale_date(date_time: str, *, now: float, max_skew: float) -> Refusal | None:
    """UNAUTHORIZED when `date_time` is missing, malformed or over `max_skew` s from `now`."""
    signed = parse_date_time(date_time)
    if signed is None:
        return Refusal(
            "UNAUTHORIZED", f"{DATE_TIME} is missing or not yyyyMMddTHHmmssZ: request refused"
        )
    if abs(signed - now) > max_skew:
        return Refusal(
            "UNAUTHORIZED",
            f"{DATE_TIME} {date_time} is outside the window of {max_skew:g} s around the "
            "endpoint's clock (UTC): replayed or skewed request refused",
        )
    return None


def decide_grpc(
    acl: AclConfig,
    *,
    metadata: Mapping[str, str],
    host: str,
    resources: Callable[[], Iterable[tuple[str, Perm]]],
    now: float,
    max_skew: float = DEFAULT_MAX_CLOCK_SKEW,
) -> Refusal | None:
    """None if the call may run, else why not.

    `metadata`: the call's headers (lower-case keys). `resources`: the topics and groups (a group
    as its retry topic) the call needs, with the perm; called once the signature is right.
    `now`: the endpoint's clock (epoch s) `x-mq-date-time` must be within `max_skew` s of.
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
    date_time = metadata.get(DATE_TIME, "")
    expected = grpc_signature(account.secret_key, date_time)
    if not hmac.compare_digest(expected.encode("ascii"), sent.lower().encode("utf-8", "replace")):
        return Refusal(
            "UNAUTHORIZED", f"Check signature failed for accessKey={shown_key(access_key)}"
        )
    stale = stale_date(date_time, now=now, max_skew=max_skew)
    if stale is not None:
        return stale
    refused = refused_resource(access_key, account, resources)
    return None if refused is None else Refusal("FORBIDDEN", refused)


def decide_grpc2(
    state: AuthState,
    *,
    metadata: Mapping[str, str],
    host: str,
    resources: Callable[[], Iterable[tuple[str, Perm]]],
    now: float,
    max_skew: float = DEFAULT_MAX_CLOCK_SKEW,
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
    date_time = metadata.get(DATE_TIME, "")
    expected = grpc_signature(user.password, date_time)
    if not hmac.compare_digest(expected.encode("ascii"), sent.lower().encode("utf-8", "replace")):
        return Refusal("UNAUTHORIZED", f"check signature failed for User:{shown_key(username)}")
    stale = stale_date(date_time, now=now, max_skew=max_skew)
    if stale is not None:
        return stale
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
