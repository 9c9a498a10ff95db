"""The console's reads and actions, each one a call of the admin clients (or Connect's REST API).

Rules: every answer is read when asked, from the NameServers, the masters, the controllers or a
Connect worker, exactly as `ferry admin` and `ferry connect` read it; nothing is cached here.
Answers are plain JSON-ready dicts. A failure is a `ConsoleError` carrying the HTTP status and
the kind the API answers with: `bad_request` (400: a bad name, id or value), `not_found` (404),
`refused` (409: a server said no, or the cluster cannot do it, e.g. elect without controllers)
and `unavailable` (503: nothing answered).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

import httpx
import msgspec

from ferrymq.client.admin import AdminClient
from ferrymq.client.controller_admin import ControllerAdmin
from ferrymq.client.message import Message
from ferrymq.errors import FerryError, ProtocolError, RemoteError, RpcError
from ferrymq.model import format_address, validate_group, validate_topic
from ferrymq.rpc.client import RpcClient
from ferrymq.security.tls import process_client_tls
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.msgid import decode_offset_msg_id
from ferrymq.wire.records import unpack_host
from ferrymq.wire.topics import is_broker_local_topic

__all__ = ["ConsoleError", "ConsoleReader", "is_user_topic"]

BODY_PREVIEW_BYTES: Final = 1024
MAX_LOOKUP: Final = 32
_SYSTEM_TOPICS: Final = frozenset(
    {"TBW102", "BenchmarkTest", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"}
)
_SYSTEM_GROUP_PREFIXES: Final = ("CID_RMQ_SYS_", "CID_ONSAPI_", "TOOLS_CONSUMER", "FILTERSRV_")
_SYSTEM_GROUPS: Final = frozenset(
    {"SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY", "CID_SYS_RMQ_TRANS", "DEFAULT_CONSUMER"}
)


class ConsoleError(Exception):
    """An answer the API gives as `{"error": kind, "message": ...}` with an HTTP status."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


def is_user_topic(topic: str) -> bool:
    """Whether the topics page lists `topic` (not a system, retry or dead-letter topic).

    >>> is_user_topic("orders"), is_user_topic("%RETRY%g"), is_user_topic("TBW102")
    (True, False, False)
    """
    return not (is_broker_local_topic(topic) or topic in _SYSTEM_TOPICS)


def _is_user_group(group: str) -> bool:
    return group not in _SYSTEM_GROUPS and not group.startswith(_SYSTEM_GROUP_PREFIXES)


@contextlib.asynccontextmanager
async def _answers() -> AsyncIterator[None]:
    """Turn the admin clients' errors into the API's."""
    try:
        yield
    except ConsoleError:
        raise
    except (ValueError, ProtocolError) as exc:  # names, ids and values checked by the clients
        raise ConsoleError(400, "bad_request", str(exc)) from None
    except RpcError as exc:
        raise ConsoleError(503, "unavailable", str(exc)) from None
    except RemoteError as exc:
        raise ConsoleError(409, "refused", str(exc)) from None
    except FerryError as exc:
        raise ConsoleError(409, "refused", str(exc)) from None
    except httpx.HTTPError as exc:
        raise ConsoleError(503, "unavailable", f"Connect REST: {exc}") from None


class _GroupTable(msgspec.Struct, rename="camel"):
    """The part of GET_ALL_SUBSCRIPTIONGROUP_CONFIG's body the console reads (the names)."""

    subscription_group_table: dict[str, Any] = msgspec.field(default_factory=dict)


def _message(message: Message) -> dict[str, Any]:
    body = message.body[:BODY_PREVIEW_BYTES]
    return {
        "topic": message.topic,
        "broker_name": message.broker_name,
        "queue_id": message.queue_id,
        "queue_offset": message.queue_offset,
        "msg_id": message.msg_id,
        "offset_msg_id": message.offset_msg_id,
        "keys": message.keys,
        "tags": message.tags,
        "born_timestamp_ms": message.born_timestamp_ms,
        "store_timestamp_ms": message.store_timestamp_ms,
        "body_bytes": len(message.body),
        "body": body.decode("utf-8", errors="replace"),
        "properties": message.properties,
    }


