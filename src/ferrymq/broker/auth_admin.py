"""ACL 2.0 admin requests on a broker: users and ACLs (RocketMQ 5.3 codes 3001-3010).

Headers carry `username` (user codes), `subject` (ACL codes; delete also `policyType` and
`resource`), `filter` (list users) and `subjectFilter` / `resourceFilter` (list ACLs); bodies are
RocketMQ's UserInfo and AclInfo JSON. A change is decided against the state (`acl2`), applied
to the broker's `AuthStore` (whose listener writes it to the metadata log, so slaves apply it
too) and answered once it is committed. Only a master takes changes; any replica answers reads.
Answers never carry a password.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from ferrymq.broker.config import BrokerRole
from ferrymq.broker.state import BrokerState
from ferrymq.errors import RequestError
from ferrymq.rpc.connection import Connection
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
from ferrymq.wire.frame import RemotingCommand

__all__ = ["HANDLERS"]

_Handler = Callable[[BrokerState, Connection, RemotingCommand], Awaitable[RemotingCommand]]


def _json_body(request: RemotingCommand) -> Any:
    try:
        return json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        raise RequestError(ResponseCode.INVALID_PARAMETER, "the body is not JSON") from None


def _field(request: RemotingCommand, key: str) -> str:
    value = request.ext_fields.get(key, "")
    if not value:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"{key} is required")
    return value


def _answer(request: RemotingCommand, data: Any) -> RemotingCommand:
    return request.make_response(ResponseCode.SUCCESS, body=json.dumps(data).encode())


async def _change(
    state: BrokerState, request: RemotingCommand, decide: Callable[[AuthState], Event]
) -> RemotingCommand:
    if state.role is BrokerRole.SLAVE:
        raise RequestError(ResponseCode.SYSTEM_ERROR, "users and ACLs change on the master only")
    try:
        event = decide(state.auth.state)
    except Acl2Error as exc:
        raise RequestError(ResponseCode.INVALID_PARAMETER, str(exc)) from None
    state.auth.apply(event)
    if state.metadata_committed is not None and not await state.metadata_committed():
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            "the change was made but not replicated in time; a failover may undo it: retry",
        )
    return request.make_response(ResponseCode.SUCCESS)


async def _create_user(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    try:
        user = user_from_info(_json_body(request))
    except Acl2Error as exc:
        raise RequestError(ResponseCode.INVALID_PARAMETER, str(exc)) from None
    return await _change(state, request, lambda s: create_user(s, user))


async def _update_user(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    username = _field(request, "username")
    info = _json_body(request)
    if not isinstance(info, dict):
        raise RequestError(ResponseCode.INVALID_PARAMETER, "the body is a UserInfo object")

    def decide(s: AuthState) -> Event:
        old = s.users.get(username)
        if old is None:
            return update_user(s, username)  # raises: no such user
        merged = {**user_info(old, with_password=True), **info, "username": username}
        return UserPut(user_from_info(merged))

    return await _change(state, request, decide)


async def _delete_user(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    username = _field(request, "username")
    return await _change(state, request, lambda s: delete_user(s, username))


async def _get_user(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    username = _field(request, "username")
    user = state.auth.state.users.get(username)
    if user is None:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"The user of {username} is not exist")
    return _answer(request, user_info(user))


async def _list_users(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    text = request.ext_fields.get("filter", "")
    users = sorted(state.auth.state.users.values(), key=lambda u: u.username)
    return _answer(request, [user_info(u) for u in users if text in u.username])


async def _create_acl(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    try:
        subject, policies = acl_from_info(_json_body(request))
    except Acl2Error as exc:
        raise RequestError(ResponseCode.INVALID_PARAMETER, str(exc)) from None
    subject = request.ext_fields.get("subject") or subject

    def decide(s: AuthState) -> Event:
        event: Event | None = None
        for kind, entries in policies:
            event = create_acl(s, subject, entries, kind)
            s = apply(s, event)
        if event is None:
            raise Acl2Error(f"the acl of {subject} has no policy")
        return event

    return await _change(state, request, decide)


async def _delete_acl(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    subject = _field(request, "subject")
    fields = request.ext_fields
    try:
        kind = PolicyType(fields["policyType"]) if fields.get("policyType") else None
        named = [Resource.parse(r) for r in fields.get("resource", "").split(",") if r.strip()]
    except (ValueError, Acl2Error) as exc:
        raise RequestError(ResponseCode.INVALID_PARAMETER, str(exc)) from None
    return await _change(state, request, lambda s: delete_acl(s, subject, named, kind))


async def _get_acl(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    subject = _field(request, "subject")
    acl = state.auth.state.acls.get(subject)
    if acl is None:
        raise RequestError(ResponseCode.INVALID_PARAMETER, f"The acl of {subject} is not exist")
    return _answer(request, acl_info(acl))


async def _list_acls(
    state: BrokerState, conn: Connection, request: RemotingCommand
) -> RemotingCommand:
    subject_filter = request.ext_fields.get("subjectFilter", "")
    resource_filter = request.ext_fields.get("resourceFilter", "")
    found = []
    for subject in sorted(state.auth.state.acls):
        acl = state.auth.state.acls[subject]
        keys = [e.resource.key for entries in acl.policies.values() for e in entries]
        if subject_filter in subject and any(resource_filter in k for k in keys):
            found.append(acl_info(acl))
    return _answer(request, found)


HANDLERS: dict[int, _Handler] = {
    RequestCode.AUTH_CREATE_USER: _create_user,
    RequestCode.AUTH_UPDATE_USER: _update_user,
    RequestCode.AUTH_DELETE_USER: _delete_user,
    RequestCode.AUTH_GET_USER: _get_user,
    RequestCode.AUTH_LIST_USER: _list_users,
    RequestCode.AUTH_CREATE_ACL: _create_acl,
    RequestCode.AUTH_UPDATE_ACL: _create_acl,  # RocketMQ's updateAcl merges as createAcl does
    RequestCode.AUTH_DELETE_ACL: _delete_acl,
    RequestCode.AUTH_GET_ACL: _get_acl,
    RequestCode.AUTH_LIST_ACL: _list_acls,
}
"""Request code -> handler, for the broker's router."""
