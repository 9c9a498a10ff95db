"""The NameServer route table: which broker groups serve which topics (`RouteInfoManager`).

Pure: no clock (callers pass `now`, monotonic seconds), no I/O, one owner.

Rules:
1. A broker is live while it keeps registering (or heartbeating) within its timeout; `expire`
   removes the others, and `unregister_address` removes one at once when its connection drops.
2. A group's master registers as broker id 0. An address that registers under another id leaves
   its old id. A registration for an id held by another live address with a higher
   `state_version` is refused: a stale master cannot overwrite a newer one (controller mode uses
   the master epoch as state version).
3. A master's registration states its group's whole topic set: topics it no longer lists lose
   that group's queues.
4. A group whose write permission was wiped (WIPE_WRITE_PERM_OF_BROKER, to drain it before
   maintenance) is offered read-only in every route until it is added back, whatever its brokers
   register meanwhile (RocketMQ rewrites the stored queue data instead, which the group's next
   changed registration undoes).
5. A topic with moved queues (issue 20 section 4): each group's registration carries the
   controller's queue map in the `ferry.queueMap` attribute; routes offer the newest one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import msgspec

from ferrymq.errors import ProtocolError
from ferrymq.wire.bodies import (
    BrokerData,
    ClusterInfo,
    DataVersion,
    Perm,
    QueueData,
    TopicConfig,
    TopicRouteData,
)
from ferrymq.wire.queuemap import QUEUE_MAP_ATTRIBUTE, decode_queue_map

__all__ = ["MASTER_ID", "RegisterResult", "RouteTable"]

log = logging.getLogger(__name__)

MASTER_ID = 0


@dataclass(slots=True)
class _Live:
    cluster: str
    broker_name: str
    broker_id: int
    ha_server_addr: str
    data_version: DataVersion
    last_update: float
    timeout: float


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """What a registering broker learns: its group's master and the master's HA address."""

    accepted: bool
    master_addr: str | None = None
    ha_server_addr: str | None = None
    reason: str | None = None


@dataclass(slots=True)
class _Group:
    cluster: str
    broker_name: str
    addrs: dict[int, str] = field(default_factory=dict)


class RouteTable:
    """Topics, broker groups, clusters and live brokers."""

    def __init__(self) -> None:
        self._topics: dict[str, dict[str, QueueData]] = {}
        self._maps: dict[str, dict[str, tuple[int, str]]] = {}
        """topic -> group -> (map version, map text) of topics with moved queues (rule 5)."""
        self._groups: dict[str, _Group] = {}
        self._clusters: dict[str, set[str]] = {}
        self._live: dict[str, _Live] = {}
        self.write_wiped: set[str] = set()
        """Broker names offered read-only (rule 4)."""
        self.version = 0
        """Bumped on every change, so callers can tell whether routes moved."""

    # ------------------------------------------------------------------ registration

    def register(
        self,
        *,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str,
        data_version: DataVersion,
        topics: dict[str, TopicConfig] | None,
        now: float,
        timeout: float,
    ) -> RegisterResult:
        """Record a broker's (re)registration; return its group's master."""
        group = self._groups.get(broker_name)
        if group is not None and group.cluster != cluster:
            return RegisterResult(
                False, reason=f"broker name {broker_name} belongs to cluster {group.cluster}"
            )
        if group is None:
            group = self._groups[broker_name] = _Group(cluster, broker_name)
        held_by = group.addrs.get(broker_id)
        if held_by is not None and held_by != broker_addr:
            holder = self._live.get(held_by)
            if (
                holder is not None
                and holder.data_version.state_version > data_version.state_version
            ):
                log.warning(
                    "refusing %s as %s/%d: %s holds it with state version %d > %d",
                    broker_addr,
                    broker_name,
                    broker_id,
                    held_by,
                    holder.data_version.state_version,
                    data_version.state_version,
                )
                self._live.pop(broker_addr, None)
                return RegisterResult(
                    False,
                    master_addr=group.addrs.get(MASTER_ID),
                    reason=f"{held_by} holds broker id {broker_id} with a newer state version",
                )
        for other_id in [
            i for i, addr in group.addrs.items() if addr == broker_addr and i != broker_id
        ]:
            del group.addrs[other_id]
        changed = group.addrs.get(broker_id) != broker_addr
        group.addrs[broker_id] = broker_addr
        self._clusters.setdefault(cluster, set()).add(broker_name)
        previous = self._live.get(broker_addr)
        self._live[broker_addr] = _Live(
            cluster, broker_name, broker_id, ha_server_addr, data_version, now, timeout
        )
        if topics is not None and broker_id == MASTER_ID:
            changed |= self._set_group_topics(broker_name, topics)
        if changed or previous is None:
            self.version += 1
        master = group.addrs.get(MASTER_ID)
        master_live = self._live.get(master) if master else None
        return RegisterResult(
            True,
            master_addr=master,
            ha_server_addr=master_live.ha_server_addr if master_live else None,
        )

    def _set_group_topics(self, broker_name: str, topics: dict[str, TopicConfig]) -> bool:
        changed = False
        for topic, config in topics.items():
            queue = QueueData(
                broker_name=broker_name,
                read_queue_nums=config.read_queue_nums,
                write_queue_nums=config.write_queue_nums,
                perm=config.perm,
                topic_sys_flag=config.topic_sys_flag,
            )
            queues = self._topics.setdefault(topic, {})
            if queues.get(broker_name) != queue:
                queues[broker_name] = queue
                changed = True
            changed |= self._set_map(topic, broker_name, config.attributes.get(QUEUE_MAP_ATTRIBUTE))
        for topic in [t for t, q in self._topics.items() if broker_name in q and t not in topics]:
            changed |= self._remove_topic_from_group(topic, broker_name)
        return changed

    def _set_map(self, topic: str, broker_name: str, text: str | None) -> bool:
        maps = self._maps.get(topic, {})
        if text is None:
            if maps.pop(broker_name, None) is None:
                return False
            if not maps:
                self._maps.pop(topic, None)
            return True
        try:
            version = decode_queue_map(text).version
        except ProtocolError as exc:
            log.warning("%s's queue map of %s ignored: %s", broker_name, topic, exc)
            return False
        if maps.get(broker_name) == (version, text):
            return False
        self._maps.setdefault(topic, {})[broker_name] = (version, text)
        return True

    def _remove_topic_from_group(self, topic: str, broker_name: str) -> bool:
        queues = self._topics.get(topic)
        self._set_map(topic, broker_name, None)
        if queues is None or broker_name not in queues:
            return False
        del queues[broker_name]
        if not queues:
            del self._topics[topic]
        return True

    def heartbeat(
        self, broker_addr: str, now: float, data_version: DataVersion | None = None
    ) -> bool:
        """Refresh a live broker; False when it is not registered (it must register)."""
        live = self._live.get(broker_addr)
        if live is None:
            return False
        live.last_update = now
        if data_version is not None:
            live.data_version = data_version
        return True

    def unregister(
        self, *, cluster: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> None:
        """Remove one broker (UNREGISTER_BROKER)."""
        group = self._groups.get(broker_name)
        if group is not None and group.addrs.get(broker_id) == broker_addr:
            self._remove(broker_addr)
        else:
            self._live.pop(broker_addr, None)

    def unregister_address(self, broker_addr: str) -> bool:
        """Remove whatever registered from `broker_addr` (its connection closed)."""
        if broker_addr not in self._live:
            return False
        self._remove(broker_addr)
        return True

    def _remove(self, broker_addr: str) -> None:
        live = self._live.pop(broker_addr, None)
        if live is None:
            return
        group = self._groups.get(live.broker_name)
        if group is None:
            return
        for broker_id in [i for i, a in group.addrs.items() if a == broker_addr]:
            del group.addrs[broker_id]
        if not group.addrs:
            del self._groups[live.broker_name]
            names = self._clusters.get(live.cluster)
            if names is not None:
                names.discard(live.broker_name)
                if not names:
                    del self._clusters[live.cluster]
            for topic in [t for t, q in self._topics.items() if live.broker_name in q]:
                self._remove_topic_from_group(topic, live.broker_name)
        self.version += 1
        log.info(
            "broker %s (%s/%d) removed from routes", broker_addr, live.broker_name, live.broker_id
        )

    def expire(self, now: float) -> list[str]:
        """Remove brokers whose last registration is older than their timeout."""
        for live in self._live.values():
            # a time after `now`: the clock stepped back; count the silence from now on
            live.last_update = min(live.last_update, now)
        expired = [a for a, live in self._live.items() if now - live.last_update > live.timeout]
        for broker_addr in expired:
            log.warning("broker %s expired: no registration within its timeout", broker_addr)
            self._remove(broker_addr)
        return expired

    # ------------------------------------------------------------------ topics

    def delete_topic(self, topic: str, cluster: str | None = None) -> bool:
        """Forget a topic everywhere, or only on the groups of `cluster`."""
        queues = self._topics.get(topic)
        if queues is None:
            return False
        if cluster is None:
            del self._topics[topic]
            self._maps.pop(topic, None)
        else:
            for broker_name in self._clusters.get(cluster, set()):
                queues.pop(broker_name, None)
            if not queues:
                del self._topics[topic]
        self.version += 1
        return True

    def wipe_write_perm(self, broker_name: str) -> int:
        """Offer `broker_name`'s queues read-only from now on; returns how many topics it holds."""
        if broker_name not in self.write_wiped:
            self.write_wiped.add(broker_name)
            self.version += 1
            log.warning("write permission of broker group %s wiped", broker_name)
        return self._topic_count(broker_name)

    def add_write_perm(self, broker_name: str) -> int:
        """Undo `wipe_write_perm`; returns how many topics the group holds."""
        if broker_name in self.write_wiped:
            self.write_wiped.discard(broker_name)
            self.version += 1
            log.info("write permission of broker group %s added back", broker_name)
        return self._topic_count(broker_name)

    def _topic_count(self, broker_name: str) -> int:
        return sum(1 for queues in self._topics.values() if broker_name in queues)

    def route_of(self, topic: str) -> TopicRouteData | None:
        """The topic's queues and the addresses of the groups that hold them."""
        queues = self._topics.get(topic)
        if not queues:
            return None
        groups = [self._groups[name] for name in sorted(queues) if name in self._groups]
        if not groups:
            return None
        maps = self._maps.get(topic)
        return TopicRouteData(
            queue_datas=[self._offered(queues[name]) for name in sorted(queues)],
            broker_datas=[self._broker_data(group) for group in groups],
            ferry_queue_map=max(maps.values())[1] if maps else None,
        )

    def _offered(self, queue: QueueData) -> QueueData:
        if queue.broker_name in self.write_wiped and queue.perm & Perm.WRITE:
            return msgspec.structs.replace(queue, perm=queue.perm & ~Perm.WRITE)
        return queue

    @staticmethod
    def _broker_data(group: _Group) -> BrokerData:
        return BrokerData(
            cluster=group.cluster,
            broker_name=group.broker_name,
            broker_addrs=dict(sorted(group.addrs.items())),
        )

    def topics(self) -> list[str]:
        """Every topic with a route."""
        return sorted(self._topics)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        """Topics with queues on the groups of `cluster`."""
        names = self._clusters.get(cluster, set())
        return sorted(t for t, q in self._topics.items() if names & q.keys())

    def cluster_info(self) -> ClusterInfo:
        """Every group and every cluster."""
        return ClusterInfo(
            broker_addr_table={
                name: self._broker_data(g) for name, g in sorted(self._groups.items())
            },
            cluster_addr_table={c: sorted(names) for c, names in sorted(self._clusters.items())},
        )

    def is_live(self, broker_addr: str) -> bool:
        """Whether `broker_addr` is registered."""
        return broker_addr in self._live