class ConsoleReader:
    """The admin clients of one cluster (and the URL of its Connect REST API, if any)."""

    def __init__(
        self,
        namesrv_addr: str,
        *,
        controller_addr: str | None = None,
        connect_url: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        self._rpc = RpcClient()
        self._timeout = timeout
        self.admin = AdminClient(namesrv_addr, timeout=timeout, rpc=self._rpc)
        self._controllers = (
            ControllerAdmin(controller_addr, timeout=timeout, rpc=self._rpc)
            if controller_addr
            else None
        )
        self.connect_url = connect_url.rstrip("/") if connect_url else None
        # Connect's REST over https when the process has TLS (the worker serves its certificate)
        self._http = httpx.AsyncClient(timeout=timeout, verify=process_client_tls().context or True)

    async def close(self) -> None:
        """Close every connection."""
        await self._http.aclose()
        await self._rpc.close()

    async def controllers(self) -> ControllerAdmin | None:
        """The controllers given, else those the brokers name (None: classic mode)."""
        if self._controllers is not None:
            return self._controllers
        return await self.admin.controllers()

    # ------------------------------------------------------------------ cluster

    async def _runtime(self, address: str) -> dict[str, str] | None:
        """A broker's GET_BROKER_RUNTIME_INFO table (None: it does not answer)."""
        try:
            response = await self._rpc.call(
                address,
                RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO),
                self._timeout,
            )
        except RpcError:
            return None
        if response.code != ResponseCode.SUCCESS:
            return None
        return decode_body(response.body, KVTable).table

    async def cluster(self) -> dict[str, Any]:
        """Every broker group: its master, replicas, SyncStateSet, epochs and confirm offsets.

        The master and SyncStateSet are the controller's (controller mode) or the NameServer's
        routes (classic mode); offsets are each broker's own runtime figures.
        """
        async with _answers():
            info = await self.admin.cluster_info()
            controllers = await self.controllers()
            names = sorted(info.broker_addr_table)
            replicas = (
                (await controllers.sync_state_data(names)).replicas_info_table
                if controllers is not None and names
                else {}
            )
        groups: list[dict[str, Any]] = []
        for name in names:
            data = info.broker_addr_table[name]
            cluster = data.cluster
            known = replicas.get(name)
            members: dict[int, dict[str, Any]] = {}
            if known is not None:
                for replica in known.in_sync_replicas + known.not_in_sync_replicas:
                    members[replica.broker_id] = {
                        "broker_id": replica.broker_id,
                        "address": replica.broker_address,
                        "alive": replica.alive,
                        "in_sync": replica in known.in_sync_replicas,
                    }
                master_id = known.master_broker_id
                master_address = known.master_address
            else:  # classic mode: id 0 is the master, every slave is "in sync" as routed
                for broker_id, address in data.broker_addrs.items():
                    members[broker_id] = {
                        "broker_id": broker_id,
                        "address": address,
                        "alive": True,
                        "in_sync": True,
                    }
                master_id = 0 if 0 in data.broker_addrs else None
                master_address = data.broker_addrs.get(0)
            for member in members.values():
                runtime = await self._runtime(member["address"]) if member["alive"] else None
                member["role"] = (
                    ("master" if member["address"] == master_address else "slave")
                    if master_address
                    else "slave"
                )
                member["answering"] = runtime is not None
                member["broker_role"] = (runtime or {}).get("brokerRole")
                member["max_log_offset"] = _int_or_none((runtime or {}).get("commitLogMaxOffset"))
                member["confirm_offset"] = _int_or_none((runtime or {}).get("confirmOffset"))
                member["master_epoch"] = _int_or_none((runtime or {}).get("masterEpoch"))
            groups.append(
                {
                    "broker_name": name,
                    "cluster": cluster,
                    "master_broker_id": master_id,
                    "master_address": master_address,
                    "master_epoch": known.master_epoch if known is not None else None,
                    "sync_state_set_epoch": (
                        known.sync_state_set_epoch if known is not None else None
                    ),
                    "sync_state_set": sorted(
                        m["broker_id"] for m in members.values() if m["in_sync"]
                    ),
                    "replicas": [members[i] for i in sorted(members)],
                }
            )
        return {
            "controller_mode": controllers is not None,
            "clusters": {c: sorted(n) for c, n in sorted(info.cluster_addr_table.items())},
            "groups": groups,
        }

    async def masters(self) -> dict[str, tuple[int | None, str | None, int]]:
        """Per group, the controller's master id, address and epoch (empty in classic mode)."""
        async with _answers():
            controllers = await self.controllers()
            if controllers is None:
                return {}
            names = sorted((await self.admin.cluster_info()).broker_addr_table)
            if not names:
                return {}
            table = (await controllers.sync_state_data(names)).replicas_info_table
        return {
            name: (known.master_broker_id, known.master_address, known.master_epoch)
            for name, known in table.items()
        }

    async def controller(self) -> dict[str, Any]:
        """Each controller node's view: who leads, its term and applied index."""
        controllers = await self.controllers()
        if controllers is None:
            return {"controller_mode": False, "nodes": [], "leader": None}
        nodes: list[dict[str, Any]] = []
        leader: str | None = None
        for address in controllers.addresses:
            try:
                meta = await controllers.metadata(address)
            except (RpcError, RemoteError) as exc:
                nodes.append({"address": address, "answering": False, "error": str(exc)})
                continue
            if meta.is_leader:
                leader = address
            nodes.append(
                {
                    "address": address,
                    "answering": True,
                    "controller_id": meta.controller_id,
                    "is_leader": meta.is_leader,
                    "leader_id": meta.controller_leader_id,
                    "leader_address": meta.controller_leader_address,
                    "term": meta.term,
                    "applied_index": meta.applied_index,
                }
            )
        return {"controller_mode": True, "nodes": nodes, "leader": leader}

    # ------------------------------------------------------------------ topics and groups

    async def topic_names(self, *, system: bool = False) -> list[str]:
        """Routed topics (without system ones unless `system`)."""
        async with _answers():
            names = await self.admin.topics()
        return sorted(t for t in names if system or is_user_topic(t))

    async def topic(self, topic: str) -> dict[str, Any]:
        """A topic's queues: bounds and last store time, per group and queue."""
        async with _answers():
            validate_topic(topic)
            if await self.admin.route(topic) is None:
                raise ConsoleError(404, "not_found", f"no route for topic {topic!r}")
            entries = await self.admin.topic_status(topic)
        queues = [
            {
                "broker_name": e.broker_name,
                "queue_id": e.queue_id,
                "min_offset": e.min_offset,
                "max_offset": e.max_offset,
                "messages": e.max_offset - e.min_offset,
                "last_update_timestamp": e.last_update_timestamp,
            }
            for e in sorted(entries, key=lambda e: (e.broker_name, e.queue_id))
        ]
        return {
            "topic": topic,
            "queues": queues,
            "max_offset_total": sum(q["max_offset"] for q in queues),
        }

    async def group_names(self) -> list[str]:
        """Consumer groups the masters know (GET_ALL_SUBSCRIPTIONGROUP_CONFIG), but system ones."""
        async with _answers():
            info = await self.admin.cluster_info()
        names: set[str] = set()
        for data in info.broker_addr_table.values():
            address = data.broker_addrs.get(0)
            if address is None:
                continue
            try:
                response = await self._rpc.call(
                    address,
                    RemotingCommand(code=RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
                    self._timeout,
                )
            except RpcError:
                continue
            if response.code == ResponseCode.SUCCESS:
                table = msgspec.json.decode(response.body, type=_GroupTable)
                names |= set(table.subscription_group_table)
        return sorted(n for n in names if _is_user_group(n))

    async def group(self, group: str, topic: str | None = None) -> dict[str, Any]:
        """A group's committed offset, the queue's end and the lag, per queue."""
        async with _answers():
            validate_group(group)
            entries = await self.admin.consumer_progress(group, topic)
        queues = [
            {
                "topic": e.topic,
                "broker_name": e.broker_name,
                "queue_id": e.queue_id,
                "broker_offset": e.broker_offset,
                "consumer_offset": e.consumer_offset,
                "lag": max(0, e.broker_offset - max(e.consumer_offset, 0)),
            }
            for e in sorted(entries, key=lambda e: (e.topic, e.broker_name, e.queue_id))
        ]
        return {
            "group": group,
            "queues": queues,
            "lag": sum(max(0, e.broker_offset - max(e.consumer_offset, 0)) for e in entries),
            "consumed_total": sum(max(e.consumer_offset, 0) for e in entries),
        }

    # ------------------------------------------------------------------ messages, connectors

    async def messages(
        self, *, msg_id: str | None, topic: str | None, key: str | None
    ) -> list[dict[str, Any]]:
        """Messages by offset message id, or by key (unique keys included) within a topic."""
        async with _answers():
            if msg_id:
                found_by_id = await self.admin.message_by_id(msg_id.strip())
                if not found_by_id.broker_name:  # the id names the storing broker's address
                    found_by_id.broker_name = await self._group_of(msg_id.strip())
                return [_message(found_by_id)]
            if not topic or not key:
                raise ConsoleError(
                    400, "bad_request", "give a message id, or a topic and a key to look up"
                )
            validate_topic(topic)
            found = await self.admin.messages_by_key(topic, key, max_count=MAX_LOOKUP)
        return [_message(m) for m in found]

    async def _group_of(self, offset_msg_id: str) -> str:
        """The broker group of the broker that stored a message ("" if no live group has it)."""
        store_host, _ = decode_offset_msg_id(offset_msg_id)
        address = format_address(*unpack_host(store_host))
        info = await self.admin.cluster_info()
        for name, data in sorted(info.broker_addr_table.items()):
            if address in data.broker_addrs.values():
                return name
        return ""

    async def connectors(self) -> dict[str, Any]:
        """Connect's connectors with their and their tasks' states (when a URL is configured)."""
        if self.connect_url is None:
            return {"configured": False, "url": None, "connectors": []}
        async with _answers():
            response = await self._http.get(
                f"{self.connect_url}/connectors", params={"expand": "status"}
            )
            response.raise_for_status()
            body = response.json()
        rows = []
        for name, entry in sorted(body.items()):
            status = entry.get("status", {})
            rows.append(
                {
                    "name": name,
                    "type": status.get("type"),
                    "state": status.get("connector", {}).get("state"),
                    "worker_id": status.get("connector", {}).get("worker_id"),
                    "tasks": [
                        {
                            "id": t.get("id"),
                            "state": t.get("state"),
                            "worker_id": t.get("worker_id"),
                        }
                        for t in status.get("tasks", [])
                    ],
                }
            )
        return {"configured": True, "url": self.connect_url, "connectors": rows}

    # ------------------------------------------------------------------ actions

    async def create_topic(self, topic: str, queues: int, cluster: str | None) -> dict[str, Any]:
        """Create a topic (`ferry admin topic create`); the masters that took it."""
        async with _answers():
            masters = await self.admin.create_topic(topic, queues, cluster=cluster)
        return {"topic": topic, "queues": queues, "masters": masters}

    async def reset_offsets(
        self, group: str, topic: str, to: str, timestamp_ms: int | None
    ) -> dict[str, Any]:
        """Move a group's offsets in a topic to `earliest`, `latest` or `timestamp`."""
        async with _answers():
            validate_group(group)
            validate_topic(topic)
            if await self.admin.route(topic) is None:
                raise ConsoleError(404, "not_found", f"no route for topic {topic!r}")
            moved = await self.admin.reset_offsets(
                group,
                topic,
                timestamp_ms=timestamp_ms if to == "timestamp" else None,
                to_latest=to == "latest",
            )
        return {
            "group": group,
            "topic": topic,
            "queues": [
                {"broker_name": b, "queue_id": q, "offset": o}
                for (b, q), o in sorted(moved.items())
            ],
        }

    async def elect_master(self, broker_name: str, broker_id: int | None) -> dict[str, Any]:
        """Ask the controller for a new master of a group (`ferry admin elect-master`)."""
        async with _answers():
            controllers = await self.controllers()
            if controllers is None:
                raise ConsoleError(
                    409, "refused", "electing a master needs controller mode (no controllers)"
                )
            info = await self.admin.cluster_info()
            data = info.broker_addr_table.get(broker_name)
            if data is None:
                raise ConsoleError(404, "not_found", f"no broker group {broker_name!r}")
            result = await controllers.elect_master(
                data.cluster, broker_name, broker_id, designate=broker_id is not None
            )
        return {
            "broker_name": broker_name,
            "still_exists": result.still_exists,
            "master_broker_id": result.header.master_broker_id,
            "master_address": result.header.master_address,
            "master_epoch": result.header.master_epoch,
            "sync_state_set": result.body.sync_state_set,
        }


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text not in (None, "") and text.lstrip("-").isdigit() else None
