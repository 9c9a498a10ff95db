"""ACL 2.0 as RocketMQ 5.3 does it: users, ACL policies, and the decisions over them.

Owns the pure core of issue 23's ACL 2.0 (RocketMQ's `auth` module):

- `User`: username, password, userType Super/Normal, userStatus enable/disable
  (`auth/authentication/model/User.java`).
- `Resource` keys `Topic:name`, `Group:name`, `Cluster:name` with pattern LITERAL, PREFIXED
  (`Topic:order-*`) or ANY (`Topic:*`), and `*` for every resource; a `PolicyEntry` holds a
  resource, actions (PUB, SUB, CREATE, UPDATE, DELETE, GET, LIST, ALL), source IPs (addresses or
  CIDR blocks; none: any) and a decision ALLOW/DENY; an `Acl` is a subject's (`User:name`)
  CUSTOM and DEFAULT policies.
- `authenticate` is `DefaultAuthenticationHandler`: the request's AccessKey names a user, who
  must be enabled, and its Signature is ACL 1.0's HMAC with the password as secret key.
- `authorize` is `AclAuthorizationHandler`: a Super user may do anything; otherwise the entries
  of the subject's CUSTOM policy that match the resource, an action and the source IP (the
  DEFAULT policy's only when none does) are ordered most specific first (a named type before
  `*`, LITERAL before PREFIXED before ANY, a longer prefix first) and DENY before ALLOW at equal
  precision; the first decides, and no match is a refusal.
- Admin commands (create/update/delete user and ACL) are decided against the state into an
  event or a refusal (`decide_command`), and events are applied (`apply`): the same event
  replayed from the metadata log gives every replica the same state.

Rules: no I/O, no clock; a password never appears in a repr, an error or a remark.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

from ferrymq.errors import FerryError
from ferrymq.security.acl import ACCESS_KEY, SIGNATURE, signature

__all__ = [
    "Acl",
    "Acl2Error",
    "AclDeleted",
    "AclPut",
    "Action",
    "AuthState",
    "Decision",
    "Event",
    "PolicyEntry",
    "PolicyType",
    "Resource",
    "ResourcePattern",
    "ResourceType",
    "User",
    "UserDeleted",
    "UserPut",
    "UserStatus",
    "UserType",
    "acl_from_info",
    "acl_info",
    "apply",
    "auth_events",
    "authenticate",
    "authorize",
    "create_acl",
    "create_user",
    "decode_state",
    "delete_acl",
    "delete_user",
    "encode_state",
    "event_from_json",
    "event_to_json",
    "replay",
    "update_user",
    "user_from_info",
    "user_info",
]

_SHOWN: Final = 64
E = TypeVar("E", bound=enum.StrEnum)
MAX_NAME_CHARS: Final = 1024


class Acl2Error(FerryError, ValueError):
    """A malformed user, resource or policy; or an admin command the state refuses."""


class UserType(enum.StrEnum):
    """RocketMQ's userType."""

    SUPER = "Super"
    NORMAL = "Normal"


class UserStatus(enum.StrEnum):
    """RocketMQ's userStatus: a disabled user is refused."""

    ENABLE = "enable"
    DISABLE = "disable"


class ResourceType(enum.StrEnum):
    """What a resource key names (`Any` only as `*`)."""

    ANY = "Any"
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"


class ResourcePattern(enum.StrEnum):
    """How a resource's name matches."""

    ANY = "ANY"
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Action(enum.StrEnum):
    """What a request does to a resource."""

    ALL = "All"
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"


class Decision(enum.StrEnum):
    """A policy entry's verdict."""

    ALLOW = "Allow"
    DENY = "Deny"


class PolicyType(enum.StrEnum):
    """CUSTOM entries are consulted first; DEFAULT ones only when none matches."""

    CUSTOM = "Custom"
    DEFAULT = "Default"


def _enum(kind: type[E], text: str, what: str) -> E:
    for member in kind:
        if member.value.lower() == text.strip().lower():
            return member
    choices = ", ".join(m.value for m in kind)
    raise Acl2Error(f"{what} {text[:_SHOWN]!r} is not one of {choices}")


