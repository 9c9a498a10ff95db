"""ACL 2.0 on a server: the users and ACLs in force, and the check in front of its router.

`AuthStore` holds a broker's `AuthState`; admin commands and the metadata log change it only by
applying events (`acl2.apply`), and its `listener` (the master's metadata log) hears each one, so
slaves apply the same events in the same order. `Acl2Guard` checks every request: with
`authenticationEnabled` the signing user (`acl2.authenticate`), with `authorizationEnabled` what
it may do: a Super user anything; others the Pub / Sub their policies allow on the topics and
groups the request names (`aclcodes.resources`; a group as `Group:name`), and no admin or
internal request code (ferrymq maps those to Super users only, where RocketMQ 5.3 maps each to
CREATE/UPDATE/DELETE/GET/LIST on a resource). Codes in a whitelist skip that step, except
`CARRIES_PASSWORDS` (the controllers' users for a broker), which always needs a Super user.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from ferrymq.config import ConfigError, build_config, config_keys
from ferrymq.errors import ProtocolError
from ferrymq.security.acl import RETRY_PREFIX, Credentials, Perm
from ferrymq.security.acl2 import (
    Acl2Error,
    Action,
    AuthState,
    Event,
    Resource,
    ResourceType,
    User,
    UserPut,
    UserType,
    apply,
    authenticate,
    authorize,
)
from ferrymq.security.aclcodes import Kind, kind_of, resources
from ferrymq.security.aclguard import C, R, RefusingGuard, peer_host
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand

__all__ = [
    "ACL2_KEYS",
    "CARRIES_PASSWORDS",
    "Acl2Config",
    "Acl2Guard",
    "AuthSource",
    "AuthStore",
    "WithInitUser",
    "acl2_guard",
    "init_super_user",
    "parse_init_user",
    "parse_inner_credentials",
    "parse_whitelist",
    "split_acl2_keys",
    "wanted_access",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Acl2Config:
    """ACL 2.0's keys on a NameServer or a controller (a broker has them in `BrokerConfig`)."""

    authentication_enabled: bool = False
    """Every request is signed by a user."""
    authorization_enabled: bool = False
    """A Normal user may do only what its ACL allows (no admin or internal code)."""
    init_authentication_user: str = field(default="", repr=False)
    """JSON `{"username": ..., "password": ...}`: a Super user this server knows (module doc)."""
    authentication_whitelist: str = ""
    """Request codes (comma-separated) that skip authentication."""
    authorization_whitelist: str = ""
    """Request codes (comma-separated) that skip authorization."""
    inner_client_authentication_credentials: str = field(default="", repr=False)
    """JSON `{"accessKey": ..., "secretKey": ...}`: what the process signs its own calls with."""

    @classmethod
    def of(cls, values: Mapping[str, str]) -> Acl2Config:
        """From RocketMQ-keyed values (`split_acl2_keys`). Raises ConfigError: a bad value."""
        config, _ = build_config(cls, dict(values))
        if config.init_authentication_user:
            parse_init_user(config.init_authentication_user)
        if config.inner_client_authentication_credentials:
            parse_inner_credentials(config.inner_client_authentication_credentials)
        return config


ACL2_KEYS: Final = frozenset(config_keys(Acl2Config))
"""The RocketMQ keys of `Acl2Config`."""


def split_acl2_keys(values: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the `Acl2Config` keys, every other key) of a properties file's values."""
    mine = {k: v for k, v in values.items() if k in ACL2_KEYS}
    return mine, {k: v for k, v in values.items() if k not in ACL2_KEYS}


CARRIES_PASSWORDS: Final = frozenset({RequestCode.CONTROLLER_GET_AUTH})
"""Codes whose answer holds every password: a Super user's only, whatever the whitelists and
`authorizationEnabled` say."""


class AuthSource(Protocol):
    """Where a guard reads the users and ACLs in force."""

    @property
    def state(self) -> AuthState:
        """The users and ACLs now."""
        ...


