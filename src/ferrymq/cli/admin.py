"""`ferry admin`: topics, clusters, routes, consumer progress, offsets and messages.

JSON output (`--json`) uses RocketMQ's body shapes where RocketMQ has one (TopicRouteData,
ClusterInfo, ConsumeStats, TopicStatsTable).

In controller mode topic create and delete go to the controller (`AdminClient`), and
`topic status` also shows the controller's placement against what each group holds;
`topic reassign` and `broker drain` move queues between groups (`cli/moves.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from ferrymq.cli.admin_daily import (
    broker_config_group,
    broker_ha_status,
    broker_status,
    consumer_connection,
    consumer_status,
    group_group,
    message_by_offset,
    message_print,
    namesrv_group,
    offset_reset_by_time,
    producer_group,
    stats_all,
    topic_perm,
)
from ferrymq.cli.auth_admin import acl_group, user_group
from ferrymq.cli.broker import broker_group
from ferrymq.cli.controller import controller_group
from ferrymq.cli.moves import broker_drain, broker_forget, topic_reassign
from ferrymq.cli.mqadmin_alias import add_aliases
from ferrymq.cli.output import emit_json, emit_table
from ferrymq.client.admin import AdminClient, TopicPlacementStatus
from ferrymq.client.message import Message
from ferrymq.errors import FerryError
from ferrymq.wire.bodies import ClusterInfo

__all__ = ["DEFAULT_NAMESRV", "admin_group"]

T = TypeVar("T")
DEFAULT_NAMESRV = "127.0.0.1:9876"


def _run(namesrv: str, work: Callable[[AdminClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with AdminClient(namesrv) as admin:
            return await work(admin)

    return asyncio.run(main())


def _namesrv(ctx: click.Context) -> str:
    return str(ctx.obj["namesrv"])


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@click.group("admin")
@click.option(
    "--namesrv",
    envvar="FERRY_NAMESRV",
    default=DEFAULT_NAMESRV,
    show_default=True,
    help="NameServer address(es), `;`-separated (env FERRY_NAMESRV).",
)
@click.pass_context
def admin_group(ctx: click.Context, namesrv: str) -> None:
    """Administer a ferrymq cluster (RocketMQ mqadmin)."""
    ctx.ensure_object(dict)
    ctx.obj["namesrv"] = namesrv


@admin_group.group("topic")
def topic_group() -> None:
    """Create, delete and inspect topics."""


@topic_group.command("create")
@click.argument("name")
@click.option("--queues", type=click.IntRange(1, 1024), help="Queues (default 8; fenced: 1).")
@click.option("--broker-name", help="Only on this broker group.")
@click.option("--cluster", help="On every group of this cluster (default: every group).")
@click.option("--order", is_flag=True, help="An ordered topic.")
@click.option(
    "--fenced",
    is_flag=True,
    help="A fenced topic: one queue on --broker-name, one writer at a time (claims and epochs).",
)
@json_option
@click.pass_context
def topic_create(
    ctx: click.Context,
    name: str,
    queues: int | None,
    broker_name: str | None,
    cluster: str | None,
    order: bool,
    fenced: bool,
    as_json: bool,
) -> None:
    """Create (or change) a topic."""
    if fenced:
        if broker_name is None:
            raise click.UsageError("--fenced needs --broker-name (a fenced topic is on one group)")
        if queues not in (None, 1):
            raise click.UsageError("a fenced topic has exactly one queue")
    count = queues or (1 if fenced else 8)

    async def create(admin: AdminClient) -> tuple[list[str], TopicPlacementStatus | None]:
        masters = await admin.create_topic(
            name, count, cluster=cluster, broker_name=broker_name, order=order, fenced=fenced
        )
        return masters, await admin.topic_placement(name)

    masters, placement = _run(_namesrv(ctx), create)
    waiting = (
        [g.broker_name for g in placement.groups if g.state == "no master"] if placement else []
    )
    if as_json:
        emit_json(
            {
                "topic": name,
                "queues": count,
                "brokers": masters,
                "order": order,
                "fenced": fenced,
                "pending": waiting,
            }
        )
        return
    kind = "fenced topic" if fenced else "topic"
    click.echo(f"{kind} {name}: {count} queues on {', '.join(masters) or 'no master yet'}")
    if waiting:
        click.echo(
            f"pending on {', '.join(waiting)}: no master; it gets the topic when one returns"
        )


@topic_group.command("fence")
@click.argument("name")
@json_option
@click.pass_context
def topic_fence(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show a fenced topic's holder (epoch, writer, URL) and where its live tail starts."""
    holder = _run(_namesrv(ctx), lambda a: a.fence(name))
    if as_json:
        emit_json(
            {
                "epoch": holder.epoch,
                "writer": holder.writer,
                "url": holder.url,
                "liveStartOffset": holder.live_start_offset,
            }
        )
        return
    emit_table(
        f"fence of {name}",
        ["epoch", "writer", "url", "live start offset"],
        [(holder.epoch, holder.writer, holder.url, holder.live_start_offset)],
    )


