r"""The leader's decisions (pure): a REST write and the replayed state in, one record out.

Decide-then-apply: each function checks a request against the state as the log says it is and
returns the one config record that carries the change (or raises the REST error), mutating
nothing; the record changes any worker's state only when it is read back from the log. One
record per write, so a write is atomic: a creation carries the config, the task configs and the
target state; a stop carries the target state (and drops the task configs); a resume from
STOPPED carries fresh task configs.

Rules from Kafka Connect's REST resources (ConnectorsResource) and KIPs 745, 875 and 980:
- names: not empty, at most 249 characters, no control characters, no `/` or `\\`, not `.` or
  `..` (a name becomes part of a checkpoint path);
- a config's `name`, when given, must equal the URL's; `connector.class` must name an installed
  plugin, and the plugin's validation must find no error (400 listing them);
- offsets may be altered or reset only while the connector is STOPPED.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping

from ferrymq.connect.errors import BadRequestError, ConflictError, NotFoundError
from ferrymq.connect.plugin import ConnectorPlugin, PluginError, Plugins, config_infos
from ferrymq.connect.records import (
    ConnectorDelete,
    ConnectorPut,
    OffsetEntry,
    OffsetsPut,
    Record,
    RestartRequest,
    TargetPut,
    TargetState,
    encode_record,
)
from ferrymq.connect.state import ConfigState, Connector

__all__ = [
    "NAME_MAX_LENGTH",
    "alter_offsets",
    "check_name",
    "create",
    "delete",
    "new_id",
    "patch_config",
    "put_config",
    "reset_offsets",
    "restart",
    "restart_task",
    "set_target",
    "task_configs",
    "validate_config",
]

NAME_MAX_LENGTH = 249
MAX_RECORD_BYTES = 1 << 20
"""The largest config record a write may make (the broker takes 4 MiB; a connector's config and
task configs that need more are refused as a bad request, not retried)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def new_id() -> str:
    """A fresh incarnation or request id."""
    return uuid.uuid4().hex


def check_name(name: str) -> str:
    """`name` if it can name a connector.

    Raises:
        BadRequestError: it cannot.
    """
    if not name or not name.strip():
        raise BadRequestError("Connector name is empty")
    if len(name) > NAME_MAX_LENGTH:
        raise BadRequestError(f"Connector name is longer than {NAME_MAX_LENGTH} characters")
    if _CONTROL.search(name):
        raise BadRequestError("Connector name contains ISO control characters")
    if "/" in name or "\\" in name or name in (".", "..") or name != name.strip():
        raise BadRequestError(
            "Connector name may not contain / or \\, be . or .., or start or end with a space"
        )
    return name


def _existing(state: ConfigState, name: str) -> Connector:
    connector = state.connectors.get(name)
    if connector is None:
        raise NotFoundError(f"Connector {name} not found")
    return connector


def validate_config(plugins: Plugins, config: Mapping[str, str]) -> ConnectorPlugin:
    """The plugin of a config whose every value is valid.

    Raises:
        BadRequestError: no plugin, or the plugin finds errors (Kafka's message lists them).
    """
    connector_class = config.get("connector.class", "")
    if not connector_class:
        raise BadRequestError("Connector config has no connector.class")
    try:
        path, cls = plugins.resolve(connector_class)
    except PluginError as exc:
        raise BadRequestError(str(exc)) from None
    plugin = cls()
    infos = config_infos(path, plugin, config)
    if infos["error_count"]:
        problems = [
            f"{entry['value']['name']}: {error}"
            for entry in infos["configs"]
            for error in entry["value"]["errors"]
        ]
        raise BadRequestError(
            f"Connector configuration is invalid and contains the following "
            f"{infos['error_count']} error(s):\n"
            + "\n".join(problems)
            + "\nYou can also find the above list of errors at the endpoint "
            "`/connector-plugins/{connectorType}/config/validate`"
        )
    return plugin