class WithInitUser:
    """A kept state (the controllers') plus this server's `initAuthenticationUser`.

    The init user counts only while the kept state has no user of its name: a fresh controller
    node (nothing replicated yet) still hears its peers and brokers signing as it, and once the
    state holds that user (the leader creates it, `controller/auth.py`) the state's password and
    status decide.
    """

    def __init__(self, read: Callable[[], AuthState], init_user: User | None) -> None:
        self._read = read
        self._init = init_user
        self._base: AuthState | None = None
        self._merged = AuthState()

    @property
    def state(self) -> AuthState:
        """The kept state, with the init user when it lacks one of that name."""
        base = self._read()
        init = self._init
        if init is None or init.username in base.users:
            return base
        if base is not self._base:
            self._base = base
            self._merged = AuthState({**base.users, init.username: init}, base.acls)
        return self._merged


class AuthStore:
    """The users and ACLs of this server; changed only through events.

    In controller mode the controllers keep them (`controller/auth.py`): `keeper` sends a change
    to them, `take` installs their whole state at their auth version, and from then on what the
    metadata log replays (events, snapshots) is ignored, so an older record never undoes it.
    """

    def __init__(self) -> None:
        self.state = AuthState()
        self.listener: Callable[[Event], None] | None = None
        """Hears every applied event (the master's metadata log)."""
        self.keeper: Callable[[RemotingCommand], Awaitable[RemotingCommand]] | None = None
        """Controller mode: sends an admin change to the controllers and answers theirs."""
        self.controller_version = -1
        """The controllers' auth version of the state taken (-1: not kept by controllers)."""

    def apply(self, event: Event) -> None:
        """Apply `event` and tell the listener (ignored once the controllers keep the state)."""
        if self.controller_version >= 0:
            return
        self.state = apply(self.state, event)
        if self.listener is not None:
            self.listener(event)

    def replace_all(self, state: AuthState) -> None:
        """Take a snapshot's state (no listener call; ignored as `apply`)."""
        if self.controller_version < 0:
            self.state = state

    def take(self, state: AuthState, version: int) -> bool:
        """Install the controllers' state at `version`; False (nothing done) when not newer."""
        if version <= self.controller_version:
            return False
        self.state, self.controller_version = state, version
        return True


def parse_init_user(text: str) -> User:
    """The Super user of `initAuthenticationUser`.

    Raises:
        ConfigError: not `{"username": ..., "password": ...}` JSON.
    """
    try:
        info = json.loads(text)
        return User(str(info["username"]), str(info["password"]), UserType.SUPER)
    except (ValueError, TypeError, KeyError, Acl2Error):
        raise ConfigError(
            "initAuthenticationUser", 'JSON {"username": ..., "password": ...}'
        ) from None


def init_super_user(store: AuthStore, text: str) -> None:
    """`initAuthenticationUser`: create that Super user unless a user of its name exists.

    Raises:
        ConfigError: not `{"username": ..., "password": ...}` JSON.
    """
    user = parse_init_user(text)
    if user.username not in store.state.users:
        store.apply(UserPut(user))
        log.info("initAuthenticationUser: Super user %s created", user.username)


def parse_inner_credentials(text: str) -> Credentials:
    """`innerClientAuthenticationCredentials`: `{"accessKey": ..., "secretKey": ...}`.

    Raises:
        ConfigError: anything else (the message shows no secret).
    """
    try:
        info = json.loads(text)
        return Credentials(str(info["accessKey"]), str(info["secretKey"]))
    except (ValueError, TypeError, KeyError):
        raise ConfigError(
            "innerClientAuthenticationCredentials", 'JSON {"accessKey": ..., "secretKey": ...}'
        ) from None


