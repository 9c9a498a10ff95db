"""ACL 1.0 and 2.0 on the endpoint's gRPC port: what each RPC needs, the check before its handler.

Owns the mapping of MessagingService v2 requests to the topics and groups they touch (as
RocketMQ's proxy classifies them: sends and EndTransaction PUB on the topic, QueryRoute PUB or
SUB, receives, acks, offsets and pulls SUB on the topic and the group, Telemetry settings PUB on
published topics or SUB on the group and its topics) and `GrpcGuard`, which decides a call from
its metadata with `security.grpcacl.decide_grpc` against the `plain_acl.yml` the brokers use
(reloaded on change), or with ACL 2.0 `decide_grpc2` against the users and ACLs the
controllers keep (`users`, pulled by `namesrv/auth.py`'s `AuthPull`), reading the clock once per
call for the signed date's window (`max_clock_skew`). The endpoint calls the
brokers as its own account; the client's account is checked here, as RocketMQ's proxy checks
ACL itself. Refusals are counted and logged (first 20, then one in 1000), never with a secret.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import unquote

from ferrymq.security.acl import RETRY_PREFIX, Perm
from ferrymq.security.acl2guard import AuthSource
from ferrymq.security.aclguard import AclFile, peer_host
from ferrymq.security.grpcacl import DEFAULT_MAX_CLOCK_SKEW, Refusal, decide_grpc, decide_grpc2

__all__ = ["GrpcGuard", "call_host", "needs", "settings_needs"]

log = logging.getLogger(__name__)

_LOGGED: Final = 20
_MAX_RESOURCES: Final = 1024
"""A request naming more topics and groups than this is refused (huge batches)."""

_TOPIC_SUB_GROUP_SUB: Final = frozenset(
    {
        "QueryAssignment",
        "AckMessage",
        "ChangeInvisibleDuration",
        "ForwardMessageToDeadLetterQueue",
    }
)
_QUEUE_SUB_GROUP_SUB: Final = frozenset(
    {"ReceiveMessage", "PullMessage", "UpdateOffset", "GetOffset"}
)


def _group(request: Any) -> tuple[str, Perm]:
    return RETRY_PREFIX + request.group.name, Perm.SUB


def needs(name: str, request: Any) -> list[tuple[str, Perm]]:
    """The topics and groups (a group as its retry topic) RPC `name` touches, with the perm."""
    if name == "QueryRoute":
        return [(request.topic.name, Perm.ANY)]
    if name == "SendMessage":
        return [(m.topic.name, Perm.PUB) for m in request.messages]
    if name in ("EndTransaction", "RecallMessage"):
        return [(request.topic.name, Perm.PUB)]
    if name in ("Heartbeat", "NotifyClientTermination"):
        return [_group(request)] if request.group.name else []
    if name in _TOPIC_SUB_GROUP_SUB:
        return [(request.topic.name, Perm.SUB), _group(request)]
    if name in _QUEUE_SUB_GROUP_SUB:
        return [(request.message_queue.topic.name, Perm.SUB), _group(request)]
    if name == "QueryOffset":
        return [(request.message_queue.topic.name, Perm.SUB)]
    if name == "SyncLiteSubscription":
        return [(request.topic.name, Perm.SUB), _group(request)]
    return []  # Telemetry: its settings, one command at a time (`settings_needs`)


def settings_needs(settings: Any) -> list[tuple[str, Perm]]:
    """What a Telemetry settings command claims: PUB on published topics, SUB on a group's."""
    wanted: list[tuple[str, Perm]] = []
    if settings.HasField("publishing"):
        wanted += [(t.name, Perm.PUB) for t in settings.publishing.topics]
    if settings.HasField("subscription"):
        wanted.append((RETRY_PREFIX + settings.subscription.group.name, Perm.SUB))
        wanted += [(e.topic.name, Perm.SUB) for e in settings.subscription.subscriptions]
    return wanted


def call_host(peer: str) -> str:
    """The client's host from grpcio's `context.peer()` (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5`).

    grpcio percent-encodes an IPv6 peer (`ipv6:%5B::1%5D:5`): decoded, or no ACL 2.0 sourceIps
    block (nor ACL 1.0 white address) would ever match it, Allow nor Deny.
    """
    scheme, sep, rest = peer.partition(":")
    return peer_host(unquote(rest) if sep and scheme in ("ipv4", "ipv6") else peer)


def _metadata(pairs: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, value in pairs or ():
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        found.setdefault(key.lower(), text)
    return found


class GrpcGuard:
    """Checks each gRPC call against `plain_acl.yml` or ACL 2.0's users; counts refusals."""

    def __init__(
        self,
        acl: AclFile | None = None,
        *,
        users: AuthSource | None = None,
        authorization: bool = True,
        max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW,
    ) -> None:
        """`acl`: ACL 1.0; else `users`: ACL 2.0 (`authorization`: check each user's ACL too).

        `max_clock_skew`: seconds a signed `x-mq-date-time` may be from this host's clock.
        """
        if (acl is None) == (users is None):
            raise ValueError("GrpcGuard: ACL 1.0 (acl) or 2.0 (users), one of them")
        if not max_clock_skew > 0:
            raise ValueError(f"GrpcGuard: max_clock_skew must be > 0 s, not {max_clock_skew}")
        self.acl = acl
        self.users = users
        self.authorization = authorization
        self.max_clock_skew = max_clock_skew
        self.denied = 0
        """Calls refused since start."""

    def check(
        self,
        name: str,
        metadata: Iterable[tuple[str, str | bytes]] | None,
        peer: str,
        wanted: list[tuple[str, Perm]],
    ) -> Refusal | None:
        """None if the call may run, else its refusal (counted and logged)."""
        if len(wanted) > _MAX_RESOURCES:
            refusal: Refusal | None = Refusal(
                "FORBIDDEN", f"{name} names {len(wanted)} topics and groups (> {_MAX_RESOURCES})"
            )
        elif self.users is not None:
            refusal = decide_grpc2(
                self.users.state,
                metadata=_metadata(metadata),
                host=call_host(peer),
                resources=lambda: wanted,
                now=time.time(),
                max_skew=self.max_clock_skew,
                authorization=self.authorization,
            )
        else:
            assert self.acl is not None
            refusal = decide_grpc(
                self.acl.config,
                metadata=_metadata(metadata),
                host=call_host(peer),
                resources=lambda: wanted,
                now=time.time(),
                max_skew=self.max_clock_skew,
            )
        if refusal is not None:
            self.denied += 1
            if self.denied <= _LOGGED or self.denied % 1000 == 0:
                log.warning(
                    "proxy: %s from %s refused %s (%d so far): %s",
                    name,
                    peer,
                    refusal.status,
                    self.denied,
                    refusal.message,
                )
        return refusal
