"""The connector plugin API and the registry of installed plugins.

A plugin is a class published under the entry-point group `ferrymq.connectors` (its entry-point
name is the short name users may give as `connector.class`, e.g. `PostgresSink`). It declares
its config keys, validates a config (Kafka's ConfigInfos shape, for
`PUT /connector-plugins/{p}/config/validate`), splits the work into task configs for
`tasks.max`, and builds one Spark Structured Streaming query per task (`build`, run by the task
runtime; the worker owns checkpoints, trigger, query name and the task's generation: a plugin
ends `build` with `start_query`, which names the query and sets its trigger as `TaskContext`
says).

Keys every connector has (Kafka Connect's): `name`, `connector.class`, `tasks.max`.
"""

from __future__ import annotations

import enum
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, ClassVar, Literal

from ferrymq.connect.records import OffsetEntry
from ferrymq.errors import FerryError

__all__ = [
    "COMMON_KEYS",
    "ConfigKey",
    "ConfigType",
    "ConnectorPlugin",
    "OffsetsScope",
    "PluginError",
    "Plugins",
    "TaskContext",
    "config_infos",
    "query_name",
    "task_checkpoint_dir",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ferrymq.connectors"


class PluginError(FerryError):
    """No installed plugin answers to a `connector.class`."""


class ConfigType(enum.StrEnum):
    """Kafka's ConfigDef types (what `ConfigKeyInfo.type` shows)."""

    STRING = "STRING"
    INT = "INT"
    LONG = "LONG"
    DOUBLE = "DOUBLE"
    BOOLEAN = "BOOLEAN"
    LIST = "LIST"
    PASSWORD = "PASSWORD"
    CLASS = "CLASS"


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One config key a plugin takes (Kafka's ConfigKeyInfo)."""

    name: str
    type: ConfigType
    documentation: str
    required: bool = False
    default: str | None = None
    importance: Literal["HIGH", "MEDIUM", "LOW"] = "MEDIUM"
    group: str = "Common"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    display_name: str = ""

    def info(self, order: int) -> dict[str, Any]:
        """Kafka's ConfigKeyInfo JSON (Kafka serializes the order in the group as `order`)."""
        return {
            "name": self.name,
            "type": self.type.value,
            "required": self.required,
            "default_value": self.default,
            "importance": self.importance,
            "documentation": self.documentation,
            "group": self.group,
            "order": order,
            "width": "MEDIUM",
            "display_name": self.display_name or self.name,
            "dependents": [],
        }

    def errors(self, value: str | None) -> list[str]:
        """What is wrong with `value` (None: not given)."""
        if value is None or value == "":
            if self.required and self.default is None:
                return [f'Missing required configuration "{self.name}" which has no default value.']
            return []
        problem = _type_error(self.type, value)
        if problem:
            return [f"Invalid value {value} for configuration {self.name}: {problem}"]
        if self.choices and value not in self.choices:
            return [
                f"Invalid value {value} for configuration {self.name}: "
                f"String must be one of: {', '.join(self.choices)}"
            ]
        if self.minimum is not None and float(value) < self.minimum:
            return [
                f"Invalid value {value} for configuration {self.name}: "
                f"Value must be at least {self.minimum:g}"
            ]
        if self.maximum is not None and float(value) > self.maximum:
            return [
                f"Invalid value {value} for configuration {self.name}: "
                f"Value must be no more than {self.maximum:g}"
            ]
        return []


_INT_BITS = {ConfigType.INT: 31, ConfigType.LONG: 63}
"""Kafka's INT is a Java int, LONG a Java long."""


def _type_error(kind: ConfigType, value: str) -> str:
    try:
        if kind in _INT_BITS:
            number = int(value)
            bits = _INT_BITS[kind]
            if not -(2**bits) <= number < 2**bits:
                return f"Not a number of type {kind.value} (out of range)"
        elif kind is ConfigType.DOUBLE:
            float(value)
        elif kind is ConfigType.BOOLEAN and value.lower() not in ("true", "false"):
            return "Expected value to be either true or false"
    except ValueError:
        return f"Not a number of type {kind.value}"
    return ""


MAX_TASKS = 1024
"""A connector's task limit: each task is a Spark query, and its configs are one log record."""

COMMON_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("name", ConfigType.STRING, "Globally unique name of this connector.", True),
    ConfigKey(
        "connector.class",
        ConfigType.STRING,
        "The plugin: its class path or short name (e.g. PostgresSink).",
        True,
    ),
    ConfigKey(
        "tasks.max",
        ConfigType.INT,
        "Maximum number of tasks (Spark queries), at most 1024.",
        default="1",
        minimum=1,
        maximum=MAX_TASKS,
    ),
)


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What the runtime gives a task's query (issue: connectors on Spark)."""

    connector: str
    incarnation: str
    task: int
    generation: int
    """The task's fencing generation: a later owner's is higher."""
    cluster_id: str
    namesrv_addr: str
    checkpoint_dir: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    query_name: str | None = None
    """The query's name (the runtime's: `query_name`); None: that rule applied by the plugin."""
    trigger_interval_ms: int | None = None
    """The micro-batch interval (the runtime's: `ConnectorPlugin.trigger_interval` of the task's
    config); None: the same rule applied by the plugin (contexts built outside a worker)."""


def query_name(connector: str, task: int) -> str:
    """A task's query name: `<connector>-<task>`."""
    return f"{connector}-{task}"


def task_checkpoint_dir(
    state_dir: Path, cluster_id: str, connector: str, incarnation: str, task: int
) -> Path:
    """A task's checkpoint: `<storePathRootDir>/<cluster>/<connector>/<incarnation>/<task>`."""
    return state_dir / cluster_id / connector / incarnation / str(task)


@dataclass(frozen=True, slots=True)
class OffsetsScope:
    """Where a connector's offsets may be read (`ConnectorPlugin.connector_offsets`)."""

    connector: str
    incarnation: str
    namesrv_addr: str
    checkpoint_dirs: tuple[str, ...]
    """Each task's checkpoint directory, by task index."""


class ConnectorPlugin(ABC):
    """A connector: its config, its task split, and (per task) a Spark streaming query."""

    type: ClassVar[Literal["source", "sink"]]
    version: ClassVar[str] = "1.0"
    keys: ClassVar[tuple[ConfigKey, ...]] = ()
    """Plugin-specific keys (COMMON_KEYS are added)."""
    trigger_interval_ms: ClassVar[int] = 1000
    """`trigger.interval.ms`'s default for this plugin's queries."""

    @classmethod
    def config_keys(cls) -> tuple[ConfigKey, ...]:
        """Every key the plugin takes."""
        return COMMON_KEYS + cls.keys

    def validate(self, config: Mapping[str, str]) -> dict[str, list[str]]:
        """Errors beyond each key's own checks, by key (cross-key rules); none by default."""
        return {}

    @abstractmethod
    def task_configs(self, config: Mapping[str, str], max_tasks: int) -> list[dict[str, str]]:
        """At most `max_tasks` task configs (each a full config the task's query is built from)."""

    def build(self, spark: Any, config: Mapping[str, str], context: TaskContext) -> Any:
        """The task's streaming query, started (a `pyspark.sql.streaming.StreamingQuery`)."""
        raise PluginError(f"{type(self).__name__} has no data path in this version")

    def trigger_interval(self, config: Mapping[str, str]) -> int:
        """A task's micro-batch interval in ms: `trigger.interval.ms`, else the plugin's default."""
        return int(config.get("trigger.interval.ms") or self.trigger_interval_ms)

    def start_query(self, writer: Any, config: Mapping[str, str], context: TaskContext) -> Any:
        """Start a task's `DataStreamWriter` with the query name and trigger `context` carries."""
        name = context.query_name or query_name(context.connector, context.task)
        interval = context.trigger_interval_ms
        if interval is None:
            interval = self.trigger_interval(config)
        return writer.queryName(name).trigger(processingTime=f"{interval} milliseconds").start()

    def check_offsets(self, config: Mapping[str, str], entries: Sequence[OffsetEntry]) -> list[str]:
        """What is wrong with a PATCH /offsets body's entries (none: it may be written)."""
        return []

    def connector_offsets(
        self, config: Mapping[str, str], scope: OffsetsScope
    ) -> list[dict[str, Any]] | None:
        """GET /offsets: KIP-875 entries from where the plugin keeps its truth (blocking I/O).

        None: the plugin keeps none the worker can read (the tasks' reported offsets are shown).

        Raises:
            Exception: the store cannot be read now (the REST API answers 503 with it).
        """
        return None


def config_infos(
    plugin_class: str, plugin: ConnectorPlugin, config: Mapping[str, str]
) -> dict[str, Any]:
    """Kafka's ConfigInfos for a config: every key's definition, value and errors."""
    keys = plugin.config_keys()
    extra = plugin.validate(config)
    configs: list[dict[str, Any]] = []
    groups: list[str] = []
    orders: dict[str, int] = {}
    error_count = 0
    for key in keys:
        if key.group not in groups:
            groups.append(key.group)
        orders[key.group] = orders.get(key.group, 0) + 1
        errors = key.errors(config.get(key.name)) + extra.get(key.name, [])
        error_count += len(errors)
        configs.append(
            {
                "definition": key.info(orders[key.group]),
                "value": {
                    "name": key.name,
                    "value": None
                    if key.type is ConfigType.PASSWORD
                    else config.get(key.name, key.default),
                    "recommended_values": list(key.choices),
                    "errors": errors,
                    "visible": True,
                },
            }
        )
    known = {k.name for k in keys}
    for name, errors in extra.items():
        if name not in known:
            error_count += len(errors)
            configs.append(
                {
                    "definition": ConfigKey(name, ConfigType.STRING, "").info(0),
                    "value": {
                        "name": name,
                        "value": config.get(name),
                        "recommended_values": [],
                        "errors": errors,
                        "visible": True,
                    },
                }
            )
    return {"name": plugin_class, "error_count": error_count, "groups": groups, "configs": configs}


class Plugins:
    """The installed plugins, by entry-point name and by class path."""

    def __init__(self, classes: Mapping[str, type[ConnectorPlugin]] | None = None) -> None:
        self._by_name: dict[str, type[ConnectorPlugin]] = {}
        if classes is None:
            classes = _installed()
        for name, cls in classes.items():
            self._by_name[name] = cls

    def resolve(self, connector_class: str) -> tuple[str, type[ConnectorPlugin]]:
        """The plugin's class path and class for a `connector.class` value.

        Raises:
            PluginError: nothing installed answers to it.
        """
        for name, cls in self._by_name.items():
            path = f"{cls.__module__}.{cls.__qualname__}"
            if connector_class in (name, path, cls.__qualname__):
                return path, cls
        known = ", ".join(sorted(self._by_name)) or "none"
        raise PluginError(
            f"Failed to find any class that implements Connector and which name matches "
            f"{connector_class}; installed plugins: {known}"
        )

    def listing(self) -> list[dict[str, str]]:
        """`GET /connector-plugins`: [{class, type, version}], sorted by class."""
        return sorted(
            (
                {"class": f"{c.__module__}.{c.__qualname__}", "type": c.type, "version": c.version}
                for c in self._by_name.values()
            ),
            key=lambda p: p["class"],
        )


def _installed() -> dict[str, type[ConnectorPlugin]]:
    found: dict[str, type[ConnectorPlugin]] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded = point.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the worker
            log.error("connector plugin %s (%s) cannot be loaded: %r", point.name, point.value, exc)
            continue
        if isinstance(loaded, type) and issubclass(loaded, ConnectorPlugin):
            found[point.name] = loaded
        else:
            log.error("entry point %s (%s) is not a ConnectorPlugin", point.name, point.value)
    return found
