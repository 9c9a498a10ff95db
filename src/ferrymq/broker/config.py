"""Broker settings: RocketMQ's `BrokerConfig` and `MessageStoreConfig` keys that ferrymq uses.

Field names are the snake_case of RocketMQ's keys, in RocketMQ's units; `store_config()` and the
`*_s` properties convert to what the Python code uses. Defaults follow RocketMQ except where the
field's comment says why not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from ferrymq.broker.metadata import SINK_TOPIC
from ferrymq.config import ConfigError
from ferrymq.metrics.exporter import DEFAULT_PROM_PORT, MetricsExporterType
from ferrymq.model import format_address, parse_address
from ferrymq.store.config import FlushDiskType, SegmentFill, StoreConfig
from ferrymq.wire.records import pack_host

__all__ = ["BrokerConfig", "BrokerRole"]

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class BrokerRole(StrEnum):
    """Replication role in classic (non-controller) mode (`brokerRole`)."""

    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"
    SLAVE = "SLAVE"


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """Settings of one broker."""

    broker_cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    broker_id: int = 0
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    namesrv_addr: str = ""
    """NameServer addresses separated by `;`."""
    listen_host: str = "127.0.0.1"
    """ferrymq key: the interface to bind (RocketMQ binds every interface)."""
    listen_port: int = 10911
    ha_listen_port: int = 0
    """0 = listen_port + 1."""
    broker_ip1: str = "127.0.0.1"
    """The address advertised to NameServers and clients."""
    enable_proxy: bool = False
    """Also run the RocketMQ 5 endpoint (`ferry proxy`) in this broker's process, as RocketMQ's
    `mqbroker --enable-proxy` does; the ports are its proxy's keys below."""
    grpc_server_port: int = 8081
    """The endpoint's gRPC port (RocketMQ proxy's `grpcServerPort`; 0: a free one)."""
    remoting_listen_port: int = 8080
    """The endpoint's remoting port (RocketMQ proxy's `remotingListenPort`; 0 free, -1 none)."""
    store_path_root_dir: Path = Path("~/store")
    store_path_commit_log: Path | None = None
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * 20
    file_reserved_time: float = 72.0
    """Hours a commit-log segment is kept."""
    disk_max_used_space_ratio: int = 75
    delete_when: str = "04"
    """Hour(s) of the day (`;`-separated) when expired segments are deleted."""
    auto_create_topic_enable: bool = False
    """Off by default (RocketMQ: on): a typo in a topic name should not create a topic."""
    auto_create_subscription_group: bool = True
    default_topic_queue_nums: int = 8
    max_message_size: int = 4 * 1024 * 1024
    broker_permission: int = 6
    acl_enable: bool = False
    """ACL 1.0 (issue 23): every request is checked against `aclFile` (docs/security.md)."""
    acl_file: Path | None = None
    """The `plain_acl.yml` of `aclEnable`; reloaded within a second of a change."""
    authentication_enabled: bool = False
    """ACL 2.0 (issue 23): every request is signed by a user (`ferry admin user`)."""
    authorization_enabled: bool = False
    """ACL 2.0: a Normal user may do only what its ACL allows (`ferry admin acl`)."""
    init_authentication_user: str = field(default="", repr=False)
    """JSON `{"username": ..., "password": ...}`: a Super user created at start if missing."""
    authentication_whitelist: str = ""
    """Request codes (comma-separated) that skip authentication."""
    authorization_whitelist: str = ""
    """Request codes (comma-separated) that skip authorization."""
    inner_client_authentication_credentials: str = field(default="", repr=False)
    """JSON `{"accessKey": ..., "secretKey": ...}`: what the broker process signs its own
    requests and its HA link with (`ferry broker` installs it; default: FERRY_ACCESS_KEY)."""
    enable_controller_mode: bool = False
    controller_addr: str = ""
    """Controller addresses separated by `;` (controller mode)."""
    store_path_broker_identity: Path | None = None
    """The persistent broker id file; default `<storePathRootDir>/brokerIdentity`."""
    broker_heartbeat_interval: int = 500
    """Milliseconds between heartbeats to the controller leader (controller mode; RocketMQ:
    1000). Each answer renews the master lease (1.2 s by default): two renewals fit in it."""
    controller_heart_beat_timeout_mills: int = 3000
    """How long the controller keeps this broker alive without a heartbeat (RocketMQ: 10 000;
    shorter here for failover in seconds)."""
    sync_broker_metadata_period: int = 2000
    """Milliseconds between polls of the group's master and SyncStateSet (RocketMQ: 5000); role
    changes are also pushed by the controller."""
    broker_election_priority: int = 2**31 - 1
    """Lower is preferred when the controller elects among equally up-to-date replicas."""
    register_name_server_period: int = 10_000
    """Milliseconds between registrations (RocketMQ: 30 000); changes register at once."""
    broker_timeout_millis: int = 30_000
    """How long a NameServer keeps this broker without hearing from it."""
    warm_maped_file_enable: bool = True
    """With SYNC_FLUSH, zero-fill and sync each commit-log segment before use (in the background
    for all but a new store's first), so a send's fsync commits no block allocation: about half
    the fsync wait on ext4. RocketMQ: false. Ignored with ASYNC_FLUSH, where no send waits for
    an fsync and the zeros would only double the disk writes."""
    preallocate_commit_log: bool = True
    """ferrymq key: `posix_fallocate` each commit-log segment before use (in the background)
    where `warmMapedFileEnable` does not zero-fill it, so appends skip the filesystem's per-page
    block reservation (a 64 KiB write: 13 -> 7.6 us on ext4). Off: segments are sparse."""
    flush_interval_commit_log: int = 500
    flush_interval_consume_queue: int = 1000
    sync_flush_timeout: int = 5000
    long_polling_enable: bool = True
    short_polling_time_mills: int = 1000
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    timer_wheel_enable: bool = True
    """Whether messages with a delivery time (TIMER_DELIVER_MS, TIMER_DELAY_SEC/MS) wait for it."""
    timer_max_delay_sec: int = 3 * 24 * 3600
    """The furthest delivery time a timer message may ask for, in seconds from now."""
    transaction_timeout: int = 6000
    """Milliseconds before an unresolved half message is checked (`transactionTimeOut`)."""
    transaction_check_max: int = 15
    sink_prepared_timeout: int = 86_400_000
    """ferrymq key: milliseconds an exactly-once sink's uncommitted prepared rows are kept."""
    transaction_check_interval: int = 30_000
    channel_expired_timeout: int = 120_000
    """Milliseconds without a heartbeat after which a client is dropped."""
    flush_consumer_offset_interval: int = 1000
    rebalance_lock_max_live_time: int = 60_000
    max_reconsume_times: int = 16
    """Default `retryMaxTimes` of a subscription group."""
    ha_master_address: str = ""
    """A slave's master HA address; empty: the one the NameServer names for this broker name."""
    ha_send_heartbeat_interval: int = 5000
    ha_housekeeping_interval: int = 20_000
    ha_transfer_batch_size: int = 32 * 1024
    ha_max_time_slave_not_catchup: int = 15_000
    min_in_sync_replicas: int = 1
    slave_timeout: int = 3000
    """Milliseconds a SYNC_MASTER send waits to be committed before answering not-committed."""
    busy_poll_micros: int = 300
    """ferrymq key: the longest the broker's loop keeps polling after a read instead of
    sleeping, in microseconds, sized to the gaps between reads (`rpc.busypoll`); 0: never.
    Sync sends one at a time (each a round trip after the last) then find the broker awake: on
    the 2-vCPU VM of docs/benchmarks.md a sync send's round trip 0.22 -> 0.13 ms, at the cost of
    up to a core of CPU while requests come less than this apart."""
    slave_read_enable: bool = False
    metrics_exporter_type: MetricsExporterType = MetricsExporterType.DISABLE
    """PROM: serve Prometheus metrics (docs/metrics.md) on `metricsPromExporterPort`."""
    metrics_prom_exporter_host: str = ""
    """The metrics endpoint's interface; "" = `listenHost` (RocketMQ: brokerIP1)."""
    metrics_prom_exporter_port: int = DEFAULT_PROM_PORT
    """0: a free port (the ready file names it)."""
    access_message_in_memory_max_ratio: int = 40
    """With `slaveReadEnable`, consumers further behind than this % of RAM read from a slave."""

    def __post_init__(self) -> None:
        for key, value in (
            ("listenPort", self.listen_port),
            ("haListenPort", self.ha_listen_port),
            ("metricsPromExporterPort", self.metrics_prom_exporter_port),
        ):
            if not 0 <= value <= 65535:
                raise ConfigError(key, f"port {value} is outside 0..65535")
        for key, number in (
            ("mappedFileSizeCommitLog", self.mapped_file_size_commit_log),
            ("mappedFileSizeConsumeQueue", self.mapped_file_size_consume_queue),
            ("defaultTopicQueueNums", self.default_topic_queue_nums),
            ("maxMessageSize", self.max_message_size),
            ("registerNameServerPeriod", self.register_name_server_period),
            ("haSendHeartbeatInterval", self.ha_send_heartbeat_interval),
            ("haHousekeepingInterval", self.ha_housekeeping_interval),
            ("haTransferBatchSize", self.ha_transfer_batch_size),
            ("haMaxTimeSlaveNotCatchup", self.ha_max_time_slave_not_catchup),
            ("minInSyncReplicas", self.min_in_sync_replicas),
            ("slaveTimeout", self.slave_timeout),
            ("brokerHeartbeatInterval", self.broker_heartbeat_interval),
            ("controllerHeartBeatTimeoutMills", self.controller_heart_beat_timeout_mills),
            ("syncBrokerMetadataPeriod", self.sync_broker_metadata_period),
            ("timerMaxDelaySec", self.timer_max_delay_sec),
        ):
            if number <= 0:
                raise ConfigError(key, f"must be positive, not {number}")
        if self.enable_proxy and self.authentication_enabled and not self.enable_controller_mode:
            # the endpoint checks ACL 2.0 users only with the controllers' (their passwords)
            raise ConfigError(
                "enableProxy",
                "the RocketMQ 5 endpoint checks ACL 2.0 users only in controller mode (it pulls "
                "them from controllerAddr): not with authenticationEnabled=true here "
                "(docs/security.md)",
            )
        if self.busy_poll_micros < 0:
            raise ConfigError("busyPollMicros", f"must be >= 0, not {self.busy_poll_micros}")
        if self.mapped_file_size_consume_queue % 20:
            raise ConfigError("mappedFileSizeConsumeQueue", "must be a multiple of 20")
        if self.broker_id < 0:
            raise ConfigError("brokerId", f"must be >= 0, not {self.broker_id}")
        if self.enable_controller_mode:
            # the role and the id come from the controller, whatever brokerRole says
            if not self.controller_addrs:
                raise ConfigError("controllerAddr", "controller mode needs controller addresses")
            for address in self.controller_addrs:
                try:
                    parse_address(address)
                except ValueError as exc:
                    raise ConfigError("controllerAddr", str(exc)) from None
        elif self.broker_role is BrokerRole.SLAVE and self.broker_id == 0:
            raise ConfigError("brokerId", "a SLAVE needs a broker id > 0")
        elif self.broker_role is not BrokerRole.SLAVE and self.broker_id != 0:
            raise ConfigError("brokerId", "a master has broker id 0")
        self.delay_levels_ms  # noqa: B018 - validates messageDelayLevel
        try:
            pack_host(self.broker_ip1, 0)
        except ValueError:
            raise ConfigError("brokerIP1", f"{self.broker_ip1!r} is not an IP address") from None
        for address in self.namesrv_addrs:
            try:
                parse_address(address)
            except ValueError as exc:
                raise ConfigError("namesrvAddr", str(exc)) from None
        if self.ha_master_address:
            try:
                parse_address(self.ha_master_address)
            except ValueError as exc:
                raise ConfigError("haMasterAddress", str(exc)) from None

    @property
    def namesrv_addrs(self) -> list[str]:
        """The NameServer addresses."""
        return [a.strip() for a in self.namesrv_addr.split(";") if a.strip()]

    @property
    def broker_addr(self) -> str:
        """`brokerIP1:listenPort`, the address clients use."""
        return format_address(self.broker_ip1, self.listen_port)

    @property
    def ha_port(self) -> int:
        """The HA listen port: `haListenPort`, else listen port + 1 (any free port for port 0)."""
        if self.ha_listen_port:
            return self.ha_listen_port
        return self.listen_port + 1 if self.listen_port else 0

    @property
    def controller_addrs(self) -> list[str]:
        """`controllerAddr` split on `;`."""
        return [a.strip() for a in self.controller_addr.split(";") if a.strip()]

    @property
    def identity_path(self) -> Path:
        """`storePathBrokerIdentity`, or its default under the store root."""
        return self.store_path_broker_identity or self.store_path_root_dir / "brokerIdentity"

    @property
    def replicated(self) -> bool:
        """Whether consumers may only see what the replication watermark covers."""
        return self.enable_controller_mode or self.broker_role in (
            BrokerRole.SYNC_MASTER,
            BrokerRole.SLAVE,
        )

    @property
    def delay_levels_ms(self) -> list[int]:
        """Delay of each level (level 1 first) in milliseconds."""
        levels: list[int] = []
        for item in self.message_delay_level.split():
            unit = _UNITS_MS.get(item[-1:])
            if unit is None or not item[:-1].isdigit():
                raise ConfigError("messageDelayLevel", f"bad level {item!r} (use e.g. 10s, 5m, 2h)")
            levels.append(int(item[:-1]) * unit)
        if not levels:
            raise ConfigError("messageDelayLevel", "no levels")
        return levels

    @property
    def _segment_fill(self) -> SegmentFill:
        if self.warm_maped_file_enable and self.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            return SegmentFill.ZEROED
        return SegmentFill.ALLOCATED if self.preallocate_commit_log else SegmentFill.SPARSE

    def store_config(self, advertised_port: int | None = None) -> StoreConfig:
        """The storage engine's settings."""
        return StoreConfig(
            root_dir=self.store_path_root_dir,
            commitlog_dir=self.store_path_commit_log,
            commitlog_segment_bytes=self.mapped_file_size_commit_log,
            consume_queue_entries=self.mapped_file_size_consume_queue // 20,
            flush_disk_type=self.flush_disk_type,
            segment_fill=self._segment_fill,
            flush_interval=self.flush_interval_commit_log / 1000,
            checkpoint_interval=self.flush_interval_consume_queue / 1000,
            max_message_bytes=self.max_message_size,
            file_reserved_hours=self.file_reserved_time,
            disk_max_used_ratio=self.disk_max_used_space_ratio / 100,
            store_host=pack_host(self.broker_ip1, advertised_port or self.listen_port),
            confirm_gated=self.replicated,
            unkeyed_topics=frozenset({SINK_TOPIC}),
        )