def _name(text: str, what: str) -> str:
    if not text or len(text) > MAX_NAME_CHARS or any(c.isspace() or c == "," for c in text):
        raise Acl2Error(
            f"{what} {text[:_SHOWN]!r} must be 1-{MAX_NAME_CHARS} characters, no blanks"
        )
    return text


@dataclass(frozen=True, slots=True)
class User:
    """An account of ACL 2.0: the username is the AccessKey, the password the SecretKey."""

    username: str
    password: str = field(repr=False)
    user_type: UserType = UserType.NORMAL
    status: UserStatus = UserStatus.ENABLE

    def __post_init__(self) -> None:
        _name(self.username, "username")
        if not self.password:
            raise Acl2Error(f"user {self.username[:_SHOWN]}: the password is empty")

    @property
    def subject(self) -> str:
        """The subject key its ACL is stored under."""
        return f"User:{self.username}"


@dataclass(frozen=True, slots=True)
class Resource:
    """What a policy entry names: a type, a name and how the name matches."""

    type: ResourceType
    name: str = ""
    pattern: ResourcePattern = ResourcePattern.LITERAL

    @classmethod
    def parse(cls, key: str) -> Resource:
        """`*`, `Topic:*`, `Topic:prefix*` or `Topic:name` (types Topic, Group, Cluster).

        Raises:
            Acl2Error: anything else.
        """
        key = key.strip()
        if key == "*":
            return cls(ResourceType.ANY, "", ResourcePattern.ANY)
        kind, sep, name = key.partition(":")
        if not sep:
            raise Acl2Error(f"resource {key[:_SHOWN]!r} is not Type:name or *")
        rtype = _enum(ResourceType, kind, "resource type")
        if rtype is ResourceType.ANY:
            raise Acl2Error(f"resource {key[:_SHOWN]!r}: write * for every resource")
        if name == "*":
            return cls(rtype, "", ResourcePattern.ANY)
        if name.endswith("*"):
            return cls(rtype, _name(name[:-1], "resource name"), ResourcePattern.PREFIXED)
        return cls(rtype, _name(name, "resource name"), ResourcePattern.LITERAL)

    @property
    def key(self) -> str:
        """The text `parse` reads back."""
        if self.type is ResourceType.ANY:
            return "*"
        if self.pattern is ResourcePattern.ANY:
            return f"{self.type.value}:*"
        star = "*" if self.pattern is ResourcePattern.PREFIXED else ""
        return f"{self.type.value}:{self.name}{star}"

    def matches(self, wanted: Resource) -> bool:
        """Whether this (a policy's) resource covers `wanted` (a request's, literal)."""
        if self.type is ResourceType.ANY:
            return True
        if self.type is not wanted.type:
            return False
        if self.pattern is ResourcePattern.ANY:
            return True
        if self.pattern is ResourcePattern.PREFIXED:
            return wanted.name.startswith(self.name)
        return wanted.name == self.name

    def _rank(self) -> tuple[int, int, int]:
        """Sort key, most specific first."""
        pattern = {ResourcePattern.LITERAL: 0, ResourcePattern.PREFIXED: 1, ResourcePattern.ANY: 2}
        return (int(self.type is ResourceType.ANY), pattern[self.pattern], -len(self.name))


def _source_ip(text: str) -> str:
    try:
        ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise Acl2Error(f"sourceIp {text[:_SHOWN]!r} is not an address or CIDR block") from None
    return text.strip()


def _ip_in(host: str, blocks: Iterable[str]) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(block, strict=False) for block in blocks)


@dataclass(frozen=True, slots=True)
class PolicyEntry:
    """One rule: a resource, the actions it covers, from which addresses, allow or deny."""

    resource: Resource
    actions: frozenset[Action]
    decision: Decision = Decision.ALLOW
    source_ips: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        resource: str,
        actions: Iterable[str],
        decision: str = "Allow",
        source_ips: Iterable[str] = (),
    ) -> PolicyEntry:
        """Parse an entry from the admin command's texts.

        Raises:
            Acl2Error: a bad resource, action, decision or address.
        """
        parsed = frozenset(_enum(Action, a, "action") for a in actions if a.strip())
        if not parsed:
            raise Acl2Error(f"policy of {resource[:_SHOWN]!r} has no action")
        ips = tuple(_source_ip(ip) for ip in source_ips if ip.strip())
        return cls(Resource.parse(resource), parsed, _enum(Decision, decision, "decision"), ips)

    def matches(self, resource: Resource, actions: frozenset[Action], host: str) -> bool:
        """RocketMQ's isMatchResource, isMatchAction and isMatchEnvironment together."""
        if not self.resource.matches(resource):
            return False
        if Action.ALL not in self.actions and not self.actions & actions:
            return False
        return not self.source_ips or _ip_in(host, self.source_ips)


