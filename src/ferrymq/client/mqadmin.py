"""mqadmin's everyday operations on top of `AdminClient`: groups, connections, configs, KV.

`MQAdmin` adds what `ferry admin` needs for RocketMQ's daily commands:

- subscription groups: update (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) and delete
  (DELETE_SUBSCRIPTIONGROUP) on every master of a cluster or one group, and copying one group's
  committed offsets in a topic to another (cloneGroupOffset: GET_CONSUME_STATS, then
  UPDATE_CONSUMER_OFFSET);
- clients: a consumer group's connections (GET_CONSUMER_CONNECTION_LIST, merged over the
  masters) and a producer group's (GET_PRODUCER_CONNECTION_LIST on the topic's masters);
- a broker's runtime figures and config (GET_BROKER_RUNTIME_INFO, GET_BROKER_CONFIG);
- topic permissions (UPDATE_AND_CREATE_TOPIC with the queues the broker has);
- every NameServer's config and KV table (GET/UPDATE_NAMESRV_CONFIG, PUT/GET/DELETE_KV_CONFIG);
- consumerStatus: each client's `ConsumerRunningInfo` (GET_CONSUMER_RUNNING_INFO through a
  master, which asks the client);
- statsAll: every topic's and consuming group's TPS and 24-hour counts
  (VIEW_BROKER_STATS_DATA, QUERY_TOPIC_CONSUME_BY_WHO, GET_CONSUME_STATS on the masters);
- online offset reset (resetOffsetByTime: INVOKE_BROKER_TO_RESET_OFFSET on the topic's masters,
  which push the offsets to the group's running clients), offline when no client runs.

Writes to NameServers go to each of them (each keeps its own); reads take the first that answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ferrymq.client.admin import AdminClient
from ferrymq.config import ConfigError, parse_properties
from ferrymq.errors import FerryError, RemoteError
from ferrymq.model import validate_group, validate_topic
from ferrymq.wire.bodies import (
    BrokerStatsData,
    ClientConnection,
    ConsumerConnection,
    GroupList,
    ProducerConnection,
    TopicConfigSerializeWrapper,
    decode_body,
    decode_consume_stats,
    decode_reset_offsets,
    encode_body,
)
from ferrymq.wire.broker import (
    CreateTopicRequestHeader,
    DeleteSubscriptionGroupRequestHeader,
    GetConsumerConnectionListRequestHeader,
    GetConsumerRunningInfoRequestHeader,
    GetConsumeStatsRequestHeader,
    GetProducerConnectionListRequestHeader,
    QueryTopicConsumeByWhoRequestHeader,
    ResetOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewBrokerStatsDataRequestHeader,
)
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.fastjson import loads, parse_mq_key
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import to_ext_fields
from ferrymq.wire.namesrv import KvConfigRequestHeader, PutKvConfigRequestHeader

__all__ = ["GROUP_SETTINGS", "MQAdmin", "StatsRow"]

GROUP_SETTINGS: dict[str, type] = {
    "consumeEnable": bool,
    "consumeFromMinEnable": bool,
    "consumeBroadcastEnable": bool,
    "retryQueueNums": int,
    "retryMaxTimes": int,
    "brokerId": int,
    "whichBrokerWhenConsumeSlowly": int,
    "notifyConsumerIdsChangedEnable": bool,
    "consumeMessageOrderly": bool,
}
"""`SubscriptionGroupConfig` fields a broker keeps for a group, and their types."""


@dataclass(frozen=True)
class StatsRow:
    """One line of statsAll: a topic, or a group consuming it (its lag, TPS, 24-hour count)."""

    topic: str
    group: str | None
    """None: the topic's own line (messages in)."""
    accumulation: int
    tps: float
    count_24h: int


def _properties(body: bytes, source: str) -> dict[str, str]:
    try:
        return parse_properties(body.decode(), source)
    except (UnicodeDecodeError, ConfigError) as exc:
        raise FerryError(f"{source}: unreadable answer: {exc}") from None


