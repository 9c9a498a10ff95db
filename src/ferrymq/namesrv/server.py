"""The NameServer process core: the route table behind a remoting server.

Handlers (RocketMQ `DefaultRequestProcessor`, `ClientRequestProcessor`):
REGISTER_BROKER, UNREGISTER_BROKER, BROKER_HEARTBEAT, GET_ROUTEINFO_BY_TOPIC,
GET_BROKER_CLUSTER_INFO, GET_ALL_TOPIC_LIST_FROM_NAMESERVER, GET_TOPICS_BY_CLUSTER,
GET_SYSTEM_TOPIC_LIST_FROM_NS (the Dashboard's topic list asks it),
DELETE_TOPIC_IN_NAMESRV, GET_KV_CONFIG, WIPE_WRITE_PERM_OF_BROKER, ADD_WRITE_PERM_OF_BROKER (a
wiped group stays read-only in routes until added back or this NameServer restarts: the state is
in memory, as RocketMQ's). A broker whose connection drops leaves the routes at
once; one that stops registering leaves them after its timeout (`broker_timeout`, 30 s by
default against RocketMQ's 120 s).

ACL 1.0 (`aclEnable`) or ACL 2.0 (`authenticationEnabled`, `namesrv/auth.py`: the controllers'
users and this NameServer's init user) guards every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from ferrymq import clock as process_clock
from ferrymq.config import ConfigError
from ferrymq.errors import RequestError
from ferrymq.namesrv.admin import NamesrvAdmin
from ferrymq.namesrv.auth import AuthPull
from ferrymq.namesrv.routes import RouteTable
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.rpc.testclock import serve_test_clock
from ferrymq.security.acl2guard import (
    Acl2Guard,
    AuthStore,
    WithInitUser,
    acl2_guard,
    parse_init_user,
)
from ferrymq.security.aclguard import AclGuard, acl_guard
from ferrymq.wire.bodies import DataVersion, TopicList, decode_register_body, encode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import CommandHeader, from_ext_fields, to_ext_fields
from ferrymq.wire.namesrv import (
    AddWritePermOfBrokerRequestHeader,
    AddWritePermOfBrokerResponseHeader,
    BrokerHeartbeatRequestHeader,
    DeleteTopicFromNamesrvRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    KvConfigRequestHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
    WipeWritePermOfBrokerRequestHeader,
    WipeWritePermOfBrokerResponseHeader,
)

__all__ = ["NameServer", "NamesrvConfig"]

log = logging.getLogger(__name__)

_BROKER_ADDR = "broker_addr"


@dataclass(frozen=True, slots=True, kw_only=True)
class NamesrvConfig:
    """Settings of one NameServer."""

    listen_host: str = "127.0.0.1"
    listen_port: int = 9876
    broker_timeout: float = 30.0
    """Seconds without a registration after which a broker leaves the routes."""
    scan_interval: float = 1.0
    """How often expired brokers are looked for."""
    acl_enable: bool = False
    """ACL 1.0 (issue 23): every request is checked against `aclFile` (docs/security.md)."""
    acl_file: Path | None = None
    """The `plain_acl.yml` of `aclEnable`; reloaded within a second of a change."""
    authentication_enabled: bool = False
    """ACL 2.0 (issue 23): every request is signed by a user (`namesrv/auth.py`: which)."""
    authorization_enabled: bool = False
    """ACL 2.0: a Normal user may do only what its ACL allows (no admin or internal code)."""
    init_authentication_user: str = field(default="", repr=False)
    """JSON `{"username": ..., "password": ...}`: a Super user this NameServer knows."""
    authentication_whitelist: str = ""
    """Request codes (comma-separated) that skip authentication."""
    authorization_whitelist: str = ""
    """Request codes (comma-separated) that skip authorization."""
    controller_addr: str = ""
    """ACL 2.0: controllers (`;`-separated) whose users and ACLs this NameServer checks."""


def _ok(
    request: RemotingCommand, header: CommandHeader | None = None, body: bytes = b""
) -> RemotingCommand:
    return request.make_response(
        ResponseCode.SUCCESS,
        ext_fields=to_ext_fields(header) if header is not None else None,
        body=body,
    )


class NameServer:
    """Routes for producers and consumers; use as an async context manager."""

    def __init__(
        self, config: NamesrvConfig, clock: Callable[[], float] = process_clock.mono
    ) -> None:
        self.config = config
        self._clock = clock
        self.routes = RouteTable()
        self.router = Router("NameServer")
        self._add_routes()
        self.acl: AclGuard[Connection, Any] | None = acl_guard(
            self.router, config.acl_enable, config.acl_file, "NameServer"
        )
        self.auth = AuthStore()
        """ACL 2.0: the controllers' users and ACLs (`namesrv/auth.py`)."""
        init = config.init_authentication_user
        self.auth_guard: Acl2Guard[Connection, Any] | None = acl2_guard(
            self.router,
            WithInitUser(lambda: self.auth.state, parse_init_user(init) if init else None),
            authentication=config.authentication_enabled,
            authorization=config.authorization_enabled,
            authentication_whitelist=config.authentication_whitelist,
            authorization_whitelist=config.authorization_whitelist,
            server_name="NameServer",
        )
        if self.acl is not None and self.auth_guard is not None:
            raise ConfigError("authenticationEnabled", "ACL 1.0 (aclEnable) or 2.0, not both")
        controllers = [a.strip() for a in config.controller_addr.split(";") if a.strip()]
        self.auth_pull = AuthPull(controllers, self.auth) if controllers else None
        self._auth_task: asyncio.Task[None] | None = None
        self._server = RpcServer(
            self.acl or self.auth_guard or self.router,
            host=config.listen_host,
            port=config.listen_port,
            on_close=self._connection_closed,
        )
        self._expiry: asyncio.Task[None] | None = None
        self.close_listeners: list[Callable[[Connection], None]] = []
        """Called with every connection that closes (a controller embedded on this port)."""

    @property
    def address(self) -> str:
        """`host:port` the NameServer listens on."""
        return self._server.address

    def _add_routes(self) -> None:
        add = self.router.add
        add(RequestCode.REGISTER_BROKER, self._register_broker)
        add(RequestCode.UNREGISTER_BROKER, self._unregister_broker)
        add(RequestCode.BROKER_HEARTBEAT, self._broker_heartbeat)
        add(RequestCode.GET_ROUTEINFO_BY_TOPIC, self._route_by_topic)
        add(RequestCode.GET_BROKER_CLUSTER_INFO, self._cluster_info)
        add(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, self._all_topics)
        add(RequestCode.GET_TOPICS_BY_CLUSTER, self._topics_by_cluster)
        add(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS, self._system_topics)
        add(RequestCode.DELETE_TOPIC_IN_NAMESRV, self._delete_topic)
        add(RequestCode.GET_KV_CONFIG, self._kv_config)
        add(RequestCode.WIPE_WRITE_PERM_OF_BROKER, self._wipe_write_perm)
        add(RequestCode.ADD_WRITE_PERM_OF_BROKER, self._add_write_perm)
        serve_test_clock(self.router)
        self.admin = NamesrvAdmin(self)  # KV config, GET/UPDATE_NAMESRV_CONFIG
        self.admin.serve(self.router)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Listen and start expiring silent brokers."""
        await self._server.start()
        self._expiry = asyncio.get_running_loop().create_task(self._expire_loop())
        if self.auth_pull is not None and self.auth_guard is not None:
            self._auth_task = asyncio.get_running_loop().create_task(self.auth_pull.run())
        log.info("NameServer listening on %s", self.address)

    async def close(self) -> None:
        """Stop serving."""
        for task in (self._expiry, self._auth_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._server.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.scan_interval)
            self.routes.expire(self._clock())

    def _connection_closed(self, conn: Connection) -> None:
        for listener in self.close_listeners:
            listener(conn)
        broker_addr = conn.attributes.get(_BROKER_ADDR)
        if isinstance(broker_addr, str) and self.routes.unregister_address(broker_addr):
            log.info("broker %s left the routes: its connection closed", broker_addr)

    # ------------------------------------------------------------------ handlers

    async def _register_broker(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """REGISTER_BROKER (103): topic configs in the body, JSON or RocketMQ-compressed."""
        header = from_ext_fields(RegisterBrokerRequestHeader, request.ext_fields)
        body = decode_register_body(request.body, header.compressed) if request.body else None
        wrapper = body.topic_config_serialize_wrapper if body else None
        timeout = (
            header.heartbeat_timeout_millis / 1000
            if header.heartbeat_timeout_millis
            else self.config.broker_timeout
        )
        result = self.routes.register(
            cluster=header.cluster_name,
            broker_addr=header.broker_addr,
            broker_name=header.broker_name,
            broker_id=header.broker_id,
            ha_server_addr=header.ha_server_addr,
            data_version=wrapper.data_version if wrapper else DataVersion(),
            topics=wrapper.topic_config_table if wrapper else None,
            now=self._clock(),
            timeout=timeout,
        )
        if not result.accepted:
            raise RequestError(ResponseCode.SYSTEM_ERROR, result.reason or "registration refused")
        conn.attributes[_BROKER_ADDR] = header.broker_addr
        return _ok(
            request,
            RegisterBrokerResponseHeader(
                ha_server_addr=result.ha_server_addr, master_addr=result.master_addr
            ),
        )

    async def _unregister_broker(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """UNREGISTER_BROKER (104): a broker leaves on shutdown."""
        header = from_ext_fields(UnregisterBrokerRequestHeader, request.ext_fields)
        self.routes.unregister(
            cluster=header.cluster_name,
            broker_addr=header.broker_addr,
            broker_name=header.broker_name,
            broker_id=header.broker_id,
        )
        conn.attributes.pop(_BROKER_ADDR, None)
        return _ok(request)

    async def _broker_heartbeat(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """BROKER_HEARTBEAT (904): keep a registered broker live between registrations."""
        header = from_ext_fields(BrokerHeartbeatRequestHeader, request.ext_fields)
        if not self.routes.heartbeat(header.broker_addr, self._clock()):
            raise RequestError(
                ResponseCode.SYSTEM_ERROR, f"broker {header.broker_addr} is not registered"
            )
        return _ok(request)

    async def _route_by_topic(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_ROUTEINFO_BY_TOPIC (105): standard JSON, broker ids as string keys."""
        header = from_ext_fields(GetRouteInfoRequestHeader, request.ext_fields)
        route = self.routes.route_of(header.topic)
        if route is None:
            raise RequestError(
                ResponseCode.TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {header.topic}",
            )
        return _ok(request, body=encode_body(route))

    async def _cluster_info(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_BROKER_CLUSTER_INFO (106)."""
        return _ok(request, body=encode_body(self.routes.cluster_info()))

    async def _all_topics(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206)."""
        return _ok(request, body=encode_body(TopicList(self.routes.topics())))

    async def _system_topics(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_SYSTEM_TOPIC_LIST_FROM_NS (304): RocketMQ `RouteInfoManager.getSystemTopicList`.

        Each cluster's name and its broker names (what a broker answers routes for besides its
        topics), and the address of one registered broker, where the Dashboard asks next.
        """
        info = self.routes.cluster_info()
        names: dict[str, None] = {}
        for cluster, brokers in info.cluster_addr_table.items():
            names[cluster] = None
            names.update(dict.fromkeys(brokers))
        broker_addr = next(
            (
                data.broker_addrs[min(data.broker_addrs)]
                for data in info.broker_addr_table.values()
                if data.broker_addrs
            ),
            None,
        )
        return _ok(request, body=encode_body(TopicList(list(names), broker_addr)))

    async def _topics_by_cluster(
        self, conn: Connection, request: RemotingCommand
    ) -> RemotingCommand:
        """GET_TOPICS_BY_CLUSTER (224)."""
        header = from_ext_fields(GetTopicsByClusterRequestHeader, request.ext_fields)
        return _ok(
            request, body=encode_body(TopicList(self.routes.topics_of_cluster(header.cluster)))
        )

    async def _delete_topic(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """DELETE_TOPIC_IN_NAMESRV (216): forget a topic (everywhere, or in one cluster)."""
        header = from_ext_fields(DeleteTopicFromNamesrvRequestHeader, request.ext_fields)
        self.routes.delete_topic(header.topic, header.cluster_name)
        return _ok(request)

    async def _wipe_write_perm(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """WIPE_WRITE_PERM_OF_BROKER (205): offer a group's queues read-only (drain it)."""
        header = from_ext_fields(WipeWritePermOfBrokerRequestHeader, request.ext_fields)
        count = self.routes.wipe_write_perm(header.broker_name)
        return _ok(request, WipeWritePermOfBrokerResponseHeader(wipe_topic_count=count))

    async def _add_write_perm(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """ADD_WRITE_PERM_OF_BROKER (327): offer a wiped group's queues for writing again."""
        header = from_ext_fields(AddWritePermOfBrokerRequestHeader, request.ext_fields)
        count = self.routes.add_write_perm(header.broker_name)
        return _ok(request, AddWritePermOfBrokerResponseHeader(add_topic_count=count))

    async def _kv_config(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        """GET_KV_CONFIG (101): ferrymq keeps no KV config; every lookup answers not found."""
        header = from_ext_fields(KvConfigRequestHeader, request.ext_fields)
        raise RequestError(
            ResponseCode.QUERY_NOT_FOUND,
            f"No config item, Namespace: {header.namespace} Key: {header.key}",
        )
