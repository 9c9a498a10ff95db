"""`ferry admin`: mqadmin's everyday commands beyond topics and progress (issue 22).

- `group update|delete|clone-offset` (updateSubGroup, deleteSubGroup, cloneGroupOffset);
- `consumer connection GROUP` (consumerConnection), `consumer status GROUP [--client-id]`
  (consumerStatus: each client's running state, asked through a broker),
  `producer connection GROUP --topic T` (producerConnection);
- `broker status|ha-status|config get|config update` (brokerStatus, haStatus, getBrokerConfig,
  updateBrokerConfig), for one broker (`--broker-addr`) or every broker of a cluster;
- `offset reset-by-time --group G --topic T --timestamp MS` (resetOffsetByTime: online, the
  group's running clients start at the new offsets; offline when none runs);
- `stats-all [--topic T]` (statsAll: TPS and 24-hour counts in and out, lag per group);
- `topic perm TOPIC --perm 2|4|6` (updateTopicPerm);
- `message by-offset` (queryMsgByOffset), `message print TOPIC --begin-ms --end-ms` (printMsg:
  reads a time range from every queue and commits nothing);
- `namesrv config get|update`, `namesrv kv put|get|delete` (getNamesrvConfig,
  updateNamesrvConfig, updateKvConfig, deleteKvConfig).

Every read prints a table, or one JSON document with `--json`. Errors are one line (`ferry`'s
main); bad arguments exit 2. The commands are attached to `ferry admin`'s groups in `cli/admin.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from ferrymq.cli.output import emit_json, emit_table
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.message import Message
from ferrymq.client.mqadmin import GROUP_SETTINGS, MQAdmin
from ferrymq.errors import FerryError
from ferrymq.model import MessageQueue

__all__ = [
    "broker_config_group",
    "broker_ha_status",
    "broker_status",
    "consumer_connection",
    "consumer_status",
    "group_group",
    "message_by_offset",
    "message_print",
    "namesrv_group",
    "offset_reset_by_time",
    "producer_group",
    "stats_all",
    "topic_perm",
]

T = TypeVar("T")

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
PRINT_MAX: int = 10_000
"""At most this many messages per `message print` (a bound on a whole topic's range)."""


def _namesrv(ctx: click.Context) -> str:
    return str(ctx.obj["namesrv"])


def _run(ctx: click.Context, work: Callable[[MQAdmin], Awaitable[T]]) -> T:
    async def main() -> T:
        async with MQAdmin(_namesrv(ctx)) as admin:
            return await work(admin)

    return asyncio.run(main())


def _key_values(pairs: tuple[str, ...]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="KEY=VALUE")
        values[key] = value
    return values


def _one_target(broker_addr: str | None, cluster: str | None) -> None:
    if (broker_addr is None) == (cluster is None):
        raise click.UsageError("give exactly one of --broker-addr and --cluster")


async def _brokers(admin: MQAdmin, broker_addr: str | None, cluster: str | None) -> list[str]:
    """The one broker named, or every broker (masters and slaves) of a cluster."""
    if broker_addr is not None:
        return [broker_addr]
    info = await admin.cluster_info()
    names = info.cluster_addr_table.get(str(cluster))
    if not names:
        raise FerryError(f"no cluster {cluster}")
    return [
        address
        for name in sorted(names)
        if (data := info.broker_addr_table.get(name)) is not None
        for _, address in sorted(data.broker_addrs.items())
    ]


# ---------------------------------------------------------------------------- groups


@click.group("group")
def group_group() -> None:
    """Create, change, delete subscription groups; copy their offsets."""


def _group_target(command: Callable[..., None]) -> Callable[..., None]:
    command = click.option("--broker-name", help="Only on this broker group.")(command)
    return click.option("--cluster", help="On every group of this cluster (default: all).")(command)


@group_group.command("update")
@click.argument("group")
@_group_target
@click.option("--consume-enable/--no-consume-enable", default=None)
@click.option("--consume-from-min/--no-consume-from-min", default=None)
@click.option("--broadcast/--no-broadcast", default=None, help="consumeBroadcastEnable.")
@click.option("--retry-queues", type=click.IntRange(1, 64), help="retryQueueNums.")
@click.option("--retry-max-times", type=click.IntRange(-1, 10_000), help="retryMaxTimes.")
@click.option("--broker-id", type=click.IntRange(0), help="brokerId to consume from.")
@click.option("--which-broker-when-slow", type=click.IntRange(0), help="When consuming slowly.")
@click.option("--notify-ids-changed/--no-notify-ids-changed", default=None)
@click.option(
    "--fifo/--no-fifo", default=None, help="consumeMessageOrderly: 5.x clients consume in order."
)
@json_option
@click.pass_context
def group_update(
    ctx: click.Context,
    group: str,
    cluster: str | None,
    broker_name: str | None,
    consume_enable: bool | None,
    consume_from_min: bool | None,
    broadcast: bool | None,
    retry_queues: int | None,
    retry_max_times: int | None,
    broker_id: int | None,
    which_broker_when_slow: int | None,
    notify_ids_changed: bool | None,
    fifo: bool | None,
    as_json: bool,
) -> None:
    """Create or change a subscription group (settings not given are kept)."""
    given = dict(
        zip(
            GROUP_SETTINGS,
            (
                consume_enable,
                consume_from_min,
                broadcast,
                retry_queues,
                retry_max_times,
                broker_id,
                which_broker_when_slow,
                notify_ids_changed,
                fifo,
            ),
            strict=True,
        )
    )
    settings = {k: v for k, v in given.items() if v is not None}
    masters = _run(
        ctx,
        lambda a: a.update_group(group, settings, cluster=cluster, broker_name=broker_name),
    )
    if as_json:
        emit_json({"groupName": group, "brokers": masters, "set": settings})
        return
    click.echo(f"group {group} set on {', '.join(masters)}")


@group_group.command("delete")
@click.argument("group")
@_group_target
@click.option("--clean-offset", is_flag=True, help="Also delete the group's offsets.")
@json_option
@click.pass_context
def group_delete(
    ctx: click.Context,
    group: str,
    cluster: str | None,
    broker_name: str | None,
    clean_offset: bool,
    as_json: bool,
) -> None:
    """Delete a subscription group."""
    masters = _run(
        ctx,
        lambda a: a.delete_group(
            group, cluster=cluster, broker_name=broker_name, clean_offset=clean_offset
        ),
    )
    if as_json:
        emit_json({"groupName": group, "brokers": masters, "cleanOffset": clean_offset})
        return
    click.echo(f"group {group} deleted on {', '.join(masters)}")


@group_group.command("clone-offset")
@click.option("--src", "source", required=True, help="The group whose offsets are copied.")
@click.option("--dest", "destination", required=True, help="The group that gets them.")
@click.option("--topic", required=True)
@json_option
@click.pass_context
def group_clone_offset(
    ctx: click.Context, source: str, destination: str, topic: str, as_json: bool
) -> None:
    """Give a group the offsets another committed in a topic."""
    written = _run(ctx, lambda a: a.clone_group_offsets(source, destination, topic))
    rows = sorted((b, q, o) for (b, q), o in written.items())
    if as_json:
        emit_json([{"brokerName": b, "queueId": q, "offset": o} for b, q, o in rows])
        return
    emit_table(f"{destination} on {topic} (from {source})", ["broker", "queue", "offset"], rows)


@click.command("reset-by-time")
@click.option("--group", required=True)
@click.option("--topic", required=True)
@click.option(
    "--timestamp", type=click.IntRange(-1), required=True, help="Epoch ms (-1: each queue's end)."
)
@click.option(
    "--force/--no-force",
    default=True,
    show_default=True,
    help="--no-force: a queue only moves back, never past its committed offset.",
)
@json_option
@click.pass_context
def offset_reset_by_time(
    ctx: click.Context, group: str, topic: str, timestamp: int, force: bool, as_json: bool
) -> None:
    """Move a group's offsets to a time; its running consumers start there (resetOffsetByTime)."""
    moved, online = _run(
        ctx, lambda a: a.reset_offsets_by_time(group, topic, timestamp, force=force)
    )
    rows = sorted((b, q, o) for (b, q), o in moved.items())
    if as_json:
        emit_json(
            {
                "online": online,
                "offsets": [{"brokerName": b, "queueId": q, "offset": o} for b, q, o in rows],
            }
        )
        return
    how = "running consumers told" if online else "no consumer online: committed offline"
    emit_table(f"{group} on {topic} ({how})", ["broker", "queue", "offset"], rows)


@click.command("stats-all")
@click.option("--topic", help="Only this topic.")
@click.option("--active", is_flag=True, help="Only lines with traffic in the last minute.")
@json_option
@click.pass_context
def stats_all(ctx: click.Context, topic: str | None, active: bool, as_json: bool) -> None:
    """Every topic's TPS and 24-hour count in, and each consuming group's out (statsAll)."""
    rows = _run(ctx, lambda a: a.stats_all(topic))
    if active:
        rows = [r for r in rows if r.tps > 0]
    if as_json:
        emit_json(
            [
                {
                    "topic": r.topic,
                    "group": r.group,
                    "accumulation": r.accumulation,
                    "tps": r.tps,
                    "msg24Hour": r.count_24h,
                }
                for r in rows
            ]
        )
        return
    emit_table(
        "stats",
        ["topic", "consumer group", "accumulation", "in TPS", "out TPS", "in 24h", "out 24h"],
        [
            (
                r.topic,
                r.group or "",
                r.accumulation if r.group else "",
                f"{r.tps:.2f}" if r.group is None else "",
                f"{r.tps:.2f}" if r.group else "",
                r.count_24h if r.group is None else "",
                r.count_24h if r.group else "",
            )
            for r in rows
        ],
    )


# ---------------------------------------------------------------------------- clients


@click.command("connection")
@click.argument("group")
@json_option
@click.pass_context
def consumer_connection(ctx: click.Context, group: str, as_json: bool) -> None:
    """A consumer group's online clients and subscriptions (ConsumerConnection)."""
    found = _run(ctx, lambda a: a.consumer_connection(group))
    if as_json:
        emit_json(found)
        return
    emit_table(
        f"clients of {group} ({found.consume_type}, {found.message_model})",
        ["client id", "address", "language", "version"],
        [(c.client_id, c.client_addr, c.language, c.version) for c in found.connection_set],
    )
    emit_table(
        "subscriptions",
        ["topic", "expression"],
        [(topic, s.sub_string) for topic, s in sorted(found.subscription_table.items())],
    )


@click.command("status")
@click.argument("group")
@click.option("--client-id", help="Only this client.")
@json_option
@click.pass_context
def consumer_status(ctx: click.Context, group: str, client_id: str | None, as_json: bool) -> None:
    """Each client's running state: owned queues, offsets, cache, locks (consumerStatus)."""
    found = _run(ctx, lambda a: a.consumer_status(group, client_id))
    if as_json:
        emit_json(found)
        return
    for client, info in found.items():
        props = info.get("properties", {})
        emit_table(
            f"{client} ({props.get('PROP_CONSUME_TYPE', '?')}, "
            f"orderly {props.get('PROP_CONSUMEORDERLY', '?')})",
            ["topic", "broker", "queue", "commit offset", "cached", "locked", "last pull (ms)"],
            [
                (
                    q["topic"],
                    q["brokerName"],
                    q["queueId"],
                    q.get("commitOffset"),
                    q.get("cachedMsgCount"),
                    q.get("locked"),
                    q.get("lastPullTimestamp"),
                )
                for q in info["mqTable"]
            ],
        )


@click.group("producer")
def producer_group() -> None:
    """Inspect producer groups."""


@producer_group.command("connection")
@click.argument("group")
@click.option("--topic", required=True, help="A topic the group sends to.")
@json_option
@click.pass_context
def producer_connection(ctx: click.Context, group: str, topic: str, as_json: bool) -> None:
    """A producer group's clients (ProducerConnection)."""
    found = _run(ctx, lambda a: a.producer_connection(group, topic))
    if as_json:
        emit_json({"connectionSet": found})
        return
    emit_table(
        f"clients of {group}",
        ["client id", "address", "language", "version"],
        [(c.client_id, c.client_addr, c.language, c.version) for c in found],
    )


# ---------------------------------------------------------------------------- brokers


def _broker_target(command: Callable[..., None]) -> Callable[..., None]:
    command = click.option("--cluster", help="Every broker of this cluster.")(command)
    return click.option("--broker-addr", help="One broker (host:port).")(command)


@click.command("status")
@_broker_target
@json_option
@click.pass_context
def broker_status(
    ctx: click.Context, broker_addr: str | None, cluster: str | None, as_json: bool
) -> None:
    """A broker's runtime figures (GET_BROKER_RUNTIME_INFO)."""
    _one_target(broker_addr, cluster)

    async def read(admin: MQAdmin) -> dict[str, dict[str, str]]:
        return {
            address: await admin.broker_runtime(address)
            for address in await _brokers(admin, broker_addr, cluster)
        }

    found = _run(ctx, read)
    if as_json:
        emit_json(found)
        return
    for address, table in found.items():
        emit_table(f"broker {address}", ["key", "value"], sorted(table.items()))


@click.command("ha-status")
@_broker_target
@json_option
@click.pass_context
def broker_ha_status(
    ctx: click.Context, broker_addr: str | None, cluster: str | None, as_json: bool
) -> None:
    """Replication of each master: every slave's acknowledged offset and how far behind it is."""
    _one_target(broker_addr, cluster)

    async def read(admin: MQAdmin) -> list[dict[str, Any]]:
        rows = []
        for address in await _brokers(admin, broker_addr, cluster):
            table = await admin.broker_runtime(address)
            if "MASTER" not in table.get("brokerRole", ""):
                continue
            max_offset = int(table.get("commitLogMaxOffset", "0"))
            slaves = []
            for key, value in sorted(table.items()):
                if key.startswith("slaveAckOffset.") and value:
                    ack = int(value)
                    slaves.append(
                        {"brokerId": int(key.split(".", 1)[1]), "ackOffset": ack}
                        | {"behindBytes": max(0, max_offset - ack)}
                    )
            rows.append(
                {
                    "brokerAddr": address,
                    "masterMaxOffset": max_offset,
                    "confirmOffset": int(table.get("confirmOffset", "0")),
                    "syncStateSet": table.get("syncStateSet", ""),
                    "slaves": slaves,
                }
            )
        return rows

    found = _run(ctx, read)
    if as_json:
        emit_json(found)
        return
    emit_table(
        "replication",
        ["master", "max offset", "confirm offset", "SyncStateSet", "slave", "ack", "behind"],
        [
            (
                m["brokerAddr"],
                m["masterMaxOffset"],
                m["confirmOffset"],
                m["syncStateSet"],
                s["brokerId"],
                s["ackOffset"],
                s["behindBytes"],
            )
            for m in found
            for s in (m["slaves"] or [{"brokerId": "-", "ackOffset": "-", "behindBytes": "-"}])
        ],
    )


@click.group("config")
def broker_config_group() -> None:
    """Read and change broker configs."""


@broker_config_group.command("get")
@_broker_target
@click.option("--key", "keys", multiple=True, help="Only these keys.")
@json_option
@click.pass_context
def broker_config_get(
    ctx: click.Context,
    broker_addr: str | None,
    cluster: str | None,
    keys: tuple[str, ...],
    as_json: bool,
) -> None:
    """Every config key of a broker (GET_BROKER_CONFIG)."""
    _one_target(broker_addr, cluster)

    async def read(admin: MQAdmin) -> dict[str, dict[str, str]]:
        return {
            address: await admin.broker_config(address)
            for address in await _brokers(admin, broker_addr, cluster)
        }

    found = _run(ctx, read)
    if keys:
        found = {a: {k: v for k, v in c.items() if k in keys} for a, c in found.items()}
    if as_json:
        emit_json(found)
        return
    for address, config in found.items():
        emit_table(f"config of {address}", ["key", "value"], sorted(config.items()))


@broker_config_group.command("update")
@click.argument("pairs", nargs=-1, required=True, metavar="KEY=VALUE...")
@_broker_target
@json_option
@click.pass_context
def broker_config_update(
    ctx: click.Context,
    pairs: tuple[str, ...],
    broker_addr: str | None,
    cluster: str | None,
    as_json: bool,
) -> None:
    """Change settings of running brokers (only keys a broker takes at runtime)."""
    _one_target(broker_addr, cluster)
    values = _key_values(pairs)

    async def update(admin: MQAdmin) -> list[str]:
        addresses = await _brokers(admin, broker_addr, cluster)
        for address in addresses:
            await admin.update_broker_config(address, values)
        return addresses

    done = _run(ctx, update)
    if as_json:
        emit_json({"brokers": done, "set": values})
        return
    click.echo(f"set {', '.join(values)} on {', '.join(done)}")


# ---------------------------------------------------------------------------- topics, messages


def _perm(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and value not in (2, 4, 6):
        raise click.BadParameter(f"{value} is not 2 (write), 4 (read) or 6 (both)")
    return value


@click.command("perm")
@click.argument("topic")
@click.option("--perm", type=int, required=True, callback=_perm, help="2 write, 4 read, 6 both.")
@click.option("--broker-name", help="Only on this broker group.")
@json_option
@click.pass_context
def topic_perm(
    ctx: click.Context, topic: str, perm: int, broker_name: str | None, as_json: bool
) -> None:
    """Change a topic's permission on its masters (updateTopicPerm)."""
    done = _run(ctx, lambda a: a.update_topic_perm(topic, perm, broker_name=broker_name))
    if as_json:
        emit_json({"topic": topic, "perm": perm, "brokers": done})
        return
    click.echo(f"topic {topic}: perm {perm} on {', '.join(done)}")


def _message_json(message: Message) -> dict[str, Any]:
    return {
        "topic": message.topic,
        "brokerName": message.broker_name,
        "queueId": message.queue_id,
        "queueOffset": message.queue_offset,
        "msgId": message.msg_id,
        "tags": message.tags,
        "keys": message.keys,
        "properties": message.properties,
        "storeTimestamp": message.store_timestamp_ms,
        "bornTimestamp": message.born_timestamp_ms,
        "body": message.body.decode(errors="replace"),
    }


def _show(title: str, messages: list[Message], as_json: bool) -> None:
    if as_json:
        emit_json([_message_json(m) for m in messages])
        return
    emit_table(
        title,
        ["broker", "queue", "offset", "stored (ms)", "tags", "keys", "body"],
        [
            (
                m.broker_name,
                m.queue_id,
                m.queue_offset,
                m.store_timestamp_ms,
                m.tags or "",
                " ".join(m.keys),
                m.body[:60].decode(errors="replace"),
            )
            for m in messages
        ],
    )


@click.command("by-offset")
@click.option("--topic", required=True)
@click.option("--broker-name", required=True)
@click.option("--queue", "queue_id", type=click.IntRange(0), required=True)
@click.option("--offset", type=click.IntRange(0), required=True, help="Queue offset.")
@json_option
@click.pass_context
def message_by_offset(
    ctx: click.Context, topic: str, broker_name: str, queue_id: int, offset: int, as_json: bool
) -> None:
    """The message at one queue offset (queryMsgByOffset); nothing is committed."""

    async def read() -> list[Message]:
        async with PullConsumer(_namesrv(ctx), "ferry-admin-reader") as consumer:
            queue = MessageQueue(topic, broker_name, queue_id)
            result = await consumer.pull(queue, offset, max_messages=1)
            if result.status is not PullStatus.FOUND or not result.messages:
                raise FerryError(
                    f"no message at {topic} {broker_name} queue {queue_id} offset {offset} "
                    f"({result.status.name})"
                )
            return result.messages[:1]

    _show("message", asyncio.run(read()), as_json)


@click.command("print")
@click.argument("topic")
@click.option("--begin-ms", type=click.IntRange(0), default=0, help="Stored at or after (ms).")
@click.option("--end-ms", type=click.IntRange(0), help="Stored before (ms; default: now).")
@click.option(
    "--max", "max_count", type=click.IntRange(1, PRINT_MAX), default=1000, show_default=True
)
@json_option
@click.pass_context
def message_print(
    ctx: click.Context,
    topic: str,
    begin_ms: int,
    end_ms: int | None,
    max_count: int,
    as_json: bool,
) -> None:
    """Every message of a topic stored in a time range (printMsg); commits nothing."""
    if end_ms is not None and end_ms <= begin_ms:
        raise click.BadParameter("must be after --begin-ms", param_hint="--end-ms")

    async def read() -> list[Message]:
        found: list[Message] = []
        async with PullConsumer(_namesrv(ctx), "ferry-admin-reader") as consumer:
            for queue in await consumer.queues(topic):
                # each queue's first max_count in the range: the earliest overall are among them
                offset = await consumer.offset_for_time(queue, begin_ms)
                last = await consumer.max_offset(queue)
                taken = 0
                while offset < last and taken < max_count:
                    result = await consumer.pull(queue, offset, max_messages=32)
                    if result.status is not PullStatus.FOUND or not result.messages:
                        break
                    for message in result.messages:
                        stored = message.store_timestamp_ms
                        if end_ms is not None and stored >= end_ms:
                            last = offset  # past the range: the queue is done
                            break
                        if stored >= begin_ms and taken < max_count:
                            found.append(message)
                            taken += 1
                    offset = result.next_offset
        return sorted(found, key=lambda m: (m.store_timestamp_ms, m.broker_name, m.queue_id))[
            :max_count
        ]

    _show(f"{topic} from {begin_ms}", asyncio.run(read()), as_json)


# ---------------------------------------------------------------------------- NameServers


@click.group("namesrv")
def namesrv_group() -> None:
    """NameServer config and KV config."""


@namesrv_group.group("config")
def namesrv_config_group() -> None:
    """Read and change every NameServer's config."""


@namesrv_config_group.command("get")
@json_option
@click.pass_context
def namesrv_config_get(ctx: click.Context, as_json: bool) -> None:
    """Every NameServer's config (GET_NAMESRV_CONFIG)."""
    found = _run(ctx, lambda a: a.namesrv_configs())
    if as_json:
        emit_json(found)
        return
    for address, config in found.items():
        emit_table(f"NameServer {address}", ["key", "value"], sorted(config.items()))


@namesrv_config_group.command("update")
@click.argument("pairs", nargs=-1, required=True, metavar="KEY=VALUE...")
@json_option
@click.pass_context
def namesrv_config_update(ctx: click.Context, pairs: tuple[str, ...], as_json: bool) -> None:
    """Change settings of every NameServer (brokerTimeout, scanInterval)."""
    values = _key_values(pairs)
    done = _run(ctx, lambda a: a.update_namesrv_config(values))
    if as_json:
        emit_json({"namesrvs": done, "set": values})
        return
    click.echo(f"set {', '.join(values)} on {', '.join(done)}")


@namesrv_group.group("kv")
def kv_group() -> None:
    """KV config items (namespace, key, value) on every NameServer."""


@kv_group.command("put")
@click.argument("namespace")
@click.argument("key")
@click.argument("value")
@json_option
@click.pass_context
def kv_put(ctx: click.Context, namespace: str, key: str, value: str, as_json: bool) -> None:
    """Set a KV config item (updateKvConfig)."""
    done = _run(ctx, lambda a: a.put_kv(namespace, key, value))
    if as_json:
        emit_json({"namespace": namespace, "key": key, "value": value, "namesrvs": done})
        return
    click.echo(f"{namespace}/{key} set on {', '.join(done)}")


@kv_group.command("get")
@click.argument("namespace")
@click.argument("key")
@json_option
@click.pass_context
def kv_get(ctx: click.Context, namespace: str, key: str, as_json: bool) -> None:
    """A KV config item (exit 1 when it is not set)."""
    value = _run(ctx, lambda a: a.get_kv(namespace, key))
    if value is None:
        raise FerryError(f"no KV config item {namespace}/{key}")
    if as_json:
        emit_json({"namespace": namespace, "key": key, "value": value})
        return
    click.echo(value)


@kv_group.command("delete")
@click.argument("namespace")
@click.argument("key")
@json_option
@click.pass_context
def kv_delete(ctx: click.Context, namespace: str, key: str, as_json: bool) -> None:
    """Delete a KV config item (deleteKvConfig)."""
    done = _run(ctx, lambda a: a.delete_kv(namespace, key))
    if as_json:
        emit_json({"namespace": namespace, "key": key, "namesrvs": done})
        return
    click.echo(f"{namespace}/{key} deleted on {', '.join(done)}")
