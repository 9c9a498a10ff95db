"""ACL 2.0 users and ACLs kept by the controllers (issue 23): decisions on them.

With controllers, users and ACLs are controller state (`ControllerState.auth`, rule 6 there),
as topics are: an admin request (RocketMQ 5.3's codes 3001-3010, sent to a controller directly
or forwarded by a broker) is decided here against the state (`security.acl2admin`) into one
`AuthChangeEvent`, which the leader replicates through the Raft log; every node applies it and
the auth version bumps. Brokers (and a NameServer with an embedded controller) take the whole
state (CONTROLLER_GET_AUTH) whenever a heartbeat answer names a newer auth version, so a user
created through one group's broker is enforced by every group's brokers.

Rules:
1. Pure: the state in, events and an answer out.
2. A change is compare-and-set on the auth version it was decided against.
3. Reads answer from the applied state, never a password; CONTROLLER_GET_AUTH carries the
   passwords (brokers check signatures with them) and is an internal code (Super users only
   when the controller checks ACL 2.0).
4. A change that is already so succeeds without an event: a create or update that changes
   nothing, a create of a user equal to the one kept, a delete of a user or ACL that is gone.
   The CLI sends a change to every group's master, and each forwards it here; a client's retry
   after a lost answer is the same case (topics rule 7). A create of a user of that name with
   other fields is still refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ferrymq.controller.state import ControllerState
from ferrymq.security.acl2 import Acl2Error, apply, encode_state, event_to_json, user_from_info
from ferrymq.security.acl2admin import decide_admin
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller_log import AuthChangeEvent

__all__ = ["AuthCommand", "AuthOutcome", "GetAuth", "auth_body", "plan_auth"]


@dataclass(frozen=True, slots=True)
class AuthCommand:
    """AUTH_CREATE_USER .. AUTH_LIST_ACL (3001-3010): the code, header fields and body."""

    code: int
    fields: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class GetAuth:
    """CONTROLLER_GET_AUTH (9247, ferrymq's own): every user and ACL, at the auth version."""


@dataclass(frozen=True, slots=True)
class AuthOutcome:
    """A refusal (`code`, `remark`), or the events and the answer's body."""

    code: int = ResponseCode.SUCCESS
    remark: str | None = None
    events: tuple[AuthChangeEvent, ...] = ()
    auth_version: int = 0
    """The auth version once the events are applied."""
    body: bytes = b""


def plan_auth(state: ControllerState, command: AuthCommand) -> AuthOutcome:
    """Decide an admin request (rules 1-3)."""
    outcome = decide_admin(state.auth, command.code, command.fields, command.body)
    if outcome.code != ResponseCode.SUCCESS:
        if _already_so(state, command):
            return AuthOutcome(auth_version=state.auth_version)
        return AuthOutcome(code=outcome.code, remark=outcome.remark)
    if outcome.event is None or apply(state.auth, outcome.event) == state.auth:
        return AuthOutcome(auth_version=state.auth_version, body=outcome.body)
    event = AuthChangeEvent(
        change=event_to_json(outcome.event), expected_version=state.auth_version
    )
    return AuthOutcome(events=(event,), auth_version=state.auth_version + 1)


def _already_so(state: ControllerState, command: AuthCommand) -> bool:
    """Whether a refused change asks for what the state already is (rule 4)."""
    auth, fields = state.auth, command.fields
    match command.code:
        case RequestCode.AUTH_CREATE_USER:
            try:
                user = user_from_info(json.loads(command.body or b"null"))
            except (ValueError, UnicodeDecodeError, Acl2Error):
                return False
            return auth.users.get(user.username) == user
        case RequestCode.AUTH_DELETE_USER:
            return bool(fields.get("username")) and fields["username"] not in auth.users
        case RequestCode.AUTH_DELETE_ACL:
            return bool(fields.get("subject")) and fields["subject"] not in auth.acls
    return False


def auth_body(state: ControllerState) -> bytes:
    """CONTROLLER_GET_AUTH's answer: the whole state and its version (rule 3)."""
    return encode_state(state.auth, state.auth_version)