@dataclass(frozen=True, slots=True)
class Acl:
    """A subject's policies: entries by policy type, one entry per resource in each."""

    subject: str
    policies: Mapping[PolicyType, tuple[PolicyEntry, ...]]


@dataclass(frozen=True, slots=True)
class AuthState:
    """Every user and ACL of a cluster (or broker group)."""

    users: Mapping[str, User] = field(default_factory=dict)
    acls: Mapping[str, Acl] = field(default_factory=dict)


# ---------------------------------------------------------------------- decisions on requests


def authenticate(
    state: AuthState, fields: Mapping[str, str], body: bytes, version: int
) -> tuple[User | None, str | None]:
    """The signing user, or why the request is refused (the remark of its answer)."""
    username = fields.get(ACCESS_KEY)
    if not username:
        return None, "No accessKey is configured"
    shown = username[:_SHOWN]
    user = state.users.get(username)
    if user is None:
        return None, f"User:{shown} is not found"
    if user.status is UserStatus.DISABLE:
        return None, f"User:{shown} is disabled"
    expected = signature(fields, body, user.password, version).encode("ascii")
    sent = fields.get(SIGNATURE, "").encode("utf-8", "surrogatepass")
    if not hmac.compare_digest(expected, sent):
        return None, f"check signature failed for User:{shown}"
    return user, None


def _precedence(entry: PolicyEntry) -> tuple[tuple[int, int, int], int]:
    return entry.resource._rank(), int(entry.decision is not Decision.DENY)


def authorize(
    state: AuthState, user: User, resource: Resource, actions: frozenset[Action], host: str
) -> str | None:
    """None when `user` may do `actions` on `resource` from `host`, else why not."""
    if user.user_type is UserType.SUPER:
        return None
    acl = state.acls.get(user.subject)
    what = f"The {user.subject[:_SHOWN]} does not have permission to access {resource.key}"
    if acl is None:
        return f"{what}: no matched acl policies"
    matched: list[PolicyEntry] = []
    for policy_type in (PolicyType.CUSTOM, PolicyType.DEFAULT):
        matched = [
            e for e in acl.policies.get(policy_type, ()) if e.matches(resource, actions, host)
        ]
        if matched:
            break
    if not matched:
        return f"{what}: no matched acl policies"
    if min(matched, key=_precedence).decision is Decision.DENY:
        return f"{what}: the acl policy's decision is deny"
    return None


# ---------------------------------------------------------------------- admin commands, events


@dataclass(frozen=True, slots=True)
class UserPut:
    """A user created or replaced."""

    user: User


@dataclass(frozen=True, slots=True)
class UserDeleted:
    """A user and its ACL removed."""

    username: str


@dataclass(frozen=True, slots=True)
class AclPut:
    """A subject's ACL created or replaced (merged by the deciding command)."""

    acl: Acl


@dataclass(frozen=True, slots=True)
class AclDeleted:
    """A subject's ACL removed."""

    subject: str


Event = UserPut | UserDeleted | AclPut | AclDeleted


def create_user(state: AuthState, user: User) -> Event:
    """Raises Acl2Error: the user exists."""
    if user.username in state.users:
        raise Acl2Error(f"The user of {user.username[:_SHOWN]} is existed")
    return UserPut(user)


def update_user(
    state: AuthState,
    username: str,
    *,
    password: str | None = None,
    user_type: UserType | None = None,
    status: UserStatus | None = None,
) -> Event:
    """The user with the given fields changed. Raises Acl2Error: no such user."""
    old = state.users.get(username)
    if old is None:
        raise Acl2Error(f"The user of {username[:_SHOWN]} is not exist")
    changed = replace(
        old,
        password=password or old.password,
        user_type=user_type or old.user_type,
        status=status or old.status,
    )
    return UserPut(changed)


