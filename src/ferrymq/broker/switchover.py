"""Classic mode: switch a group's master and one of its slaves at runtime (seed 004).

Without controllers roles are static: broker id 0 is the master, the others are slaves. A planned
switch (`ferry admin broker switchover`, client/switchover.py) swaps a master and a slave while
both run, in steps the admin tool drives: the master is made read-only (`brokerPermission`), the
slave catches up to the master's log end, then SWITCH_BROKER_ROLE (ferrymq's own request) makes
the slave master under a new epoch and the old master its slave.

Rules:
1. The two swap their ids and roles: the new master takes broker id 0, the old master the
   slave's id. Ids keep meaning what they mean in classic mode (0 is the master, in the routes
   and on the HA link); the new master's epoch is its log's last epoch plus one, on disk before
   it takes a write, and the old master follows it from that epoch on.
2. The new role outlives a restart: each broker writes it to `classicRole.json` in its store
   root (atomically) and a classic-mode broker that finds the file starts with that id and role,
   not its configuration's (it logs that it does). Deleting the file returns it to its
   configuration: do that only for both brokers of a switch, or for neither.
3. Refused in controller mode: there the controller names masters (`elect-master`).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from ferrymq.broker.config import BrokerConfig, BrokerRole
from ferrymq.errors import RequestError
from ferrymq.rpc.connection import Connection, RequestHandler
from ferrymq.store.atomic import read_file, write_atomic
from ferrymq.wire.broker import SwitchBrokerRoleRequestHeader, SwitchBrokerRoleResponseHeader
from ferrymq.wire.codes import ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields

if TYPE_CHECKING:
    from ferrymq.broker.broker import Broker

__all__ = ["ROLE_FILE", "RoleFile", "apply_role_file", "save_role_file", "switch_role_handler"]

log = logging.getLogger(__name__)

ROLE_FILE: Final = "classicRole.json"


class RoleFile(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """A classic-mode broker's id and role after a switchover (rule 2)."""

    broker_id: int
    broker_role: BrokerRole


def _path(config: BrokerConfig) -> Path:
    return config.store_path_root_dir / ROLE_FILE


def apply_role_file(config: BrokerConfig) -> BrokerConfig:
    """`config` with the id and role a switchover left in the store root, if any.

    Raises:
        msgspec.DecodeError: the file is not what `save_role_file` writes.
        ConfigError: it holds an id and a role that do not go together.
    """
    data = read_file(_path(config))
    if data is None:
        return config
    role = msgspec.json.decode(data, type=RoleFile)
    if (role.broker_id, role.broker_role) == (config.broker_id, config.broker_role):
        return config
    log.warning(
        "%s: a switchover made this broker %s with broker id %d (the configuration says %s, %d)",
        _path(config),
        role.broker_role.value,
        role.broker_id,
        config.broker_role.value,
        config.broker_id,
    )
    return dataclasses.replace(config, broker_id=role.broker_id, broker_role=role.broker_role)


def save_role_file(config: BrokerConfig, broker_id: int, role: BrokerRole) -> None:
    """Record the id and role a switchover gave this broker (rule 2)."""
    write_atomic(_path(config), msgspec.json.encode(RoleFile(broker_id, role)))


def switch_role_handler(broker: Broker) -> RequestHandler:
    """SWITCH_BROKER_ROLE (ferrymq's own): take the id and role a switchover assigns."""

    async def handle(conn: Connection, request: RemotingCommand) -> RemotingCommand:
        header = from_ext_fields(SwitchBrokerRoleRequestHeader, request.ext_fields)
        if broker.config.enable_controller_mode:
            raise RequestError(
                ResponseCode.NO_PERMISSION,
                "controller mode: the controller names masters "
                "(ferry admin controller elect-master GROUP --broker-id N)",
            )
        try:
            role = BrokerRole(header.broker_role)
        except ValueError:
            raise RequestError(
                ResponseCode.INVALID_PARAMETER, f"unknown brokerRole {header.broker_role!r}"
            ) from None
        if (role is BrokerRole.SLAVE) != (header.broker_id != 0):
            raise RequestError(
                ResponseCode.INVALID_PARAMETER,
                f"{role.value} with broker id {header.broker_id}: a master has id 0, a slave not",
            )
        if role is BrokerRole.SLAVE and (not header.master_address or not header.master_epoch):
            raise RequestError(
                ResponseCode.INVALID_PARAMETER, "a slave needs masterAddress and masterEpoch"
            )
        epoch = await broker.switch_classic_role(
            role, header.broker_id, header.master_address, header.master_epoch
        )
        return request.make_response(
            ResponseCode.SUCCESS,
            ext_fields=to_ext_fields(SwitchBrokerRoleResponseHeader(master_epoch=epoch)),
        )

    return handle
