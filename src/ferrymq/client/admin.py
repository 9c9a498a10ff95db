"""The admin client: topics, clusters and routes (the parts of RocketMQ's `MQAdminExt` served)."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from ferrymq.errors import FerryError, RemoteError
from ferrymq.model import validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import ClusterInfo, TopicList, TopicRouteData, decode_body
from ferrymq.wire.broker import CreateTopicRequestHeader, DeleteTopicRequestHeader
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.namesrv import DeleteTopicFromNamesrvRequestHeader, GetRouteInfoRequestHeader

__all__ = ["AdminClient"]


class AdminClient:
    """Administration through the NameServers and brokers."""

    def __init__(
        self, namesrv_addr: str, *, timeout: float = 5.0, rpc: RpcClient | None = None
    ) -> None:
        self._namesrvs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
        self._rpc = rpc or RpcClient()
        self._owns_rpc = rpc is None
        self._timeout = timeout

    async def close(self) -> None:
        """Close connections (when this client owns them)."""
        if self._owns_rpc:
            await self._rpc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _namesrv_call(self, request: RemotingCommand) -> RemotingCommand:
        last: FerryError | None = None
        for address in self._namesrvs:
            try:
                return await self._rpc.call(address, request, self._timeout)
            except FerryError as exc:
                last = exc
        raise last or FerryError("no NameServer address given")

    async def _broker_call(self, address: str, request: RemotingCommand) -> RemotingCommand:
        response = await self._rpc.call(address, request, self._timeout)
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return response

    async def cluster_info(self) -> ClusterInfo:
        """Every broker group and cluster the NameServer knows."""
        response = await self._namesrv_call(
            RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO)
        )
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return decode_body(response.body, ClusterInfo)

    async def route(self, topic: str) -> TopicRouteData | None:
        """A topic's route, or None when no NameServer knows it."""
        request = RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
            ext_fields=to_ext_fields(GetRouteInfoRequestHeader(topic=topic)),
        )
        response = await self._namesrv_call(request)
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return decode_body(response.body, TopicRouteData)

    async def topics(self) -> list[str]:
        """Every routed topic."""
        response = await self._namesrv_call(
            RemotingCommand(code=RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        )
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return decode_body(response.body, TopicList).topic_list

    async def _masters(self, cluster: str | None, broker_name: str | None) -> list[str]:
        info = await self.cluster_info()
        names = set(info.broker_addr_table)
        if cluster is not None:
            names &= set(info.cluster_addr_table.get(cluster, []))
        if broker_name is not None:
            names &= {broker_name}
        masters = [info.broker_addr_table[n].broker_addrs.get(0) for n in sorted(names)]
        found = [m for m in masters if m]
        if not found:
            where = (
                f"broker {broker_name}"
                if broker_name
                else f"cluster {cluster}"
                if cluster
                else "any cluster"
            )
            raise FerryError(f"no master found in {where}")
        return found

    async def create_topic(
        self,
        topic: str,
        queues: int = 8,
        *,
        cluster: str | None = None,
        broker_name: str | None = None,
        perm: int = 6,
        order: bool = False,
    ) -> list[str]:
        """Create (or change) a topic on every master of a cluster or one broker group.

        Returns the masters that took it.
        """
        validate_topic(topic)
        header = CreateTopicRequestHeader(
            topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm, order=order
        )
        masters = await self._masters(cluster, broker_name)
        for address in masters:
            await self._broker_call(
                address,
                RemotingCommand(
                    code=RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=to_ext_fields(header)
                ),
            )
        return masters

    async def delete_topic(self, topic: str, *, cluster: str | None = None) -> None:
        """Delete a topic from the masters of a cluster (or all) and from the NameServers."""
        header = to_ext_fields(DeleteTopicRequestHeader(topic=topic))
        for address in await self._masters(cluster, None):
            await self._broker_call(
                address,
                RemotingCommand(code=RequestCode.DELETE_TOPIC_IN_BROKER, ext_fields=dict(header)),
            )
        names = to_ext_fields(
            DeleteTopicFromNamesrvRequestHeader(topic=topic, cluster_name=cluster)
        )
        for address in self._namesrvs:
            await self._rpc.call(
                address,
                RemotingCommand(code=RequestCode.DELETE_TOPIC_IN_NAMESRV, ext_fields=dict(names)),
                self._timeout,
            )