@topic_group.command("delete")
@click.argument("name")
@click.option("--cluster")
@json_option
@click.pass_context
def topic_delete(ctx: click.Context, name: str, cluster: str | None, as_json: bool) -> None:
    """Delete a topic from the brokers and the NameServers."""
    _run(_namesrv(ctx), lambda a: a.delete_topic(name, cluster=cluster))
    if as_json:
        emit_json({"topic": name, "cluster": cluster, "deleted": True})
        return
    click.echo(f"topic {name} deleted")


@topic_group.command("route")
@click.argument("name")
@json_option
@click.pass_context
def topic_route(ctx: click.Context, name: str, as_json: bool) -> None:
    """Show a topic's route (TopicRouteData)."""
    route = _run(_namesrv(ctx), lambda a: a.route(name))
    if route is None:
        raise click.ClickException(f"no route for topic {name}")
    if as_json:
        emit_json(route)
        return
    addrs = {b.broker_name: b.broker_addrs for b in route.broker_datas}
    emit_table(
        f"route of {name}",
        ["broker", "read queues", "write queues", "perm", "addresses"],
        [
            (
                q.broker_name,
                q.read_queue_nums,
                q.write_queue_nums,
                q.perm,
                ", ".join(f"{i}={a}" for i, a in sorted(addrs.get(q.broker_name, {}).items())),
            )
            for q in route.queue_datas
        ],
    )


@topic_group.command("status")
@click.argument("name")
@json_option
@click.pass_context
def topic_status(ctx: click.Context, name: str, as_json: bool) -> None:
    """Every queue's offsets (TopicStatsTable); controller mode: placement, desired vs actual."""

    async def status(admin: AdminClient) -> tuple[TopicPlacementStatus | None, list[Any]]:
        placement = await admin.topic_placement(name)
        try:
            entries = await admin.topic_status(name)
        except FerryError:
            if placement is None:
                raise
            entries = []  # not routed anywhere (yet, or any more): the placement says why
        return placement, entries

    placement, entries = _run(_namesrv(ctx), status)
    if as_json:
        found: dict[str, Any] = {"offsetTable": entries}
        if placement is not None:
            found["placement"] = _placement_json(placement)
        emit_json(found)
        return
    if placement is not None:
        _show_placement(placement)
    if not entries:
        return
    emit_table(
        f"status of {name}",
        ["broker", "queue", "min offset", "max offset", "last stored (ms)"],
        [
            (e.broker_name, e.queue_id, e.min_offset, e.max_offset, e.last_update_timestamp)
            for e in entries
        ],
    )


def _placement_json(placement: TopicPlacementStatus) -> dict[str, Any]:
    record = placement.record
    return {
        "topicVersion": placement.topic_version,
        "version": record.version if record is not None else None,
        "deletedAtVersion": placement.deleted_at,
        "groups": [
            {
                "brokerName": g.broker_name,
                "desired": g.desired,
                "master": g.master,
                "onBroker": g.on_broker,
                "routed": g.routed,
                "state": g.state,
            }
            for g in placement.groups
        ],
    }


def _show_placement(placement: TopicPlacementStatus) -> None:
    record = placement.record
    if record is not None:
        title = f"placement of {placement.topic} (version {record.version})"
    elif placement.deleted_at is not None:
        title = f"placement of {placement.topic} (deleted at version {placement.deleted_at})"
    else:
        title = f"placement of {placement.topic} (not known to the controller)"

    def shown(value: int | str | None) -> str:
        return "-" if value is None else str(value)

    emit_table(
        title,
        ["broker", "desired queues", "master", "on master", "routed", "state"],
        [
            (
                g.broker_name,
                shown(g.desired),
                shown(g.master),
                shown(g.on_broker),
                shown(g.routed),
                g.state,
            )
            for g in placement.groups
        ],
    )


@topic_group.command("list")
@json_option
@click.pass_context
def topic_list(ctx: click.Context, as_json: bool) -> None:
    """Every topic the NameServer routes."""
    topics = _run(_namesrv(ctx), lambda a: a.topics())
    if as_json:
        emit_json({"topicList": topics})
    else:
        for topic in topics:
            click.echo(topic)


