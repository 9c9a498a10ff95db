"""NameServer administration: KV config and the NameServer's own config.

mqadmin's updateKvConfig, deleteKvConfig, getNamesrvConfig and updateNamesrvConfig.

RocketMQ `DefaultRequestProcessor`: PUT_KV_CONFIG (100), GET_KV_CONFIG (101), DELETE_KV_CONFIG
(102), GET_NAMESRV_CONFIG (319: every key as `key=value` lines), UPDATE_NAMESRV_CONFIG (318:
`key=value` lines; only `HOT_KEYS` change a running NameServer, the others are refused whole).

Rules:
1. The KV table (namespace -> key -> value) is this NameServer's, in memory, as the wiped write
   permissions are: a restart forgets it (RocketMQ keeps it in `kvConfig.json`). Admin tools
   write every NameServer of the list.
2. A config update is all or nothing: one key that cannot change refuses the request.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Final, Protocol

from ferrymq.config import (
    ConfigError,
    build_config,
    config_keys,
    parse_properties,
    properties_text,
)
from ferrymq.errors import RequestError
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.server import Router
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.namesrv import (
    KvConfigRequestHeader,
    KvConfigResponseHeader,
    PutKvConfigRequestHeader,
)

__all__ = ["HOT_KEYS", "NamesrvAdmin"]

log = logging.getLogger(__name__)

HOT_KEYS: Final = frozenset({"brokerTimeout", "scanInterval"})
"""Keys UPDATE_NAMESRV_CONFIG may change on a running NameServer."""


class _Configured(Protocol):
    config: Any


class NamesrvAdmin:
    """The KV table and config handlers of one NameServer (`server.config` is replaced)."""

    def __init__(self, server: _Configured) -> None:
        self._server = server
        self.kv: dict[str, dict[str, str]] = {}

    def serve(self, router: Router) -> None:
        """Route the five codes (GET_KV_CONFIG replaces the NameServer's not-found answer)."""
        router.add(RequestCode.PUT_KV_CONFIG, self.put_kv)
        router.add(RequestCode.DELETE_KV_CONFIG, self.delete_kv)
        router.add(RequestCode.GET_NAMESRV_CONFIG, self.get_config)
        router.add(RequestCode.UPDATE_NAMESRV_CONFIG, self.update_config)
        if router.handler(RequestCode.GET_KV_CONFIG) is None:
            router.add(RequestCode.GET_KV_CONFIG, self.get_kv)
        else:
            router.replace(RequestCode.GET_KV_CONFIG, self.get_kv)

    async def put_kv(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """PUT_KV_CONFIG (100)."""
        header = from_ext_fields(PutKvConfigRequestHeader, request.ext_fields)
        self.kv.setdefault(header.namespace, {})[header.key] = header.value
        log.info("KV config %s/%s set by %s", header.namespace, header.key, conn.peer)
        return request.make_response(ResponseCode.SUCCESS)

    async def get_kv(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_KV_CONFIG (101): QUERY_NOT_FOUND with RocketMQ's remark when there is none."""
        header = from_ext_fields(KvConfigRequestHeader, request.ext_fields)
        value = self.kv.get(header.namespace, {}).get(header.key)
        if value is None:
            raise RequestError(
                ResponseCode.QUERY_NOT_FOUND,
                f"No config item, Namespace: {header.namespace} Key: {header.key}",
            )
        return request.make_response(
            ResponseCode.SUCCESS, ext_fields=to_ext_fields(KvConfigResponseHeader(value=value))
        )

    async def delete_kv(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """DELETE_KV_CONFIG (102): deleting what is not there succeeds, as in RocketMQ."""
        header = from_ext_fields(KvConfigRequestHeader, request.ext_fields)
        table = self.kv.get(header.namespace, {})
        if table.pop(header.key, None) is not None:
            log.info("KV config %s/%s deleted by %s", header.namespace, header.key, conn.peer)
        if not table:
            self.kv.pop(header.namespace, None)
        return request.make_response(ResponseCode.SUCCESS)

    async def get_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_NAMESRV_CONFIG (319): `key=value` lines."""
        body = properties_text(self._server.config).encode()
        return request.make_response(ResponseCode.SUCCESS, body=body)

    async def update_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """UPDATE_NAMESRV_CONFIG (318): `key=value` lines, `HOT_KEYS` only."""
        config = self._server.config
        try:
            values = parse_properties(request.body.decode(), "UPDATE_NAMESRV_CONFIG")
            cold = sorted(set(values) - HOT_KEYS)
            if cold:
                raise ConfigError(", ".join(cold), "not changeable at runtime")
            changed, _ = build_config(type(config), values)
        except UnicodeDecodeError:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "the body is not UTF-8") from None
        except ConfigError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None
        fields = config_keys(type(config))
        updates = {fields[key].name: getattr(changed, fields[key].name) for key in values}
        self._server.config = dataclasses.replace(config, **updates)
        log.info("NameServer config updated: %s", ", ".join(f"{k}={v}" for k, v in values.items()))
        return request.make_response(ResponseCode.SUCCESS)
