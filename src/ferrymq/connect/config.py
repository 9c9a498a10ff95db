"""A Connect worker's configuration: RocketMQ Connect's key names where they exist.

`ferry connect worker --config connect.properties` reads `key=value` lines; every key also has a
`--kebab-case` flag (flags win). RocketMQ Connect's keys (`WorkerConfig`): `workerId`,
`namesrvAddr`, `httpPort`, `connectClusterId`, `configStoreTopic`, `connectStatusTopic`,
`positionStoreTopic`, `storePathRootDir`. ferrymq's own keys (Kafka Connect's meaning where it
has one) say how fast a dead leader or worker is replaced and how REST writes reach the leader.
`check` refuses a bad value with one line naming the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ferrymq.config import ConfigError
from ferrymq.model import parse_address, validate_group, validate_topic

__all__ = ["FOLLOWER_MODES", "WorkerConfig"]

FOLLOWER_MODES = ("forward", "redirect")

_WORKER_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """One worker; field names are the snake_case of the keys."""

    namesrv_addr: str = ""
    """NameServer addresses, `HOST:PORT;HOST:PORT` (required)."""
    worker_id: str = ""
    """Unique in the cluster; empty: `<host>:<port>` of the REST listener."""
    connect_cluster_id: str = "DefaultConnectCluster"
    """Workers with the same id form one cluster (group `connect-<id>` on the config broker)."""
    http_host: str = "127.0.0.1"
    """Address the REST listener binds."""
    http_port: int = 8082
    """REST port (0: any free port)."""
    advertised_url: str = ""
    """The URL other workers and clients reach this worker at; empty: http://host:port. Checked at
    start: it must reach this worker itself."""
    config_store_topic: str = "connector-config-topic"
    """The fenced config log (one queue)."""
    connect_status_topic: str = "connector-status-topic"
    """Task states, written by the worker that runs each task."""
    position_store_topic: str = "connector-position-topic"
    """Source connectors' positions (what GET .../offsets shows for a source)."""
    config_store_broker_name: str = ""
    """The broker group that holds the config log when a worker creates it (empty: the first
    group by name)."""
    store_path_root_dir: Path = field(default_factory=lambda: Path.home() / "storeRoot")
    """Local state: task checkpoints, under `<dir>/<cluster>/<connector>/<incarnation>/<task>`."""
    heartbeat_interval_ms: int = 1000
    """How often the worker heartbeats to the config topic's broker and reads the members."""
    session_timeout_ms: int = 6000
    """A silent worker leaves the group after this long (a closed connection: at once); a worker
    that cannot heartbeat for this long stops its own tasks."""
    leader_failover_grace_ms: int = 1000
    """How long the leader may be absent from the group before another worker claims."""
    task_reassign_grace_ms: int = 3000
    """How long a departed worker's tasks wait for it to come back before they move (Kafka's
    scheduled.rebalance.max.delay.ms, 300 s there)."""
    snapshot_interval_ms: int = 600_000
    """The leader writes a snapshot record this often (and after each claim)."""
    rest_follower_mode: str = "forward"
    """forward: a follower proxies writes to the leader; redirect: 307/308 to the leader."""
    rest_request_timeout_ms: int = 90_000
    """A write not committed and applied by then is answered 504 (outcome unknown)."""
    access_key: str = ""
    """ACL 1.0 (issue 23): `ferry connect worker` installs it for its whole process
    (`aclcredentials.export_credentials`), so the worker, its clients and its tasks' Spark
    queries sign with it; a `Worker` built in-process signs with the process's credentials."""
    secret_key: str = field(default="", repr=False)
    """The access key's secret (never in a repr, a log or the REST API)."""
    status_republish_ms: int = 30_000
    """Each worker writes the states of its tasks again this often (the status topic is not
    compacted: a worker starting reads the last two periods)."""

    def check(self) -> WorkerConfig:
        """Self, once every value is usable.

        Raises:
            ConfigError: naming the first bad key.
        """
        if not self.namesrv_addr.strip():
            raise ConfigError("namesrvAddr", "required: the NameServer addresses, HOST:PORT;...")
        for address in self.namesrv_addr.split(";"):
            if address.strip():
                try:
                    parse_address(address)
                except ValueError as exc:
                    raise ConfigError("namesrvAddr", str(exc)) from None
        if self.worker_id and not _WORKER_ID.fullmatch(self.worker_id):
            raise ConfigError("workerId", "use 1-128 letters, digits and _.:@-")
        try:
            validate_group(f"connect-{self.connect_cluster_id}")
        except ValueError as exc:
            raise ConfigError("connectClusterId", str(exc)) from None
        for key, topic in (
            ("configStoreTopic", self.config_store_topic),
            ("connectStatusTopic", self.connect_status_topic),
            ("positionStoreTopic", self.position_store_topic),
        ):
            try:
                validate_topic(topic)
            except ValueError as exc:
                raise ConfigError(key, str(exc)) from None
        if len({self.config_store_topic, self.connect_status_topic, self.position_store_topic}) < 3:
            raise ConfigError("configStoreTopic", "the config, status and position topics differ")
        if not 0 <= self.http_port <= 65535:
            raise ConfigError("httpPort", f"{self.http_port} is not a port")
        if self.advertised_url:
            parts = urlsplit(self.advertised_url)
            if (
                parts.scheme not in ("http", "https")
                or not parts.hostname
                or parts.path
                not in (
                    "",
                    "/",
                )
            ):
                raise ConfigError("advertisedUrl", "must be http(s)://HOST:PORT")
        if self.rest_follower_mode not in FOLLOWER_MODES:
            raise ConfigError("restFollowerMode", f"one of {', '.join(FOLLOWER_MODES)}")
        bounds = {
            "heartbeatIntervalMs": (self.heartbeat_interval_ms, 50, 60_000),
            "sessionTimeoutMs": (self.session_timeout_ms, 1000, 120_000),
            "leaderFailoverGraceMs": (self.leader_failover_grace_ms, 0, 600_000),
            "taskReassignGraceMs": (self.task_reassign_grace_ms, 0, 3_600_000),
            "snapshotIntervalMs": (self.snapshot_interval_ms, 1000, 24 * 3_600_000),
            "restRequestTimeoutMs": (self.rest_request_timeout_ms, 100, 3_600_000),
            "statusRepublishMs": (self.status_republish_ms, 100, 3_600_000),
        }
        for key, (value, low, high) in bounds.items():
            if not low <= value <= high:
                raise ConfigError(key, f"{value} is not in {low}..{high}")
        if self.heartbeat_interval_ms * 2 > self.session_timeout_ms:
            raise ConfigError(
                "sessionTimeoutMs", "must be at least twice heartbeatIntervalMs (one missed beat)"
            )
        return self

    @property
    def group(self) -> str:
        """The consumer group the workers join on the config topic's broker."""
        return f"connect-{self.connect_cluster_id}"

    def url_for(self, port: int) -> str:
        """The advertised URL once the listener's port is known."""
        if self.advertised_url:
            return self.advertised_url.rstrip("/")
        host = self.http_host if self.http_host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    def id_for(self, port: int) -> str:
        """The worker id once the listener's port is known."""
        return self.worker_id or f"{self.http_host}:{port}"