@admin_group.group("cluster")
def cluster_group() -> None:
    """Inspect clusters."""


@cluster_group.command("list")
@json_option
@click.pass_context
def cluster_list(ctx: click.Context, as_json: bool) -> None:
    """Every cluster and broker group (ClusterInfo), with each broker's InTPS and OutTPS."""
    if as_json:
        emit_json(_run(_namesrv(ctx), lambda a: a.cluster_info()))
        return
    info, tps = _run(_namesrv(ctx), _cluster_tps)
    rows: list[tuple[str, str, int, str, str, str]] = []
    for cluster, names in sorted(info.cluster_addr_table.items()):
        for name in names:
            brokers = info.broker_addr_table.get(name)
            addrs = brokers.broker_addrs if brokers else {}
            rows.extend(
                (cluster, name, broker_id, addr, *tps.get(addr, ("", "")))
                for broker_id, addr in sorted(addrs.items())
            )
    emit_table("clusters", ["cluster", "broker", "id", "address", "InTPS", "OutTPS"], rows)


async def _cluster_tps(admin: AdminClient) -> tuple[ClusterInfo, dict[str, tuple[str, str]]]:
    """ClusterInfo, and each broker's putTps and getTransferedTps over 10 s.

    RocketMQ's clusterList shows the first of the three rates of each key.
    """
    info = await admin.cluster_info()
    tps: dict[str, tuple[str, str]] = {}
    for brokers in info.broker_addr_table.values():
        for address in brokers.broker_addrs.values():
            try:
                table = await admin.runtime_info(address)
            except FerryError:
                continue  # a broker that does not answer shows no figures
            put, got = (
                (table.get(key) or "").split(" ")[0] for key in ("putTps", "getTransferedTps")
            )
            tps[address] = (put, got)
    return info, tps


@admin_group.group("consumer")
def consumer_group() -> None:
    """Inspect consumer groups."""


@consumer_group.command("progress")
@click.argument("group")
@click.option("--topic")
@json_option
@click.pass_context
def consumer_progress(ctx: click.Context, group: str, topic: str | None, as_json: bool) -> None:
    """A group's committed offsets against every queue's end (ConsumeStats)."""
    stats = _run(_namesrv(ctx), lambda a: a.consume_stats(group, topic))
    entries = stats.offset_table
    if as_json:
        emit_json({"offsetTable": entries, "consumeTps": stats.consume_tps})
        return
    emit_table(
        f"progress of {group}",
        ["topic", "broker", "queue", "broker offset", "consumer offset", "lag"],
        [
            (
                e.topic,
                e.broker_name,
                e.queue_id,
                e.broker_offset,
                e.consumer_offset,
                e.broker_offset - e.consumer_offset,
            )
            for e in entries
        ],
    )
    click.echo(f"Consume TPS: {stats.consume_tps:.2f}")


@admin_group.group("offset")
def offset_group() -> None:
    """Change consumer offsets."""


@offset_group.command("reset")
@click.option("--group", required=True)
@click.option("--topic", required=True)
@click.option("--to", "target", type=click.Choice(["earliest", "latest"]), help="Where to move.")
@click.option(
    "--timestamp", type=int, help="Move to the first message stored at or after (epoch ms)."
)
@json_option
@click.pass_context
def offset_reset(
    ctx: click.Context,
    group: str,
    topic: str,
    target: str | None,
    timestamp: int | None,
    as_json: bool,
) -> None:
    """Move a group's committed offsets (stop its consumers first)."""
    if (target is None) == (timestamp is None):
        raise click.UsageError("give exactly one of --to and --timestamp")
    moved = _run(
        _namesrv(ctx),
        lambda a: a.reset_offsets(
            group, topic, timestamp_ms=timestamp, to_latest=target == "latest"
        ),
    )
    rows = sorted((b, q, o) for (b, q), o in moved.items())
    if as_json:
        emit_json([{"brokerName": b, "queueId": q, "offset": o} for b, q, o in rows])
    else:
        emit_table(f"{group} on {topic}", ["broker", "queue", "offset"], rows)


@admin_group.group("message")
def message_group() -> None:
    """Find messages."""


def _message_json(message: Message) -> dict[str, Any]:
    return {
        "topic": message.topic,
        "brokerName": message.broker_name,
        "queueId": message.queue_id,
        "queueOffset": message.queue_offset,
        "msgId": message.msg_id,
        "offsetMsgId": message.offset_msg_id,
        "tags": message.tags,
        "keys": message.keys,
        "properties": message.properties,
        "storeTimestamp": message.store_timestamp_ms,
        "bornTimestamp": message.born_timestamp_ms,
        "reconsumeTimes": message.reconsume_times,
        "body": message.body.decode(errors="replace"),
    }


