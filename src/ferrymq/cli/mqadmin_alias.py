"""mqadmin's command names and flags as aliases of `ferry admin` commands.

`ferry admin updateTopic -n 127.0.0.1:9876 -t T -c DefaultCluster -w 8` runs exactly
`ferry admin --namesrv 127.0.0.1:9876 topic create T --cluster DefaultCluster --queues 8`:
each alias parses mqadmin's short and long flags (`-t`/`--topic`, RocketMQ's `MQAdminStartup`
spelling), converts them (mqadmin's `true`/`false` values, a broker address where ferry takes a
broker name, `yyyy-MM-dd#HH:mm:ss:SSS` timestamps) and invokes the ferry command, so output,
`--json` and errors are the same. `-n/--namesrvAddr` sets the NameServer list.

`ALIASES` is the one table; `ferry admin aliases` prints it. A flag mqadmin has but ferry does
not honour is not accepted (an unknown option: exit 2), never silently dropped.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click

from ferrymq.cli.output import emit_json, emit_table
from ferrymq.client.admin import AdminClient
from ferrymq.errors import FerryError

__all__ = ["ALIASES", "Alias", "Flag", "add_aliases"]

Convert = Callable[[Any, str], Any]
"""(value, NameServer list) -> the ferry command's value."""


def _broker_name_of(address: str, namesrv: str) -> str:
    """The broker group a broker address (mqadmin's `-b`) belongs to."""

    async def find() -> str:
        async with AdminClient(namesrv) as admin:
            info = await admin.cluster_info()
        for name, data in info.broker_addr_table.items():
            if address in data.broker_addrs.values():
                return name
        raise FerryError(f"no broker at {address} in the cluster")

    return asyncio.run(find())


def _timestamp_ms(value: str, namesrv: str) -> int:
    """Mqadmin's time argument: `now`, epoch ms, or `yyyy-MM-dd#HH:mm:ss:SSS` (local time)."""
    if value == "now":
        return int(datetime.datetime.now().timestamp() * 1000)
    if value.isdigit():
        return int(value)
    try:
        parsed = datetime.datetime.strptime(value, "%Y-%m-%d#%H:%M:%S:%f")
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not 'now', epoch ms or yyyy-MM-dd#HH:mm:ss:SSS"
        ) from None
    return int(parsed.timestamp() * 1000)


@dataclass(frozen=True)
class Flag:
    """One mqadmin option and the ferry parameter it fills."""

    short: str
    long: str
    target: str
    required: bool = False
    boolean: bool = False
    """mqadmin takes `true`/`false` as the option's value."""
    convert: Convert | None = None
    type: click.ParamType[Any] | None = None
    """When not the target parameter's own type."""


@dataclass(frozen=True)
class Alias:
    """An mqadmin command name, the ferry command it runs, and how its flags map."""

    name: str
    path: tuple[str, ...]
    flags: tuple[Flag, ...] = ()
    fixed: dict[str, Any] = field(default_factory=dict)
    """Values given to the ferry command whatever the flags (mqadmin's output form)."""
    combine: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """Turns the converted values into the ferry command's (several flags into one)."""


_TOPIC = Flag("-t", "--topic", "topic", required=True)
_TOPIC_NAME = Flag("-t", "--topic", "name", required=True)
_GROUP = Flag("-g", "--groupName", "group", required=True)
_CLUSTER = Flag("-c", "--clusterName", "cluster")
_BROKER_ADDR_AS_NAME = Flag("-b", "--brokerAddr", "broker_name", convert=_broker_name_of)
_BROKER_ADDR = Flag("-b", "--brokerAddr", "broker_addr")


