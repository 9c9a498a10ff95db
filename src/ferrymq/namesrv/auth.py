"""ACL 2.0 on a NameServer (issue 23): whose users it checks, and where it gets them.

A NameServer keeps no users of its own. With `authenticationEnabled` it checks every request
against:
- the users and ACLs the controllers keep (`controller/auth.py`), when `controllerAddr` names
  them: `AuthPull` reads the whole state (CONTROLLER_GET_AUTH, signed with the process's
  credentials) at start and every `AUTH_PULL_INTERVAL_S`, following a follower's leader hint,
  and keeps the newest; a controller that cannot be reached leaves the last state in force;
- its `initAuthenticationUser` (a Super user, for the brokers' registrations and admin tools),
  while the controllers' state has no user of that name.
Without `controllerAddr` only that user (and the whitelists) gets through: clients then need
its account, or their codes in `authenticationWhitelist`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl2 import Acl2Error, decode_state
from ferrymq.security.acl2guard import AuthStore
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import NotLeaderResponseHeader
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields

__all__ = ["AUTH_PULL_INTERVAL_S", "AuthPull"]

log = logging.getLogger(__name__)

AUTH_PULL_INTERVAL_S: Final = 1.0
_CALL_TIMEOUT_S: Final = 3.0


class AuthPull:
    """Keeps `store` at the controllers' users and ACLs (module doc)."""

    def __init__(
        self, addresses: list[str], store: AuthStore, *, interval: float = AUTH_PULL_INTERVAL_S
    ) -> None:
        self.addresses = addresses
        self.store = store
        self.interval = interval
        self._rpc = RpcClient()
        self._failing = False

    async def run(self) -> None:
        """Pull now and every `interval`, until cancelled."""
        try:
            while True:
                try:
                    await self.pull()
                    self._failing = False
                except FerryError as exc:
                    if not self._failing:  # one line per outage, not one per second
                        log.warning("users and ACLs not read from the controllers: %s", exc)
                    self._failing = True
                await asyncio.sleep(self.interval)
        finally:
            await self._rpc.close()

    async def pull(self) -> bool:
        """Read the leader's state; whether it was newer than the one held.

        Raises:
            FerryError: no controller leader answered, or its answer is malformed.
        """
        candidates = list(self.addresses)
        tried = 0
        while candidates and tried <= 2 * len(self.addresses):
            address = candidates.pop(0)
            tried += 1
            request = RemotingCommand(code=RequestCode.CONTROLLER_GET_AUTH)
            try:
                response = await self._rpc.call(address, request, _CALL_TIMEOUT_S)
            except FerryError as exc:
                log.debug("controller %s: %s", address, exc)
                continue
            if response.code == ResponseCode.CONTROLLER_NOT_LEADER:
                hint = from_ext_fields(NotLeaderResponseHeader, response.ext_fields)
                if hint.controller_leader_address:
                    candidates.insert(0, hint.controller_leader_address)
                continue
            if response.code != ResponseCode.SUCCESS:
                raise FerryError(f"CONTROLLER_GET_AUTH at {address}: {response.remark}")
            try:
                state, version = decode_state(response.body)
            except Acl2Error as exc:
                raise FerryError(f"CONTROLLER_GET_AUTH at {address}: {exc}") from None
            taken = self.store.take(state, version)
            if taken:
                log.info(
                    "users and ACLs from the controllers: %d users (auth version %d)",
                    len(state.users),
                    version,
                )
            return taken
        raise FerryError(f"no controller leader among {self.addresses}")
