"""ACL 2.0 admin requests on a broker: users and ACLs (RocketMQ 5.3 codes 3001-3010).

Each request is decided by `security.acl2admin` against the broker's `AuthStore`. Without
controllers a change is applied to the store (whose listener writes it to the metadata log, so
slaves apply it too) and answered once it is committed; only a master takes changes. In
controller mode the controllers keep users and ACLs (`controller/auth.py`): a change goes to
them (`AuthStore.keeper`) and is answered with their answer, once this broker holds the state
it produced. Any replica answers reads from the state it holds. Answers never carry a password.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ferrymq.broker.config import BrokerRole
from ferrymq.broker.state import BrokerState
from ferrymq.errors import RequestError
from ferrymq.rpc.connection import Connection
from ferrymq.security.acl2admin import ADMIN_CODES, CHANGE_CODES, decide_admin
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.frame import RemotingCommand

__all__ = ["HANDLERS"]

_Handler = Callable[[BrokerState, Connection, RemotingCommand], Awaitable[RemotingCommand]]


async def _admin(state: BrokerState, conn: Connection, request: RemotingCommand) -> RemotingCommand:
    """AUTH_CREATE_USER .. AUTH_LIST_ACL (3001-3010): RocketMQ 5.3's AuthAdmin requests."""
    auth = state.auth
    if request.code in CHANGE_CODES and auth.keeper is not None:
        return await auth.keeper(request)
    outcome = decide_admin(auth.state, request.code, request.ext_fields, request.body)
    if outcome.code != ResponseCode.SUCCESS:
        raise RequestError(outcome.code, outcome.remark or "refused")
    if outcome.event is None:
        return request.make_response(ResponseCode.SUCCESS, body=outcome.body)
    if state.role is BrokerRole.SLAVE:
        raise RequestError(ResponseCode.SYSTEM_ERROR, "users and ACLs change on the master only")
    auth.apply(outcome.event)
    if state.metadata_committed is not None and not await state.metadata_committed():
        raise RequestError(
            ResponseCode.SYSTEM_ERROR,
            "the change was made but not replicated in time; a failover may undo it: retry",
        )
    return request.make_response(ResponseCode.SUCCESS)


HANDLERS: dict[int, _Handler] = dict.fromkeys(ADMIN_CODES, _admin)
"""Request code -> handler, for the broker's router."""