def wanted_access(resource: str, perm: Perm) -> tuple[Resource, frozenset[Action]]:
    """ACL 1.0's (resource name, PUB/SUB perm) as ACL 2.0's resource and actions.

    A `%RETRY%` name is its group, any other a topic.
    """
    if resource.startswith(RETRY_PREFIX):
        wanted = Resource(ResourceType.GROUP, resource[len(RETRY_PREFIX) :])
    else:
        wanted = Resource(ResourceType.TOPIC, resource)
    actions = {Action.PUB} if perm & Perm.PUB else set()
    if perm & Perm.SUB:
        actions.add(Action.SUB)
    return wanted, frozenset(actions)


def parse_whitelist(text: str, key: str) -> frozenset[int]:
    """Request codes of a `authenticationWhitelist`-style key (comma-separated numbers).

    Raises:
        ConfigError: not numbers.
    """
    try:
        return frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(key, "a comma-separated list of request codes") from None


class Acl2Guard(RefusingGuard[C, R]):
    """A request handler that lets through only what the users and ACLs allow."""

    def __init__(
        self,
        inner: Callable[[C, RemotingCommand], Awaitable[R]],
        store: AuthSource,
        *,
        authorization: bool = True,
        authentication_whitelist: frozenset[int] = frozenset(),
        authorization_whitelist: frozenset[int] = frozenset(),
        server_name: str = "server",
    ) -> None:
        super().__init__(inner, server_name)
        self.store = store
        self.authorization = authorization
        self.authentication_whitelist = authentication_whitelist
        self.authorization_whitelist = authorization_whitelist

    def check(self, conn: C, request: RemotingCommand) -> str | None:
        """None if `request` may run, else why not (the NO_PERMISSION remark)."""
        code = request.code
        secret = code in CARRIES_PASSWORDS
        if code in self.authentication_whitelist and not secret:
            return None
        state = self.store.state
        user, error = authenticate(state, request.ext_fields, request.body, request.version)
        if error is not None:
            return error
        assert user is not None
        if secret and user.user_type is not UserType.SUPER:
            return f"request code={code} answers every password; User:{user.username} is not Super"
        if not self.authorization or code in self.authorization_whitelist:
            return None
        return self._authorize(state, user, conn, request)

    def _authorize(
        self, state: AuthState, user: User, conn: C, request: RemotingCommand
    ) -> str | None:
        if user.user_type is UserType.SUPER:
            return None
        if kind_of(request.code) in (Kind.ADMIN, Kind.INTERNAL):
            return f"request code={request.code} needs a Super user; User:{user.username} is not"
        try:
            needed = resources(request.code, request.ext_fields, request.body)
        except ProtocolError as exc:
            return f"request code={request.code}: {str(exc)[:200]}"
        host = peer_host(conn.peer)
        for name, perm in needed:
            wanted, actions = wanted_access(name, perm)
            remark = authorize(state, user, wanted, actions, host)
            if remark is not None:
                return remark
        return None


def acl2_guard(
    inner: Callable[[C, RemotingCommand], Awaitable[R]],
    store: AuthSource,
    *,
    authentication: bool,
    authorization: bool,
    authentication_whitelist: str = "",
    authorization_whitelist: str = "",
    server_name: str = "server",
) -> Acl2Guard[C, R] | None:
    """The guard of `authenticationEnabled` (None when off).

    Raises:
        ConfigError: `authorizationEnabled` without `authenticationEnabled` (no subject to
            authorize), or a whitelist that is not request codes.
    """
    if not authentication:
        if authorization:
            raise ConfigError(
                "authorizationEnabled", "needs authenticationEnabled=true (the signing user)"
            )
        return None
    return Acl2Guard(
        inner,
        store,
        authorization=authorization,
        authentication_whitelist=parse_whitelist(
            authentication_whitelist, "authenticationWhitelist"
        ),
        authorization_whitelist=parse_whitelist(authorization_whitelist, "authorizationWhitelist"),
        server_name=server_name,
    )
