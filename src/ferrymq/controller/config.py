"""The controller's policy settings: election, liveness and lease timing.

These keys can be changed at runtime with UPDATE_CONTROLLER_CONFIG (1009); the change is
replicated through the controller log, so every node elects by the same rules. A node's identity
(id, peers, data directory, listen address) is process configuration, not here.

Defaults are chosen for failover in seconds (ARCHITECTURE.md section 6 item 4; RocketMQ's 10 s
heartbeat timeout gives failovers of 10 s and more):

- brokers heartbeat every 0.5 s (issue 7); one silent for `brokerHeartbeatTimeoutMillis` (3 s) is
  dead; a closed connection marks it dead at once.
- a master holds a lease of `masterLeaseMillis` (1.2 s) from each heartbeat the leader answers and
  stops accepting writes when it runs out. The controller elects a replacement only once
  `masterLeaseMillis + leaseMarginMillis` have passed since the master's last heartbeat, so the old
  master has stopped writing before the new one starts. A master killed with kill -9 is replaced
  about 1.4 s after its last heartbeat; one that hangs, after the 3 s heartbeat timeout.
- a new controller leader elects nobody for `electionGracePeriodMillis` (at least the heartbeat
  timeout and the lease plus margin), so brokers find it and live masters are heard first.
- the first election of a group waits up to `firstElectionWaitMillis` for its registered replicas
  to report their data, then picks by data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ferrymq.config import ConfigError, build_config, config_keys

__all__ = [
    "BLACKLISTED_KEYS",
    "INT32_MAX",
    "ControllerConfig",
    "apply_overrides",
    "config_properties",
    "validate_overrides",
]

INT32_MAX: Final = 2**31 - 1
"""RocketMQ's default `brokerElectionPriority` (lower is preferred)."""

BLACKLISTED_KEYS: Final = frozenset({"configBlackList", "configStorePath", "rocketmqHome"})
"""Keys UPDATE_CONTROLLER_CONFIG refuses with NO_PERMISSION, as RocketMQ does."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerConfig:
    """Election and liveness policy; field names are the snake_case of the RocketMQ-style keys."""

    enable_elect_unclean_master: bool = False
    """Allow a live replica outside the SyncStateSet to become master (may lose data)."""
    notify_broker_role_changed: bool = True
    """Push NOTIFY_BROKER_ROLE_CHANGED to a group's brokers after an election."""
    broker_heartbeat_timeout_millis: int = 3000
    """A broker silent this long is dead (a heartbeat may carry its own timeout)."""
    master_lease_millis: int = 1200
    """How long a master may accept writes after the leader last answered its heartbeat."""
    lease_margin_millis: int = 200
    """Extra wait past a master's lease before electing its replacement."""
    election_grace_period_millis: int = 3000
    """No controller-triggered election this long after this node became leader."""
    first_election_wait_millis: int = 3000
    """Longest a group's first election waits for its registered replicas."""
    scan_not_active_broker_interval: int = 500
    """Milliseconds between liveness scans on the leader."""
    elect_master_max_retry_count: int = 3
    """Attempts of one controller-triggered election."""
    delete_topic_enable: bool = True
    """Whether topics may be deleted (Kafka's `delete.topic.enable`, seed 003 section 2); when
    false the controller refuses every topic delete with NO_PERMISSION."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
                raise ValueError(f"{field.name} must be positive, not {value}")

    @property
    def heartbeat_timeout(self) -> float:
        """Seconds of silence after which a broker is dead."""
        return self.broker_heartbeat_timeout_millis / 1000

    @property
    def master_replace_wait(self) -> float:
        """Seconds after a master's last heartbeat before it may be replaced."""
        return (self.master_lease_millis + self.lease_margin_millis) / 1000

    @property
    def election_grace(self) -> float:
        """Seconds a new leader waits before any controller-triggered election.

        Never less than the heartbeat timeout (live brokers are heard first) nor the master's
        lease plus margin (a master the old leader renewed has stopped writing).
        """
        return max(
            self.election_grace_period_millis / 1000,
            self.heartbeat_timeout,
            self.master_replace_wait,
        )

    @property
    def first_election_wait(self) -> float:
        """Seconds the first election of a group waits for its registered replicas."""
        return self.first_election_wait_millis / 1000

    @property
    def scan_interval(self) -> float:
        """Seconds between liveness scans."""
        return self.scan_not_active_broker_interval / 1000


def validate_overrides(properties: Mapping[str, str]) -> None:
    """Check runtime changes: known keys, not blacklisted, values that convert.

    Raises:
        PermissionError: a blacklisted key.
        ConfigError: an unknown key or a bad value (the message names the key).
    """
    blocked = sorted(set(properties) & BLACKLISTED_KEYS)
    if blocked:
        raise PermissionError(f"{', '.join(blocked)}: may not be changed remotely")
    known = config_keys(ControllerConfig)
    unknown = sorted(set(properties) - set(known))
    if unknown:
        raise ConfigError(unknown[0], "not a controller config key")
    apply_overrides(ControllerConfig(), properties)


def apply_overrides(base: ControllerConfig, properties: Mapping[str, str]) -> ControllerConfig:
    """`base` with RocketMQ-keyed string values applied; unknown keys are ignored.

    Raises:
        ConfigError: a value does not convert.
    """
    if not properties:
        return base
    known = config_keys(ControllerConfig)
    changed, _ = build_config(ControllerConfig, {k: v for k, v in properties.items() if k in known})
    updates = {
        known[key].name: getattr(changed, known[key].name) for key in properties if key in known
    }
    return dataclasses.replace(base, **updates)


def config_properties(config: ControllerConfig) -> str:
    """Every key as `key=value` lines (the body of GET_CONTROLLER_CONFIG)."""
    lines = []
    for key, field in sorted(config_keys(ControllerConfig).items()):
        value = getattr(config, field.name)
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"