def delete_user(state: AuthState, username: str) -> Event:
    """Raises Acl2Error: no such user."""
    if username not in state.users:
        raise Acl2Error(f"The user of {username[:_SHOWN]} is not exist")
    return UserDeleted(username)


def _merged(old: tuple[PolicyEntry, ...], new: Iterable[PolicyEntry]) -> tuple[PolicyEntry, ...]:
    entries = {e.resource: e for e in old}
    for entry in new:
        entries[entry.resource] = entry
    return tuple(entries.values())


def create_acl(
    state: AuthState,
    subject: str,
    entries: Iterable[PolicyEntry],
    policy_type: PolicyType = PolicyType.CUSTOM,
) -> Event:
    """A subject's ACL with `entries` added (an entry for a resource it has replaces that one).

    RocketMQ's createAcl and updateAcl both merge into an existing ACL this way.

    Raises:
        Acl2Error: the subject is not a user, or no entry is given.
    """
    kind, _, username = subject.partition(":")
    if kind != "User" or username not in state.users:
        raise Acl2Error(f"The subject of {subject[:_SHOWN]} is not exist")
    new = tuple(entries)
    if not new:
        raise Acl2Error(f"the acl of {subject[:_SHOWN]} has no policy entry")
    old = state.acls.get(subject)
    policies = dict(old.policies) if old is not None else {}
    policies[policy_type] = _merged(policies.get(policy_type, ()), new)
    return AclPut(Acl(subject, policies))


def delete_acl(
    state: AuthState,
    subject: str,
    resources: Iterable[Resource] = (),
    policy_type: PolicyType | None = None,
) -> Event:
    """The subject's ACL without the entries of `resources` (none named: the whole ACL).

    Raises:
        Acl2Error: the subject has no ACL.
    """
    old = state.acls.get(subject)
    if old is None:
        raise Acl2Error(f"The acl of {subject[:_SHOWN]} is not exist")
    gone = frozenset(resources)
    if not gone:
        return AclDeleted(subject)
    policies = {
        kind: tuple(e for e in entries if policy_type not in (None, kind) or e.resource not in gone)
        for kind, entries in old.policies.items()
    }
    if not any(policies.values()):
        return AclDeleted(subject)
    return AclPut(Acl(subject, policies))


def apply(state: AuthState, event: Event) -> AuthState:
    """The state after `event` (a new state; the old one is unchanged)."""
    users, acls = dict(state.users), dict(state.acls)
    match event:
        case UserPut(user):
            users[user.username] = user
        case UserDeleted(username):
            users.pop(username, None)
            acls.pop(f"User:{username}", None)
        case AclPut(acl):
            acls[acl.subject] = acl
        case AclDeleted(subject):
            acls.pop(subject, None)
    return AuthState(users, acls)


# ---------------------------------------------------------------------- JSON forms


