"""Classic mode: switch a broker group's master and one of its slaves while both run (seed 004).

Without controllers nothing moves a master on its own; an operator does, before maintenance of
the master's machine, with `switch_master` (`ferry admin broker switchover`). Its steps, each
bounded by `timeout`:

1. The group's master and slaves come from the NameServer's cluster info; the new master is the
   slave asked for (by broker id or address), else the one holding the most log.
2. The master is made read-only (UPDATE_BROKER_CONFIG `brokerPermission`, its value kept):
   sends are refused with NO_PERMISSION, which producers retry elsewhere, and nothing is
   appended while the slave catches up.
3. Wait until the master has answered every send it took (a SYNC_MASTER's confirm offset
   reaches its log end) and the new master holds the master's whole log.
4. SWITCH_BROKER_ROLE to the slave: master under its log's next epoch, broker id 0.
5. SWITCH_BROKER_ROLE to the old master: slave of the new one at that epoch, taking the promoted
   slave's broker id (`broker/switchover.py`). Both register with the NameServers at once, so
   routes name the new master; the group's other slaves follow it by themselves.
6. The old master's `brokerPermission` back to what it was.

Nothing acknowledged is lost: the new master has every byte the old one held when it stopped
taking writes. If a step before 4 fails, the master's permission is restored and nothing else
has changed; a failure after it is reported with the step, for the operator to finish by hand.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Final

from ferrymq.client.admin import AdminClient
from ferrymq.config import parse_properties
from ferrymq.errors import FerryError, RemoteError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, Perm, decode_body
from ferrymq.wire.broker import SwitchBrokerRoleRequestHeader, SwitchBrokerRoleResponseHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields

__all__ = ["SwitchResult", "switch_master"]

_POLL_S: Final = 0.1
_CALL_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class SwitchResult:
    """What a switchover did."""

    broker_name: str
    old_master: str
    new_master: str
    master_epoch: int
    """The new master's epoch."""
    old_master_broker_id: int
    """The id the old master now has as a slave (the promoted slave's former id)."""
    log_offset: int
    """The log end both held when the roles changed."""


async def _call(
    rpc: RpcClient, address: str, code: int, ext_fields: dict[str, str], body: bytes = b""
) -> RemotingCommand:
    response = await rpc.call(
        address, RemotingCommand(code=code, ext_fields=ext_fields, body=body), _CALL_TIMEOUT_S
    )
    if response.code != ResponseCode.SUCCESS:
        raise RemoteError(response.code, f"{address}: {response.remark}")
    return response


async def _runtime(rpc: RpcClient, address: str) -> dict[str, str]:
    response = await _call(rpc, address, RequestCode.GET_BROKER_RUNTIME_INFO, {})
    return decode_body(response.body, KVTable).table


async def _permission(rpc: RpcClient, address: str) -> int:
    response = await _call(rpc, address, RequestCode.GET_BROKER_CONFIG, {})
    values = parse_properties(response.body.decode(), "GET_BROKER_CONFIG")
    return int(values.get("brokerPermission", str(Perm.READ | Perm.WRITE)))


async def _set_permission(rpc: RpcClient, address: str, perm: int) -> None:
    await _call(
        rpc, address, RequestCode.UPDATE_BROKER_CONFIG, {}, f"brokerPermission={perm}\n".encode()
    )


async def _switch(
    rpc: RpcClient,
    address: str,
    broker_id: int,
    role: str,
    master_address: str | None = None,
    master_epoch: int | None = None,
) -> int:
    header = SwitchBrokerRoleRequestHeader(
        broker_id=broker_id,
        broker_role=role,
        master_address=master_address,
        master_epoch=master_epoch,
    )
    response = await _call(rpc, address, RequestCode.SWITCH_BROKER_ROLE, to_ext_fields(header))
    return from_ext_fields(SwitchBrokerRoleResponseHeader, response.ext_fields).master_epoch


async def switch_master(
    namesrv_addr: str,
    broker_name: str,
    *,
    to_broker_id: int | None = None,
    to_address: str | None = None,
    timeout: float = 30.0,
    rpc: RpcClient | None = None,
) -> SwitchResult:
    """Make a slave of `broker_name` its master and the master a slave (classic mode).

    Raises:
        FerryError: the group has no master or no such slave, the slave did not catch up within
            `timeout`, or a broker refused a step (the message names the step).
    """
    own_rpc = rpc is None
    rpc = rpc or RpcClient()
    try:
        async with AdminClient(namesrv_addr, rpc=rpc) as admin:
            group = (await admin.cluster_info()).broker_addr_table.get(broker_name)
        if group is None or 0 not in group.broker_addrs:
            raise FerryError(f"broker group {broker_name} has no master in the routes")
        master = group.broker_addrs[0]
        slaves = {i: a for i, a in group.broker_addrs.items() if i != 0}
        if to_address is not None:
            found = [i for i, a in slaves.items() if a == to_address]
            if not found:
                raise FerryError(f"{to_address} is not a slave of {broker_name}: {slaves}")
            to_broker_id = found[0]
        if to_broker_id is None:
            if not slaves:
                raise FerryError(f"broker group {broker_name} has no slave to switch to")
            ends = {
                i: int((await _runtime(rpc, a))["commitLogMaxOffset"]) for i, a in slaves.items()
            }
            to_broker_id = max(sorted(ends), key=lambda i: ends[i])
        if to_broker_id not in slaves:
            raise FerryError(f"broker {to_broker_id} is not a slave of {broker_name}: {slaves}")
        target = slaves[to_broker_id]
        mine = await _runtime(rpc, master)
        role = mine.get("brokerRole", "")
        if role not in ("SYNC_MASTER", "ASYNC_MASTER"):
            raise FerryError(f"{master} is {role or 'not a master'}; a switchover needs a master")

        perm = await _permission(rpc, master)
        await _set_permission(rpc, master, perm & ~Perm.WRITE)
        try:
            end = await _caught_up(rpc, master, target, role, timeout)
            epoch = await _switch(rpc, target, 0, role)
        except BaseException:
            await _set_permission(rpc, master, perm)
            raise
        try:
            await _switch(rpc, master, to_broker_id, "SLAVE", target, epoch)
        except FerryError as exc:
            raise FerryError(
                f"{target} is master of {broker_name} at epoch {epoch}, but {master} did not "
                f"become its slave: {exc} (it is read-only; stop it, or switch it by hand)"
            ) from exc
        await _set_permission(rpc, master, perm)
        return SwitchResult(broker_name, master, target, epoch, to_broker_id, end)
    finally:
        if own_rpc:
            await rpc.close()


async def _caught_up(rpc: RpcClient, master: str, target: str, role: str, timeout: float) -> int:
    """Wait until `target` holds `master`'s whole log, every send on it answered; that end."""
    deadline = time.monotonic() + timeout
    while True:
        mine, theirs = await _runtime(rpc, master), await _runtime(rpc, target)
        end = int(mine["commitLogMaxOffset"])
        answered = role != "SYNC_MASTER" or int(mine.get("confirmOffset", "0")) >= end
        if answered and int(theirs["commitLogMaxOffset"]) == end:
            return end
        if time.monotonic() > deadline:
            raise FerryError(
                f"{target} did not catch up with {master} within {timeout:g} s "
                f"(it holds {theirs['commitLogMaxOffset']} of {end} bytes)"
            )
        await asyncio.sleep(_POLL_S)