class MQAdmin(AdminClient):
    """`AdminClient` with mqadmin's everyday operations."""

    async def _masters_of(self, cluster: str | None, broker_name: str | None) -> dict[str, str]:
        return await self._masters(cluster, broker_name)

    async def update_group(
        self,
        group: str,
        settings: dict[str, Any],
        *,
        cluster: str | None = None,
        broker_name: str | None = None,
    ) -> list[str]:
        """Create or change a subscription group on every master (of a cluster, or one group).

        `settings` holds `GROUP_SETTINGS` keys; the others keep the broker's current value, or
        RocketMQ's default for a new group. Returns the masters that took it.
        """
        validate_group(group)
        unknown = sorted(set(settings) - set(GROUP_SETTINGS))
        if unknown:
            raise ValueError(f"not a subscription group setting: {', '.join(unknown)}")
        masters = await self._masters_of(cluster, broker_name)
        for address in masters.values():
            current = (await self.group_configs(address)).get(group, {})
            body = {**current, **settings, "groupName": group}
            await self._broker_call(
                address,
                RemotingCommand(
                    code=RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=encode_body(body)
                ),
            )
        return sorted(masters.values())

    async def group_configs(self, broker_addr: str) -> dict[str, dict[str, Any]]:
        """Every subscription group on one broker (GET_ALL_SUBSCRIPTIONGROUP_CONFIG)."""
        response = await self._broker_call(
            broker_addr, RemotingCommand(code=RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        )
        found = decode_body(response.body, dict[str, Any])
        table = found.get("subscriptionGroupTable", {})
        return {str(name): dict(config) for name, config in table.items()}

    async def delete_group(
        self,
        group: str,
        *,
        cluster: str | None = None,
        broker_name: str | None = None,
        clean_offset: bool = False,
    ) -> list[str]:
        """Delete a subscription group (and, `clean_offset`, its offsets) on every master."""
        validate_group(group)
        masters = await self._masters_of(cluster, broker_name)
        header = DeleteSubscriptionGroupRequestHeader(group_name=group, clean_offset=clean_offset)
        for address in masters.values():
            await self._broker_call(
                address,
                RemotingCommand(
                    code=RequestCode.DELETE_SUBSCRIPTIONGROUP, ext_fields=to_ext_fields(header)
                ),
            )
        return sorted(masters.values())

    async def clone_group_offsets(
        self, source: str, destination: str, topic: str
    ) -> dict[tuple[str, int], int]:
        """Give `destination` the offsets `source` committed in `topic` (cloneGroupOffset).

        Returns (broker name, queue id) -> offset written.
        """
        validate_group(source)
        validate_group(destination)
        validate_topic(topic)
        written: dict[tuple[str, int], int] = {}
        header = to_ext_fields(GetConsumeStatsRequestHeader(consumer_group=source, topic=topic))
        for broker_name, address in sorted((await self._topic_masters(topic)).items()):
            response = await self._broker_call(
                address, RemotingCommand(code=RequestCode.GET_CONSUME_STATS, ext_fields=header)
            )
            for entry in decode_consume_stats(response.body).offset_table:
                update = UpdateConsumerOffsetRequestHeader(
                    consumer_group=destination,
                    topic=topic,
                    queue_id=entry.queue_id,
                    commit_offset=entry.consumer_offset,
                )
                await self._broker_call(
                    address,
                    RemotingCommand(
                        code=RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=to_ext_fields(update)
                    ),
                )
                written[broker_name, entry.queue_id] = entry.consumer_offset
        return written

    async def consumer_connection(self, group: str) -> ConsumerConnection:
        """A consumer group's online clients and subscriptions, from every master.

        Raises:
            FerryError: no master has a client of the group online.
        """
        validate_group(group)
        header = to_ext_fields(GetConsumerConnectionListRequestHeader(consumer_group=group))
        merged: ConsumerConnection | None = None
        clients: dict[str, ClientConnection] = {}
        for address in (await self._masters_of(None, None)).values():
            response = await self._rpc.call(
                address,
                RemotingCommand(code=RequestCode.GET_CONSUMER_CONNECTION_LIST, ext_fields=header),
                self._timeout,
            )
            if response.code == ResponseCode.CONSUMER_NOT_ONLINE:
                continue
            if response.code != ResponseCode.SUCCESS:
                raise RemoteError(response.code, f"broker {address}: {response.remark}")
            found = decode_body(response.body, ConsumerConnection)
            merged = merged or found
            merged.subscription_table.update(found.subscription_table)
            clients.update((c.client_id, c) for c in found.connection_set)
        if merged is None:
            raise FerryError(f"consumer group {group} is not online")
        merged.connection_set = [clients[c] for c in sorted(clients)]
        return merged

    async def producer_connection(self, group: str, topic: str) -> list[ClientConnection]:
        """A producer group's clients, from the masters of the topic it sends to.

        Raises:
            FerryError: no master knows a client of the group.
        """
        header = to_ext_fields(GetProducerConnectionListRequestHeader(producer_group=group))
        clients: dict[str, ClientConnection] = {}
        for address in (await self._topic_masters(topic)).values():
            response = await self._rpc.call(
                address,
                RemotingCommand(code=RequestCode.GET_PRODUCER_CONNECTION_LIST, ext_fields=header),
                self._timeout,
            )
            if response.code == ResponseCode.SUCCESS:
                found = decode_body(response.body, ProducerConnection).connection_set
                clients.update((c.client_id, c) for c in found)
        if not clients:
            raise FerryError(f"producer group {group} has no client on the masters of {topic}")
        return [clients[c] for c in sorted(clients)]

    async def broker_runtime(self, broker_addr: str) -> dict[str, str]:
        """A broker's runtime figures (GET_BROKER_RUNTIME_INFO's KV table)."""
        response = await self._broker_call(
            broker_addr, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO)
        )
        table = decode_body(response.body, dict[str, Any]).get("table", {})
        return {str(k): str(v) for k, v in table.items()}

    async def broker_config(self, broker_addr: str) -> dict[str, str]:
        """A broker's config, every key (GET_BROKER_CONFIG)."""
        response = await self._broker_call(
            broker_addr, RemotingCommand(code=RequestCode.GET_BROKER_CONFIG)
        )
        return _properties(response.body, f"broker {broker_addr}")

    async def update_topic_perm(
        self, topic: str, perm: int, *, broker_name: str | None = None
    ) -> list[str]:
        """Set a topic's permission (2 write, 4 read, 6 both) on its masters; their addresses.

        Each master keeps its queue numbers; `broker_name` limits the change to one group.
        """
        validate_topic(topic)
        if perm not in (2, 4, 6):
            raise ValueError(f"perm must be 2 (write), 4 (read) or 6 (both), not {perm}")
        masters = await self._topic_masters(topic)
        if broker_name is not None:
            if broker_name not in masters:
                raise FerryError(f"topic {topic} has no master on broker group {broker_name}")
            masters = {broker_name: masters[broker_name]}
        for address in masters.values():
            response = await self._broker_call(
                address, RemotingCommand(code=RequestCode.GET_ALL_TOPIC_CONFIG)
            )
            config = decode_body(response.body, TopicConfigSerializeWrapper).topic_config_table
            current = config.get(topic)
            if current is None:
                raise FerryError(f"broker {address} has no topic {topic}")
            header = CreateTopicRequestHeader(
                topic=topic,
                read_queue_nums=current.read_queue_nums,
                write_queue_nums=current.write_queue_nums,
                perm=perm,
                order=current.order,
                topic_sys_flag=current.topic_sys_flag,
            )
            await self._broker_call(
                address,
                RemotingCommand(
                    code=RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=to_ext_fields(header)
                ),
            )
        return sorted(masters.values())

    async def namesrv_configs(self) -> dict[str, dict[str, str]]:
        """Every NameServer's config (GET_NAMESRV_CONFIG): address -> key -> value."""
        answers = await self._every_namesrv(RequestCode.GET_NAMESRV_CONFIG, {})
        return {
            address: _properties(response.body, f"NameServer {address}")
            for address, response in answers.items()
        }

    async def update_namesrv_config(self, values: dict[str, str]) -> list[str]:
        """Change hot settings of every NameServer (UPDATE_NAMESRV_CONFIG); their addresses."""
        body = "".join(f"{key}={value}\n" for key, value in values.items()).encode()
        done: list[str] = []
        for address in self._namesrvs:
            request = RemotingCommand(code=RequestCode.UPDATE_NAMESRV_CONFIG, body=body)
            response = await self._rpc.call(address, request, self._timeout)
            if response.code != ResponseCode.SUCCESS:
                raise RemoteError(response.code, f"NameServer {address}: {response.remark}")
            done.append(address)
        return done

    async def put_kv(self, namespace: str, key: str, value: str) -> list[str]:
        """Set a KV config item on every NameServer (PUT_KV_CONFIG); their addresses."""
        header = PutKvConfigRequestHeader(namespace=namespace, key=key, value=value)
        answers = await self._every_namesrv(RequestCode.PUT_KV_CONFIG, to_ext_fields(header))
        return list(answers)

    async def delete_kv(self, namespace: str, key: str) -> list[str]:
        """Delete a KV config item on every NameServer (DELETE_KV_CONFIG); their addresses."""
        header = KvConfigRequestHeader(namespace=namespace, key=key)
        answers = await self._every_namesrv(RequestCode.DELETE_KV_CONFIG, to_ext_fields(header))
        return list(answers)

    async def get_kv(self, namespace: str, key: str) -> str | None:
        """A KV config item from the first NameServer that answers (None: not set)."""
        header = to_ext_fields(KvConfigRequestHeader(namespace=namespace, key=key))
        response = await self._namesrv_call(
            RemotingCommand(code=RequestCode.GET_KV_CONFIG, ext_fields=header)
        )
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, response.remark)
        return response.ext_fields.get("value")

    async def reset_offsets_by_time(
        self, group: str, topic: str, timestamp_ms: int, *, force: bool = True
    ) -> tuple[dict[tuple[str, int], int], bool]:
        """Move a group's offsets in a topic to a time (-1: the end) while it runs.

        Each master of the topic commits the offsets and pushes them to the group's running
        clients, which start there (INVOKE_BROKER_TO_RESET_OFFSET). When no client of the group
        is online anywhere the offsets are committed offline instead, as mqadmin falls back to.
        Returns (broker name, queue id) -> offset, and whether running clients were told.
        """
        validate_group(group)
        validate_topic(topic)
        header = ResetOffsetRequestHeader(
            topic=topic, group=group, timestamp=timestamp_ms, is_force=force
        )
        moved: dict[tuple[str, int], int] = {}
        offline = 0
        masters = await self._topic_masters(topic)
        for address in masters.values():
            response = await self._rpc.call(
                address,
                RemotingCommand(
                    code=RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                    ext_fields=to_ext_fields(header),
                ),
                self._timeout,
            )
            if response.code == ResponseCode.CONSUMER_NOT_ONLINE:
                offline += 1
                continue
            if response.code != ResponseCode.SUCCESS:
                raise RemoteError(response.code, f"broker {address}: {response.remark}")
            for (_, broker_name, queue_id), offset in decode_reset_offsets(response.body).items():
                moved[broker_name, queue_id] = offset
        if offline == len(masters):
            if timestamp_ms == -1:
                return await self.reset_offsets(group, topic, to_latest=True), False
            return await self.reset_offsets(group, topic, timestamp_ms=timestamp_ms), False
        return moved, True

    async def broker_stats(self, broker_addr: str, name: str, key: str) -> BrokerStatsData | None:
        """One stat of one broker (VIEW_BROKER_STATS_DATA); None when it never counted `key`."""
        header = ViewBrokerStatsDataRequestHeader(stats_name=name, stats_key=key)
        response = await self._rpc.call(
            broker_addr,
            RemotingCommand(
                code=RequestCode.VIEW_BROKER_STATS_DATA, ext_fields=to_ext_fields(header)
            ),
            self._timeout,
        )
        if response.code == ResponseCode.SYSTEM_ERROR and "not exist" in (response.remark or ""):
            return None
        if response.code != ResponseCode.SUCCESS:
            raise RemoteError(response.code, f"broker {broker_addr}: {response.remark}")
        return decode_body(response.body, BrokerStatsData)

    async def _summed(self, masters: list[str], name: str, key: str) -> tuple[float, int]:
        tps, day = 0.0, 0
        for address in masters:
            found = await self.broker_stats(address, name, key)
            if found is not None:
                tps += found.stats_minute.tps
                day += found.stats_day.sum
        return tps, day

    async def stats_all(self, topic: str | None = None) -> list[StatsRow]:
        """Mqadmin statsAll: each topic's in-TPS and 24-hour count, then each group reading it.

        Retry and dead-letter topics are left out, as mqadmin does.
        """
        topics = [topic] if topic is not None else await self.topics()
        rows: list[StatsRow] = []
        for name in sorted(t for t in topics if not t.startswith(("%RETRY%", "%DLQ%"))):
            try:
                masters = sorted((await self._topic_masters(name)).values())
            except FerryError:
                continue  # no route (any more)
            tps, day = await self._summed(masters, "TOPIC_PUT_NUMS", name)
            rows.append(StatsRow(name, None, 0, tps, day))
            groups: set[str] = set()
            who = to_ext_fields(QueryTopicConsumeByWhoRequestHeader(topic=name))
            for address in masters:
                response = await self._broker_call(
                    address,
                    RemotingCommand(code=RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, ext_fields=who),
                )
                groups |= set(decode_body(response.body, GroupList).group_list)
            for group in sorted(groups):
                lag = sum(
                    e.broker_offset - e.consumer_offset
                    for e in await self.consumer_progress(group, name)
                )
                out_tps, out_day = await self._summed(masters, "GROUP_GET_NUMS", f"{name}@{group}")
                rows.append(StatsRow(name, group, lag, out_tps, out_day))
        return rows

    async def consumer_status(
        self, group: str, client_id: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """Each online client's (or one client's) `ConsumerRunningInfo`: client id -> info.

        `mqTable` comes back as a list of queues, each with its topic, broker name and queue id.

        Raises:
            FerryError: the group (or that client) is not online.
        """
        connection = await self.consumer_connection(group)
        clients = [c.client_id for c in connection.connection_set]
        if client_id is not None:
            if client_id not in clients:
                raise FerryError(f"consumer {client_id} of group {group} is not online")
            clients = [client_id]
        masters = list((await self._masters_of(None, None)).values())
        found: dict[str, dict[str, Any]] = {}
        for client in clients:
            header = GetConsumerRunningInfoRequestHeader(consumer_group=group, client_id=client)
            last: FerryError | None = None
            for address in masters:  # any master the client is connected to can ask it
                response = await self._rpc.call(
                    address,
                    RemotingCommand(
                        code=RequestCode.GET_CONSUMER_RUNNING_INFO,
                        ext_fields=to_ext_fields(header),
                    ),
                    self._timeout,
                )
                if response.code != ResponseCode.SUCCESS:
                    last = RemoteError(response.code, f"broker {address}: {response.remark}")
                    continue
                info = loads(response.body)
                queues = []
                for key, value in dict(info.get("mqTable", {})).items():
                    topic, broker_name, queue_id = parse_mq_key(key)
                    queues.append(
                        {"topic": topic, "brokerName": broker_name, "queueId": queue_id, **value}
                    )
                info["mqTable"] = queues
                found[client] = info
                break
            else:
                raise last or FerryError(f"no master to ask consumer {client}")
        return found