def _str(info: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = info.get(key, default)
    if not isinstance(value, str):
        raise Acl2Error(f"{key} must be a string")
    return value


def user_info(user: User, *, with_password: bool = False) -> dict[str, str]:
    """RocketMQ's UserInfo; the password only for storage, never in an admin answer."""
    info = {
        "username": user.username,
        "userType": user.user_type.value,
        "userStatus": user.status.value,
    }
    if with_password:
        info["password"] = user.password
    return info


def user_from_info(info: Any) -> User:
    """A user from RocketMQ's UserInfo JSON object. Raises Acl2Error: malformed."""
    if not isinstance(info, Mapping):
        raise Acl2Error("a user is a JSON object")
    return User(
        _str(info, "username"),
        _str(info, "password"),
        _enum(UserType, _str(info, "userType", "Normal"), "userType"),
        _enum(UserStatus, _str(info, "userStatus", "enable"), "userStatus"),
    )


def acl_info(acl: Acl) -> dict[str, Any]:
    """RocketMQ's AclInfo: the subject and its policies' entries."""
    return {
        "subject": acl.subject,
        "policies": [
            {
                "policyType": kind.value,
                "entries": [
                    {
                        "resource": e.resource.key,
                        "actions": sorted(a.value for a in e.actions),
                        "sourceIps": list(e.source_ips),
                        "decision": e.decision.value,
                    }
                    for e in entries
                ],
            }
            for kind, entries in acl.policies.items()
        ],
    }


def acl_from_info(info: Any) -> tuple[str, list[tuple[PolicyType, list[PolicyEntry]]]]:
    """The subject and entries by policy type of an AclInfo. Raises Acl2Error: malformed."""
    if not isinstance(info, Mapping) or not isinstance(info.get("policies"), list):
        raise Acl2Error("an acl is a JSON object with a subject and a list of policies")
    policies: list[tuple[PolicyType, list[PolicyEntry]]] = []
    for policy in info["policies"]:
        if not isinstance(policy, Mapping) or not isinstance(policy.get("entries"), list):
            raise Acl2Error("a policy is a JSON object with a list of entries")
        entries = []
        for entry in policy["entries"]:
            if not isinstance(entry, Mapping):
                raise Acl2Error("a policy entry is a JSON object")
            actions, ips = entry.get("actions", []), entry.get("sourceIps") or []
            if not isinstance(actions, list) or not isinstance(ips, list):
                raise Acl2Error("actions and sourceIps are lists")
            entries.append(
                PolicyEntry.of(
                    _str(entry, "resource"),
                    [str(a) for a in actions],
                    _str(entry, "decision", "Allow"),
                    [str(ip) for ip in ips],
                )
            )
        kind = _enum(PolicyType, _str(policy, "policyType", "Custom"), "policyType")
        policies.append((kind, entries))
    return _str(info, "subject"), policies


def event_to_json(event: Event) -> dict[str, Any]:
    """The event as the metadata log stores it (with the password)."""
    match event:
        case UserPut(user):
            return {"userPut": user_info(user, with_password=True)}
        case UserDeleted(username):
            return {"userDeleted": username}
        case AclPut(acl):
            return {"aclPut": acl_info(acl)}
        case AclDeleted(subject):
            return {"aclDeleted": subject}
    raise AssertionError(event)


def event_from_json(data: Any) -> Event:
    """The event `event_to_json` gave. Raises Acl2Error: not one."""
    if not isinstance(data, Mapping) or len(data) != 1:
        raise Acl2Error("an auth event is a JSON object of one key")
    ((kind, value),) = data.items()
    if kind == "userPut":
        return UserPut(user_from_info(value))
    if kind == "aclPut":
        subject, policies = acl_from_info(value)
        return AclPut(Acl(subject, {k: tuple(entries) for k, entries in policies}))
    if kind in ("userDeleted", "aclDeleted") and isinstance(value, str):
        return UserDeleted(value) if kind == "userDeleted" else AclDeleted(value)
    raise Acl2Error(f"unknown auth event {kind[:_SHOWN]!r}")


def auth_events(state: AuthState) -> list[Event]:
    """Put events that rebuild `state` from nothing (users first: an ACL needs its user)."""
    users: list[Event] = [UserPut(u) for u in state.users.values()]
    return users + [AclPut(a) for a in state.acls.values()]


def encode_state(state: AuthState, version: int) -> bytes:
    """Every user and ACL at `version`, as a server hands them to another (passwords in)."""
    events = [event_to_json(e) for e in auth_events(state)]
    return json.dumps({"authVersion": version, "auth": events}).encode()


def decode_state(data: bytes) -> tuple[AuthState, int]:
    """The state and version `encode_state` gave. Raises Acl2Error: not that."""
    try:
        info = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise Acl2Error("the users and ACLs are not JSON") from None
    if not isinstance(info, dict) or not isinstance(info.get("authVersion"), int):
        raise Acl2Error("the users and ACLs have no authVersion")
    events = info.get("auth")
    if not isinstance(events, list):
        raise Acl2Error("the users and ACLs are not a list of events")
    return replay(event_from_json(e) for e in events), info["authVersion"]


def replay(events: Iterable[Event]) -> AuthState:
    """The state `events` build from nothing."""
    state = AuthState()
    for event in events:
        state = apply(state, event)
    return state