def task_configs(plugin: ConnectorPlugin, config: Mapping[str, str]) -> list[dict[str, str]]:
    """The plugin's task configs for `tasks.max`.

    Raises:
        BadRequestError: the plugin returned none or more than `tasks.max`, or failed.
    """
    max_tasks = int(config.get("tasks.max") or "1")  # empty: not given (ConfigKey.errors)
    try:
        tasks = plugin.task_configs(config, max_tasks)
    except (ValueError, PluginError) as exc:
        raise BadRequestError(f"the connector cannot split its work: {exc}") from None
    if not 0 < len(tasks) <= max_tasks:
        raise BadRequestError(
            f"the connector made {len(tasks)} task configs for tasks.max {max_tasks}"
        )
    return [dict(t) for t in tasks]


def check_size(record: Record) -> Record:
    """`record` when it fits in one config-log record.

    Raises:
        BadRequestError: its encoding is over `MAX_RECORD_BYTES`.
    """
    size = len(encode_record(record))
    if size > MAX_RECORD_BYTES:
        raise BadRequestError(
            f"the connector's config and task configs take {size} bytes, over the limit of "
            f"{MAX_RECORD_BYTES}: use fewer tasks or a smaller config"
        )
    return record


def _with_name(name: str, config: Mapping[str, str]) -> dict[str, str]:
    given = config.get("name")
    if given is not None and given != name:
        raise BadRequestError("Connector name configuration (name) must match connector name")
    return {**config, "name": name}


def create(
    state: ConfigState,
    plugins: Plugins,
    name: str,
    config: Mapping[str, str],
    initial: TargetState = TargetState.RUNNING,
    *,
    make_id: Callable[[], str] = new_id,
) -> ConnectorPut:
    """POST /connectors.

    Raises:
        BadRequestError, ConflictError: as Kafka Connect answers (400, 409).
    """
    check_name(name)
    full = _with_name(name, config)
    if name in state.connectors:
        raise ConflictError(f"Connector {name} already exists")
    plugin = validate_config(plugins, full)
    tasks = [] if initial is TargetState.STOPPED else task_configs(plugin, full)
    created = ConnectorPut(
        name=name, incarnation=make_id(), config=full, tasks=tasks, target=initial
    )
    check_size(created)
    return created


def put_config(
    state: ConfigState,
    plugins: Plugins,
    name: str,
    config: Mapping[str, str],
    *,
    make_id: Callable[[], str] = new_id,
) -> ConnectorPut:
    """PUT /connectors/{c}/config: a creation (RUNNING) when it does not exist, else an update."""
    check_name(name)
    if name not in state.connectors:
        return create(state, plugins, name, config, make_id=make_id)
    current = state.connectors[name]
    full = _with_name(name, config)
    plugin = validate_config(plugins, full)
    tasks = [] if current.target is TargetState.STOPPED else task_configs(plugin, full)
    updated = ConnectorPut(name=name, incarnation=current.incarnation, config=full, tasks=tasks)
    check_size(updated)
    return updated


def patch_config(
    state: ConfigState, plugins: Plugins, name: str, patch: Mapping[str, str | None]
) -> ConnectorPut:
    """PATCH /connectors/{c}/config: merged; a null value removes the key."""
    current = _existing(state, name)
    merged = dict(current.config)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return put_config(state, plugins, name, merged)


def set_target(
    state: ConfigState, plugins: Plugins, name: str, target: TargetState
) -> TargetPut | None:
    """PUT pause / resume / stop; None when the connector is in that state already."""
    current = _existing(state, name)
    if current.target is target:
        return None
    tasks: list[dict[str, str]] | None = None
    if current.target is TargetState.STOPPED:  # leaving STOPPED: split the work again
        tasks = task_configs(validate_config(plugins, current.config), current.config)
    put = TargetPut(name=name, incarnation=current.incarnation, state=target, tasks=tasks)
    check_size(put)
    return put


