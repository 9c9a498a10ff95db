"""ACL 2.0 admin requests decided against an `AuthState` (RocketMQ 5.3 codes 3001-3010).

The pure part of the admin commands, shared by a broker (`broker/auth_admin.py`) and the
controller (`controller/decide.py`): headers carry `username` (user codes), `subject` (ACL codes;
delete also `policyType` and `resource`), `filter` (list users) and `subjectFilter` /
`resourceFilter` (list ACLs); bodies are RocketMQ's UserInfo and AclInfo JSON. A change becomes
one event (`acl2.Event`), a read an answer body, anything else a refusal.

Rules: no I/O; an answer never carries a password.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ferrymq.security.acl2 import (
    Acl2Error,
    AuthState,
    Event,
    PolicyType,
    Resource,
    UserPut,
    acl_from_info,
    acl_info,
    apply,
    create_acl,
    create_user,
    delete_acl,
    delete_user,
    update_user,
    user_from_info,
    user_info,
)
from ferrymq.wire.codes import RequestCode, ResponseCode

__all__ = ["ADMIN_CODES", "CHANGE_CODES", "AdminOutcome", "decide_admin"]

CHANGE_CODES: Final = frozenset(
    {
        RequestCode.AUTH_CREATE_USER,
        RequestCode.AUTH_UPDATE_USER,
        RequestCode.AUTH_DELETE_USER,
        RequestCode.AUTH_CREATE_ACL,
        RequestCode.AUTH_UPDATE_ACL,
        RequestCode.AUTH_DELETE_ACL,
    }
)
"""The codes that change users or ACLs."""
ADMIN_CODES: Final = CHANGE_CODES | {
    RequestCode.AUTH_GET_USER,
    RequestCode.AUTH_LIST_USER,
    RequestCode.AUTH_GET_ACL,
    RequestCode.AUTH_LIST_ACL,
}
"""Every ACL 2.0 admin code."""


@dataclass(frozen=True, slots=True)
class AdminOutcome:
    """A refusal (`code`, `remark`), a change (`event`) or a read's answer (`body`)."""

    code: int = ResponseCode.SUCCESS
    remark: str | None = None
    event: Event | None = None
    body: bytes = b""


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError):
        raise Acl2Error("the body is not JSON") from None


def _field(fields: Mapping[str, str], key: str) -> str:
    value = fields.get(key, "")
    if not value:
        raise Acl2Error(f"{key} is required")
    return value


def _answer(data: Any) -> AdminOutcome:
    # FastJSON's form, as RocketMQ writes UserInfo and AclInfo: properties sorted, no spaces
    return AdminOutcome(body=json.dumps(data, sort_keys=True, separators=(",", ":")).encode())


def _update_user(state: AuthState, fields: Mapping[str, str], body: bytes) -> Event:
    username = _field(fields, "username")
    info = _json_body(body)
    if not isinstance(info, dict):
        raise Acl2Error("the body is a UserInfo object")
    old = state.users.get(username)
    if old is None:
        return update_user(state, username)  # raises: no such user
    merged = {**user_info(old, with_password=True), **info, "username": username}
    return UserPut(user_from_info(merged))


def _create_acl(state: AuthState, fields: Mapping[str, str], body: bytes) -> Event:
    subject, policies = acl_from_info(_json_body(body))
    subject = fields.get("subject") or subject
    event: Event | None = None
    for kind, entries in policies:
        event = create_acl(state, subject, entries, kind)
        state = apply(state, event)
    if event is None:
        raise Acl2Error(f"the acl of {subject} has no policy")
    return event


def _delete_acl(state: AuthState, fields: Mapping[str, str], body: bytes) -> Event:
    subject = _field(fields, "subject")
    try:
        kind = PolicyType(fields["policyType"]) if fields.get("policyType") else None
    except ValueError as exc:
        raise Acl2Error(str(exc)) from None
    named = [Resource.parse(r) for r in fields.get("resource", "").split(",") if r.strip()]
    return delete_acl(state, subject, named, kind)


def _get_user(state: AuthState, fields: Mapping[str, str]) -> AdminOutcome:
    username = _field(fields, "username")
    user = state.users.get(username)
    if user is None:
        raise Acl2Error(f"The user of {username} is not exist")
    return _answer(user_info(user))


def _list_users(state: AuthState, fields: Mapping[str, str]) -> AdminOutcome:
    text = fields.get("filter", "")
    users = sorted(state.users.values(), key=lambda u: u.username)
    return _answer([user_info(u) for u in users if text in u.username])


def _get_acl(state: AuthState, fields: Mapping[str, str]) -> AdminOutcome:
    subject = _field(fields, "subject")
    acl = state.acls.get(subject)
    if acl is None:
        raise Acl2Error(f"The acl of {subject} is not exist")
    return _answer(acl_info(acl))


def _list_acls(state: AuthState, fields: Mapping[str, str]) -> AdminOutcome:
    subject_filter = fields.get("subjectFilter", "")
    resource_filter = fields.get("resourceFilter", "")
    found = []
    for subject in sorted(state.acls):
        acl = state.acls[subject]
        keys = [e.resource.key for entries in acl.policies.values() for e in entries]
        if subject_filter in subject and any(resource_filter in k for k in keys):
            found.append(acl_info(acl))
    return _answer(found)


_CHANGES: Final[Mapping[int, Callable[[AuthState, Mapping[str, str], bytes], Event]]] = {
    RequestCode.AUTH_CREATE_USER: lambda s, f, b: create_user(s, user_from_info(_json_body(b))),
    RequestCode.AUTH_UPDATE_USER: _update_user,
    RequestCode.AUTH_DELETE_USER: lambda s, f, b: delete_user(s, _field(f, "username")),
    RequestCode.AUTH_CREATE_ACL: _create_acl,
    RequestCode.AUTH_UPDATE_ACL: _create_acl,  # RocketMQ's updateAcl merges as createAcl does
    RequestCode.AUTH_DELETE_ACL: _delete_acl,
}
_READS: Final[Mapping[int, Callable[[AuthState, Mapping[str, str]], AdminOutcome]]] = {
    RequestCode.AUTH_GET_USER: _get_user,
    RequestCode.AUTH_LIST_USER: _list_users,
    RequestCode.AUTH_GET_ACL: _get_acl,
    RequestCode.AUTH_LIST_ACL: _list_acls,
}


def decide_admin(
    state: AuthState, code: int, fields: Mapping[str, str], body: bytes
) -> AdminOutcome:
    """Decide one admin request against `state` (which it does not change)."""
    try:
        change = _CHANGES.get(code)
        if change is not None:
            return AdminOutcome(event=change(state, fields, body))
        read = _READS.get(code)
        if read is not None:
            return read(state, fields)
    except Acl2Error as exc:
        return AdminOutcome(code=ResponseCode.INVALID_PARAMETER, remark=str(exc))
    return AdminOutcome(
        code=ResponseCode.REQUEST_CODE_NOT_SUPPORTED, remark=f"{code} is not an ACL 2.0 code"
    )