def _show_messages(messages: list[Message], as_json: bool) -> None:
    if as_json:
        emit_json([_message_json(m) for m in messages])
        return
    emit_table(
        "messages",
        ["topic", "broker", "queue", "offset", "msgId", "keys", "body"],
        [
            (
                m.topic,
                m.broker_name,
                m.queue_id,
                m.queue_offset,
                m.msg_id,
                " ".join(m.keys),
                m.body[:60].decode(errors="replace"),
            )
            for m in messages
        ],
    )


@message_group.command("by-key")
@click.argument("topic")
@click.argument("key")
@click.option("--max", "max_count", type=click.IntRange(1, 64), default=32, show_default=True)
@json_option
@click.pass_context
def message_by_key(ctx: click.Context, topic: str, key: str, max_count: int, as_json: bool) -> None:
    """Messages whose keys (or unique key) include KEY."""
    _show_messages(
        _run(_namesrv(ctx), lambda a: a.messages_by_key(topic, key, max_count=max_count)), as_json
    )


@message_group.command("by-id")
@click.argument("offset_msg_id")
@click.option("--group", help="With --client-id: that client consumes it (consume-directly).")
@click.option("--client-id", help="With --group: the consumer client that consumes it.")
@json_option
@click.pass_context
def message_by_id(
    ctx: click.Context,
    offset_msg_id: str,
    group: str | None,
    client_id: str | None,
    as_json: bool,
) -> None:
    """The message with an offset message id (as a send returns it).

    With --group and --client-id, as mqadmin's `queryMsgById -g -d`: that client consumes it
    (`message consume-directly`).
    """
    if group is not None or client_id is not None:
        if group is None or client_id is None:
            raise click.UsageError("--group and --client-id go together")
        ctx.invoke(
            message_consume_directly,
            offset_msg_id=offset_msg_id,
            group=group,
            client_id=client_id,
            as_json=as_json,
        )
        return
    _show_messages([_run(_namesrv(ctx), lambda a: a.message_by_id(offset_msg_id))], as_json)


@message_group.command("consume-directly")
@click.argument("offset_msg_id")
@click.option("--group", required=True, help="The consumer group.")
@click.option("--client-id", required=True, help="The client of the group that consumes it.")
@json_option
@click.pass_context
def message_consume_directly(
    ctx: click.Context, offset_msg_id: str, group: str, client_id: str, as_json: bool
) -> None:
    """Have one consumer client run its listener on a stored message once more.

    The Dashboard's resend (CONSUME_MESSAGE_DIRECTLY): the client answers how its listener
    did (CR_SUCCESS, CR_THROW_EXCEPTION...) and how long it took. No offset is committed.
    """
    result = _run(_namesrv(ctx), lambda a: a.consume_directly(offset_msg_id, group, client_id))
    found = {
        "msgId": offset_msg_id,
        "group": group,
        "clientId": client_id,
        "consumeResult": result.consume_result,
        "order": result.order,
        "autoCommit": result.auto_commit,
        "spentTimeMills": result.spent_time_mills,
        "remark": result.remark,
    }
    if as_json:
        emit_json(found)
        return
    emit_table(
        f"consumed directly by {client_id}",
        ["result", "spent ms", "order", "remark"],
        [(result.consume_result, result.spent_time_mills, result.order, result.remark or "")],
    )


admin_group.add_command(controller_group)
admin_group.add_command(user_group)
admin_group.add_command(acl_group)
admin_group.add_command(broker_group)
topic_group.add_command(topic_reassign)
broker_group.add_command(broker_drain)
broker_group.add_command(broker_forget)
# mqadmin's everyday commands (cli/admin_daily.py)
admin_group.add_command(group_group)
admin_group.add_command(producer_group)
admin_group.add_command(namesrv_group)
consumer_group.add_command(consumer_connection)
topic_group.add_command(topic_perm)
message_group.add_command(message_by_offset)
message_group.add_command(message_print)
broker_group.add_command(broker_status)
broker_group.add_command(broker_ha_status)
broker_group.add_command(broker_config_group)
offset_group.add_command(offset_reset_by_time)
admin_group.add_command(stats_all)
consumer_group.add_command(consumer_status)
add_aliases(admin_group)  # mqadmin's names and flags (cli/mqadmin_alias.py)