def restart(
    state: ConfigState,
    plugins: Plugins,
    name: str,
    *,
    include_tasks: bool,
    only_failed: bool,
    failed_tasks: set[int],
    connector_failed: bool,
    make_id: Callable[[], str] = new_id,
) -> RestartRequest | None:
    """POST /connectors/{c}/restart (KIP-745); None when nothing is selected."""
    current = _existing(state, name)
    restart_connector = connector_failed or not only_failed
    tasks = (
        [i for i in range(len(current.tasks)) if i in failed_tasks or not only_failed]
        if include_tasks
        else []
    )
    if not restart_connector and not tasks:
        return None
    configs: list[dict[str, str]] | None = None
    if restart_connector and current.target is not TargetState.STOPPED:
        configs = task_configs(validate_config(plugins, current.config), current.config)
    request = RestartRequest(
        name=name,
        incarnation=current.incarnation,
        request_id=make_id(),
        connector=restart_connector,
        tasks=tasks,
        task_configs=configs,
    )
    check_size(request)
    return request


def restart_task(
    state: ConfigState, name: str, task: int, *, make_id: Callable[[], str] = new_id
) -> RestartRequest:
    """POST /connectors/{c}/tasks/{t}/restart."""
    current = _existing(state, name)
    if not 0 <= task < len(current.tasks):
        raise NotFoundError(f"Task {name}-{task} not found")
    return RestartRequest(
        name=name,
        incarnation=current.incarnation,
        request_id=make_id(),
        connector=False,
        tasks=[task],
    )


def delete(state: ConfigState, name: str) -> ConnectorDelete:
    """DELETE /connectors/{c}."""
    current = _existing(state, name)
    return ConnectorDelete(name=name, incarnation=current.incarnation)


def _stopped(state: ConfigState, name: str) -> Connector:
    current = _existing(state, name)
    if current.target is not TargetState.STOPPED:
        raise BadRequestError(  # Kafka's words (DistributedHerder.modifyConnectorOffsets)
            "Connectors must be in the STOPPED state before their offsets can be modified. "
            "This can be done for the specified connector by issuing a 'PUT' request to the "
            "'/connectors/" + name + "/stop' endpoint"
        )
    return current


def alter_offsets(
    state: ConfigState,
    plugins: Plugins,
    name: str,
    offsets: list[OffsetEntry],
    *,
    make_id: Callable[[], str] = new_id,
) -> OffsetsPut:
    """PATCH /connectors/{c}/offsets (KIP-875): only when STOPPED, never empty.

    Only entries the connector's plugin can apply (`check_offsets`; 400 with its reasons, or
    naming the plugin and its error when it raised instead of answering).
    """
    current = _stopped(state, name)
    if not offsets:
        raise BadRequestError("The offsets to alter may not be empty")
    try:
        path, cls = plugins.resolve(current.config.get("connector.class", ""))
    except PluginError as exc:
        raise BadRequestError(str(exc)) from None
    try:
        problems = cls().check_offsets(current.config, offsets)
    except Exception as exc:  # noqa: BLE001 - a plugin's bug refuses this body, not the worker
        raise BadRequestError(
            f"Invalid offsets for {name}: the plugin {path} failed to check them: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]
        ) from None
    if problems:
        raise BadRequestError("Invalid offsets for " + name + ": " + "; ".join(problems))
    return OffsetsPut(
        name=name, incarnation=current.incarnation, request_id=make_id(), offsets=offsets
    )


def reset_offsets(
    state: ConfigState, name: str, *, make_id: Callable[[], str] = new_id
) -> OffsetsPut:
    """DELETE /connectors/{c}/offsets (KIP-875): only when STOPPED."""
    current = _stopped(state, name)
    return OffsetsPut(
        name=name, incarnation=current.incarnation, request_id=make_id(), offsets=None
    )
