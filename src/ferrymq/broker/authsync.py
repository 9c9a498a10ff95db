"""A controller-mode broker's ACL 2.0 users and ACLs: the controllers keep them (issue 23).

The controllers decide every user and ACL change (`controller/auth.py`). Here:
- `AuthSync.fetch` reads the whole state (CONTROLLER_GET_AUTH) and installs it in the broker's
  `AuthStore` (`take`): while the broker registers, before it takes any role, so a broker back
  from downtime never serves on users it missed the deletion of; whenever a heartbeat answer
  names a newer auth version; and after a change it forwarded. Masters and slaves alike take it
  from the controllers; what the metadata log replays is then ignored (`AuthStore`).
- It is the store's `keeper`: an admin change sent to this broker (codes 3001-3010, already
  checked by the broker's guard) goes to the controller leader, signed by this broker, and the
  controller's answer is returned once this broker holds the state it produced.
- The broker's `initAuthenticationUser` is created on the controllers when they lack it.
- A controller that does not know CONTROLLER_GET_AUTH (older) leaves the broker keeping its own
  users, as without controllers.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Final

from ferrymq.broker.controller_link import ControllerLink
from ferrymq.errors import FerryError, RequestError
from ferrymq.security.acl import ACCESS_KEY, SECURITY_TOKEN, SIGNATURE
from ferrymq.security.acl2 import Acl2Error, decode_state, user_info
from ferrymq.security.acl2guard import parse_init_user
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

if TYPE_CHECKING:
    from ferrymq.broker.broker import Broker

__all__ = ["AuthSync"]

log = logging.getLogger(__name__)

_RETRY_S: Final = 1.0
_SIGNED: Final = frozenset({ACCESS_KEY, SIGNATURE, SECURITY_TOKEN})


class AuthSync:
    """One controller-mode broker's link to the controllers' users and ACLs (module doc)."""

    def __init__(self, broker: Broker, link: ControllerLink) -> None:
        self.broker = broker
        self.link = link
        self._wake = asyncio.Event()

    @property
    def version(self) -> int:
        """The controllers' auth version the broker holds (-1: none yet)."""
        return self.broker.state.auth.controller_version

    def heard(self, auth_version: int | None) -> None:
        """A heartbeat answer named the controllers' auth version."""
        if auth_version is not None and auth_version > self.version:
            self._wake.set()

    async def run(self) -> None:
        """Fetch whenever woken, forever."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.fetch()
            except FerryError as exc:
                log.info("could not read the users and ACLs from the controller: %s", exc)
                await asyncio.sleep(_RETRY_S)
                self._wake.set()

    async def fetch(self) -> None:
        """Take the controllers' state if newer; the first time, become the store's keeper.

        Raises:
            FerryError: no controller leader answered, it refused, or the answer is malformed.
        """
        response = await self.link.call(RequestCode.CONTROLLER_GET_AUTH)
        if response.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            if self.version < 0:
                log.warning(
                    "the controller does not keep users and ACLs (an older version): this "
                    "broker keeps its own, as without controllers"
                )
            return
        if response.code != ResponseCode.SUCCESS:
            raise FerryError(f"CONTROLLER_GET_AUTH: {response.code} {response.remark}")
        try:
            state, version = decode_state(response.body)
        except Acl2Error as exc:
            raise FerryError(f"CONTROLLER_GET_AUTH: {exc}") from None
        store = self.broker.state.auth
        first = store.keeper is None
        if store.take(state, version):
            log.info(
                "users and ACLs from the controller: %d users, %d ACLs (auth version %d)",
                len(state.users),
                len(state.acls),
                version,
            )
        store.keeper = self.change
        if first:
            await self._create_init_user()

    async def _create_init_user(self) -> None:
        text = self.broker.config.init_authentication_user
        if not text:
            return
        user = parse_init_user(text)
        if user.username in self.broker.state.auth.state.users:
            return
        body = json.dumps(user_info(user, with_password=True)).encode()
        response = await self.link.call(RequestCode.AUTH_CREATE_USER, body=body)
        if response.code == ResponseCode.SUCCESS:
            log.info("initAuthenticationUser: Super user %s created", user.username)
            await self.fetch()
        else:  # another broker's or a controller's init user of that name won the race
            log.info("initAuthenticationUser %s: %s", user.username, response.remark)

    async def change(self, request: RemotingCommand) -> RemotingCommand:
        """Forward an admin change to the controller leader; its answer, once held here."""
        fields = {k: v for k, v in request.ext_fields.items() if k not in _SIGNED}
        try:
            answer = await self.link.call(request.code, body=request.body, fields=fields)
        except FerryError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"controller mode: {exc}") from None
        if answer.code == ResponseCode.SUCCESS:
            wanted = answer.ext_fields.get("authVersion", "")
            try:
                await self.fetch()
            except FerryError as exc:
                raise RequestError(
                    ResponseCode.SYSTEM_ERROR,
                    f"the controller made the change (auth version {wanted}), but this broker "
                    f"could not read it back: {exc}",
                ) from None
        return request.make_response(answer.code, remark=answer.remark, body=answer.body)