_AUTH_TARGET = (Flag("-c", "--clusterName", "cluster"), Flag("-b", "--brokerAddr", "broker"))
_USERNAME = Flag("-u", "--username", "username", required=True)
_PASSWORD = Flag("-p", "--password", "password", required=True)
_USER_TYPE = Flag("-t", "--userType", "user_type")
_SUBJECT = Flag("-s", "--subject", "subject", required=True)
_ACL_FLAGS = (
    _SUBJECT,
    Flag("-r", "--resources", "resources", required=True),
    Flag("-a", "--actions", "actions", required=True),
    Flag("-i", "--sourceIp", "source_ip"),
    Flag("-d", "--decision", "decision"),
)


def _key_value(values: dict[str, Any]) -> dict[str, Any]:
    key, value = values.pop("key"), values.pop("value")
    return {**values, "pairs": (f"{key}={value}",)}


ALIASES: tuple[Alias, ...] = (
    Alias(
        "updateTopic",
        ("topic", "create"),
        (
            _TOPIC_NAME,
            _CLUSTER,
            _BROKER_ADDR_AS_NAME,
            Flag("-w", "--writeQueueNums", "queues"),
            Flag("-o", "--order", "order", boolean=True),
        ),
    ),
    Alias("deleteTopic", ("topic", "delete"), (_TOPIC_NAME, _CLUSTER)),
    Alias("topicRoute", ("topic", "route"), (_TOPIC_NAME,), {"as_json": True}),
    Alias("topicStatus", ("topic", "status"), (_TOPIC_NAME,)),
    Alias("topicList", ("topic", "list")),
    Alias("clusterList", ("cluster", "list")),
    Alias(
        "updateTopicPerm",
        ("topic", "perm"),
        (_TOPIC, Flag("-p", "--perm", "perm", required=True), _BROKER_ADDR_AS_NAME),
    ),
    Alias(
        "updateSubGroup",
        ("group", "update"),
        (
            _GROUP,
            _CLUSTER,
            _BROKER_ADDR_AS_NAME,
            Flag("-s", "--consumeEnable", "consume_enable", boolean=True),
            Flag("-m", "--consumeFromMinEnable", "consume_from_min", boolean=True),
            Flag("-d", "--consumeBroadcastEnable", "broadcast", boolean=True),
            Flag("-q", "--retryQueueNums", "retry_queues"),
            Flag("-r", "--retryMaxTimes", "retry_max_times"),
            Flag("-i", "--brokerId", "broker_id"),
            Flag("-w", "--whichBrokerWhenConsumeSlowly", "which_broker_when_slow"),
            Flag("-a", "--notifyConsumerIdsChanged", "notify_ids_changed", boolean=True),
            Flag("-o", "--consumeMessageOrderly", "fifo", boolean=True),
        ),
    ),
    Alias(
        "deleteSubGroup",
        ("group", "delete"),
        (
            _GROUP,
            _CLUSTER,
            _BROKER_ADDR_AS_NAME,
            Flag("-r", "--removeOffset", "clean_offset", boolean=True),
        ),
    ),
    Alias(
        "cloneGroupOffset",
        ("group", "clone-offset"),
        (
            Flag("-s", "--srcGroup", "source", required=True),
            Flag("-d", "--destGroup", "destination", required=True),
            _TOPIC,
        ),
    ),
    Alias("consumerProgress", ("consumer", "progress"), (_GROUP, Flag("-t", "--topic", "topic"))),
    Alias("consumerConnection", ("consumer", "connection"), (_GROUP,)),
    Alias(
        "consumerStatus",
        ("consumer", "status"),
        (_GROUP, Flag("-i", "--clientId", "client_id")),
    ),
    Alias("producerConnection", ("producer", "connection"), (_GROUP, _TOPIC)),
    Alias(
        "resetOffsetByTime",
        ("offset", "reset-by-time"),
        (
            _GROUP,
            _TOPIC,
            Flag("-s", "--timestamp", "timestamp", True, convert=_timestamp_ms, type=click.STRING),
            Flag("-f", "--force", "force", boolean=True),
        ),
    ),
    Alias("brokerStatus", ("broker", "status"), (_BROKER_ADDR, _CLUSTER)),
    Alias("statsAll", ("stats-all",), (Flag("-t", "--topic", "topic"),)),
    Alias("haStatus", ("broker", "ha-status"), (_BROKER_ADDR, _CLUSTER)),
    Alias("getBrokerConfig", ("broker", "config", "get"), (_BROKER_ADDR, _CLUSTER)),
    Alias(
        "updateBrokerConfig",
        ("broker", "config", "update"),
        (
            _BROKER_ADDR,
            _CLUSTER,
            Flag("-k", "--key", "key", True, type=click.STRING),
            Flag("-v", "--value", "value", True, type=click.STRING),
        ),
        combine=_key_value,
    ),
    Alias(
        "wipeWritePerm",
        ("broker", "wipe-write-perm"),
        (Flag("-b", "--brokerName", "broker_name", True),),
    ),
    Alias(
        "addWritePerm",
        ("broker", "add-write-perm"),
        (Flag("-b", "--brokerName", "broker_name", True),),
    ),
    Alias(
        "queryMsgByOffset",
        ("message", "by-offset"),
        (
            _TOPIC,
            Flag("-b", "--brokerName", "broker_name", True),
            Flag("-i", "--queueId", "queue_id", True),
            Flag("-o", "--offset", "offset", True),
        ),
    ),
    Alias(
        "printMsg",
        ("message", "print"),
        (
            _TOPIC,
            Flag("-b", "--beginTimestamp", "begin_ms", convert=_timestamp_ms, type=click.STRING),
            Flag("-e", "--endTimestamp", "end_ms", convert=_timestamp_ms, type=click.STRING),
        ),
    ),
    Alias("queryMsgByKey", ("message", "by-key"), (_TOPIC, Flag("-k", "--msgKey", "key", True))),
    Alias(
        "queryMsgById",
        ("message", "by-id"),
        (
            Flag("-i", "--msgId", "offset_msg_id", True),
            Flag("-g", "--consumerGroup", "group"),  # with -d: CONSUME_MESSAGE_DIRECTLY
            Flag("-d", "--clientId", "client_id"),
        ),
    ),
    Alias("getNamesrvConfig", ("namesrv", "config", "get")),
    Alias(
        "updateNamesrvConfig",
        ("namesrv", "config", "update"),
        (
            Flag("-k", "--key", "key", True, type=click.STRING),
            Flag("-v", "--value", "value", True, type=click.STRING),
        ),
        combine=_key_value,
    ),
    Alias(
        "updateKvConfig",
        ("namesrv", "kv", "put"),
        (
            Flag("-s", "--namespace", "namespace", True),
            Flag("-k", "--key", "key", True),
            Flag("-v", "--value", "value", True),
        ),
    ),
    Alias(
        "deleteKvConfig",
        ("namesrv", "kv", "delete"),
        (Flag("-s", "--namespace", "namespace", True), Flag("-k", "--key", "key", True)),
    ),
    # ACL 2.0 (RocketMQ 5.3's user and acl subcommands)
    Alias("createUser", ("user", "create"), (*_AUTH_TARGET, _USERNAME, _PASSWORD, _USER_TYPE)),
    Alias(
        "updateUser",
        ("user", "update"),
        (
            *_AUTH_TARGET,
            _USERNAME,
            Flag("-p", "--password", "password"),
            _USER_TYPE,
            Flag("-s", "--userStatus", "user_status"),
        ),
    ),
    Alias("deleteUser", ("user", "delete"), (*_AUTH_TARGET, _USERNAME)),
    Alias("getUser", ("user", "get"), (*_AUTH_TARGET, _USERNAME)),
    Alias("listUser", ("user", "list"), (*_AUTH_TARGET, Flag("-f", "--filter", "text"))),
    Alias("createAcl", ("acl", "create"), (*_AUTH_TARGET, *_ACL_FLAGS)),
    Alias("updateAcl", ("acl", "update"), (*_AUTH_TARGET, *_ACL_FLAGS)),
    Alias(
        "deleteAcl",
        ("acl", "delete"),
        (*_AUTH_TARGET, _SUBJECT, Flag("-r", "--resources", "resources")),
    ),
    Alias("getAcl", ("acl", "get"), (*_AUTH_TARGET, _SUBJECT)),
    Alias(
        "listAcl",
        ("acl", "list"),
        (
            *_AUTH_TARGET,
            Flag("-s", "--subject", "subject_filter"),
            Flag("-r", "--resources", "resource_filter"),
        ),
    ),
)
"""Every mqadmin command name ferry answers, in one table."""


