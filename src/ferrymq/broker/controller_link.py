"""A broker's calls to the controller: find the leader, follow its redirects, fail over.

Spec: reference/rocketmq-controller-spec.md sections 2.3 and 3.1 (`controllerAddr` split on `;`,
the leader learned from CONTROLLER_GET_METADATA_INFO, every call sent to the leader). A follower
answers CONTROLLER_NOT_LEADER (2007) naming the leader when it knows it (ferrymq's
`NotLeaderResponseHeader`); the link then retries there, else tries the next address.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ferrymq.errors import FerryError, RemoteError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller import GetMetaDataResponseHeader, NotLeaderResponseHeader
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader, from_ext_fields, to_ext_fields

__all__ = ["ControllerLink"]

log = logging.getLogger(__name__)


class ControllerLink:
    """Requests to the controller leader among `addresses`."""

    def __init__(self, rpc: RpcClient, addresses: list[str], *, timeout: float = 3.0) -> None:
        if not addresses:
            raise ValueError("controller mode needs at least one controller address")
        self._rpc = rpc
        self.addresses = addresses
        self.timeout = timeout
        self.leader: str | None = None

    async def call(
        self,
        code: int,
        header: CommandHeader | None = None,
        body: bytes = b"",
        *,
        fields: Mapping[str, str] | None = None,
    ) -> RemotingCommand:
        """Send a request to the leader and return its answer (any code but NOT_LEADER).

        `fields`: the ext fields as they are, instead of a header's.

        Raises:
            FerryError: no controller answered, or none of them leads.
        """
        tried: list[str] = []
        candidates = ([self.leader] if self.leader else []) + [
            a for a in self.addresses if a != self.leader
        ]
        last_error: FerryError | None = None
        while candidates and len(tried) < 2 * len(self.addresses) + 1:
            address = candidates.pop(0)
            tried.append(address)
            ext_fields = dict(fields) if fields is not None else {}
            if header is not None:
                ext_fields = to_ext_fields(header)
            request = RemotingCommand(code=code, ext_fields=ext_fields, body=body)
            try:
                response = await self._rpc.call(address, request, self.timeout)
            except FerryError as exc:
                last_error = exc
                if self.leader == address:
                    self.leader = None
                continue
            if response.code != ResponseCode.CONTROLLER_NOT_LEADER:
                self.leader = address
                return response
            if self.leader == address:
                self.leader = None
            named = from_ext_fields(NotLeaderResponseHeader, response.ext_fields)
            hint = named.controller_leader_address
            if hint and hint not in tried[-1:]:
                candidates.insert(0, hint)
            last_error = RemoteError(response.code, response.remark)
        raise FerryError(f"no controller leader among {self.addresses}: {last_error}")

    async def find_leader(self) -> str | None:
        """Ask each controller who leads (CONTROLLER_GET_METADATA_INFO); None when none knows."""
        for address in self.addresses:
            request = RemotingCommand(code=RequestCode.CONTROLLER_GET_METADATA_INFO)
            try:
                response = await self._rpc.call(address, request, self.timeout)
            except FerryError as exc:
                log.debug("controller %s: %s", address, exc)
                continue
            if response.code != ResponseCode.SUCCESS:
                continue
            meta = from_ext_fields(GetMetaDataResponseHeader, response.ext_fields)
            if meta.controller_leader_address:
                self.leader = meta.controller_leader_address
                return self.leader
        return None