def _resolve(root: click.Group, path: tuple[str, ...]) -> click.Command:
    command: click.Command = root
    for name in path:
        assert isinstance(command, click.Group), path
        command = command.commands[name]
    return command


def _callback(params: dict[str, click.Parameter], name: str) -> Any:
    found = params.get(name)
    return found.callback if found is not None else None


def _alias_command(alias: Alias, target: click.Command) -> click.Command:
    params: dict[str, click.Parameter] = {p.name: p for p in target.params if p.name}
    options: list[click.Parameter] = [
        click.Option(
            ["-n", "--namesrvAddr", "namesrv"], help="NameServer address(es), `;`-separated."
        )
    ]
    for flag in alias.flags:
        if flag.boolean:
            kind: click.ParamType[Any] = click.BOOL
        elif flag.type is not None:
            kind = flag.type
        elif flag.target in params:
            kind = params[flag.target].type
        else:
            kind = click.STRING
        options.append(
            click.Option(
                [flag.short, flag.long, flag.target],
                type=kind,
                required=flag.required,
                # the ferry option's own check (ctx.invoke below runs no callbacks)
                callback=None if flag.convert or flag.boolean else _callback(params, flag.target),
                help=f"ferry: {flag.target.replace('_', '-')}",
            )
        )

    json_flag = "as_json" in params and "as_json" not in alias.fixed
    if json_flag:
        options.append(click.Option(["--json", "as_json"], is_flag=True, help="Print JSON."))

    def run(namesrv: str | None, **values: Any) -> None:
        ctx = click.get_current_context()
        if namesrv:
            ctx.obj["namesrv"] = namesrv
        where = str(ctx.obj["namesrv"])
        converted = {
            flag.target: (
                flag.convert(values[flag.target], where) if flag.convert else values[flag.target]
            )
            for flag in alias.flags
            if values.get(flag.target) is not None
        }
        if alias.combine is not None:
            converted = alias.combine(converted)
        if json_flag:
            converted["as_json"] = values["as_json"]
        ctx.invoke(target, **{**alias.fixed, **converted})

    return click.Command(
        alias.name,
        params=options,
        callback=run,
        hidden=True,
        help=f"mqadmin {alias.name}: runs `ferry admin {' '.join(alias.path)}`.",
    )


def add_aliases(admin: click.Group) -> None:
    """Register every alias on `ferry admin` (hidden from its help; `aliases` lists them)."""
    for alias in ALIASES:
        admin.add_command(_alias_command(alias, _resolve(admin, alias.path)))

    @admin.command("aliases")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    def aliases(as_json: bool) -> None:
        """Mqadmin command names ferry answers, and the ferry command each runs."""
        rows = [
            (
                a.name,
                " ".join(a.path),
                " ".join(f"{f.short} {f.long}" for f in a.flags) or "-",
            )
            for a in ALIASES
        ]
        if as_json:
            emit_json([{"mqadmin": n, "ferry": p, "flags": f} for n, p, f in rows])
            return
        emit_table(
            "mqadmin aliases (all take -n/--namesrvAddr)", ["mqadmin", "ferry admin", "flags"], rows
        )
