"""`ferry admin controller`: controller metadata and config, SyncStateSets, elections, cleanup.

The RocketMQ counterparts (spec section 5): `getControllerMetaData`, `getControllerConfig` /
`updateControllerConfig`, `getSyncStateSet`, `getBrokerEpoch`, `electMaster`,
`cleanBrokerMetadata`. `--json` prints RocketMQ's body and header shapes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from ferrymq.cli.output import emit_json, emit_table
from ferrymq.client.admin import AdminClient
from ferrymq.client.controller_admin import ControllerAdmin, broker_epoch_cache
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.controller import EpochEntryCache, GetMetaDataResponseHeader

__all__ = ["DEFAULT_CONTROLLER", "controller_group"]

T = TypeVar("T")
DEFAULT_CONTROLLER = "127.0.0.1:9878"

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _run(ctx: click.Context, work: Callable[[ControllerAdmin], Awaitable[T]]) -> T:
    async def main() -> T:
        async with ControllerAdmin(str(ctx.obj["controller"])) as admin:
            return await work(admin)

    return asyncio.run(main())


@click.group("controller")
@click.option(
    "--controller",
    envvar="FERRY_CONTROLLER",
    default=DEFAULT_CONTROLLER,
    show_default=True,
    help="Controller address(es), `;`-separated (env FERRY_CONTROLLER).",
)
@click.pass_context
def controller_group(ctx: click.Context, controller: str) -> None:
    """Inspect and steer the controller (controller mode)."""
    ctx.ensure_object(dict)
    ctx.obj["controller"] = controller


@controller_group.command("meta")
@json_option
@click.pass_context
def meta(ctx: click.Context, as_json: bool) -> None:
    """Each controller's view of the leader (getControllerMetaData)."""

    async def work(admin: ControllerAdmin) -> list[tuple[str, GetMetaDataResponseHeader | str]]:
        found: list[tuple[str, GetMetaDataResponseHeader | str]] = []
        for address in admin.addresses:
            try:
                found.append((address, await admin.metadata(address)))
            except FerryError as exc:
                found.append((address, str(exc)))
        return found

    answers = _run(ctx, work)
    if as_json:
        emit_json(
            {
                address: answer if isinstance(answer, str) else _meta_dict(answer)
                for address, answer in answers
            }
        )
        return
    emit_table(
        "controllers",
        ["address", "leader?", "leader id", "leader address", "group", "peers"],
        [
            (address, "unreachable", answer, "", "", "")
            if isinstance(answer, str)
            else (
                address,
                "yes" if answer.is_leader else "no",
                answer.controller_leader_id,
                answer.controller_leader_address,
                answer.group,
                answer.peers,
            )
            for address, answer in answers
        ],
    )


def _meta_dict(header: GetMetaDataResponseHeader) -> dict[str, object]:
    return {
        "group": header.group,
        "controllerLeaderId": header.controller_leader_id,
        "controllerLeaderAddress": header.controller_leader_address,
        "isLeader": header.is_leader,
        "peers": header.peers,
    }


@controller_group.command("config")
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change a key on every controller (updateControllerConfig); repeatable.",
)
@json_option
@click.pass_context
def config(ctx: click.Context, settings: tuple[str, ...], as_json: bool) -> None:
    """Show (or change) the controller's election and liveness policy."""
    changes: dict[str, str] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise click.UsageError(f"--set {setting!r}: expected KEY=VALUE")
        changes[key.strip()] = value.strip()

    async def work(admin: ControllerAdmin) -> dict[str, str]:
        if changes:
            await admin.update_config(changes)
        return await admin.config()

    properties = _run(ctx, work)
    if as_json:
        emit_json(properties)
        return
    for key, value in sorted(properties.items()):
        click.echo(f"{key}={value}")


@controller_group.command("sync-state-set")
@click.argument("broker_names", nargs=-1, required=True, metavar="BROKER_NAME...")
@json_option
@click.pass_context
def sync_state_set(ctx: click.Context, broker_names: tuple[str, ...], as_json: bool) -> None:
    """Masters, epochs and in-sync replicas of broker groups (getSyncStateSet)."""
    info = _run(ctx, lambda a: a.sync_state_data(list(broker_names)))
    if as_json:
        emit_json(info)
        return
    missing = sorted(set(broker_names) - set(info.replicas_info_table))
    if missing:
        click.echo(f"unknown broker groups: {', '.join(missing)}", err=True)
    rows: list[tuple[object, ...]] = []
    for name, replicas in sorted(info.replicas_info_table.items()):
        for in_sync, members in (
            (True, replicas.in_sync_replicas),
            (False, replicas.not_in_sync_replicas),
        ):
            rows.extend(
                (
                    name,
                    r.broker_id,
                    r.broker_address,
                    "master" if r.broker_id == replicas.master_broker_id else "slave",
                    "yes" if in_sync else "no",
                    "yes" if r.alive else "no",
                    replicas.master_epoch,
                    replicas.sync_state_set_epoch,
                )
                for r in members
            )
    emit_table(
        "SyncStateSet",
        ["broker", "id", "address", "role", "in sync", "alive", "master epoch", "set epoch"],
        rows,
    )


@controller_group.command("broker-epoch")
@click.option("--broker-name", help="Only this broker group.")
@click.option("--cluster", help="Only this cluster.")
@click.option(
    "--namesrv",
    envvar="FERRY_NAMESRV",
    default="127.0.0.1:9876",
    show_default=True,
    help="NameServer to find the brokers (env FERRY_NAMESRV).",
)
@json_option
def broker_epoch(broker_name: str | None, cluster: str | None, namesrv: str, as_json: bool) -> None:
    """Each broker's epoch history (getBrokerEpoch; asks the brokers)."""

    async def work() -> list[tuple[str, EpochEntryCache | str]]:
        async with AdminClient(namesrv) as admin:
            info = await admin.cluster_info()
        names = set(info.broker_addr_table)
        if cluster is not None:
            names &= set(info.cluster_addr_table.get(cluster, []))
        if broker_name is not None:
            names &= {broker_name}
        found: list[tuple[str, EpochEntryCache | str]] = []
        async with RpcClient() as rpc:
            for name in sorted(names):
                for _, addr in sorted(info.broker_addr_table[name].broker_addrs.items()):
                    try:
                        found.append((addr, await broker_epoch_cache(rpc, addr)))
                    except FerryError as exc:
                        found.append((addr, str(exc)))
        return found

    answers = asyncio.run(work())
    if as_json:
        emit_json(dict(answers))
        return
    rows: list[tuple[object, ...]] = []
    for addr, answer in answers:
        if isinstance(answer, str):
            rows.append((addr, "", "", "", "", answer))
            continue
        rows.extend(
            (addr, answer.broker_name, answer.broker_id, e.epoch, e.start_offset, e.end_offset)
            for e in answer.epoch_list
        )
    emit_table("broker epochs", ["broker", "group", "id", "epoch", "start", "end"], rows)


@controller_group.command("elect-master")
@click.argument("broker_name")
@click.option(
    "--broker-id", type=int, help="Make this broker master (it must be a live candidate)."
)
@click.option("--cluster", default="", help="clusterName of the group.")
@json_option
@click.pass_context
def elect_master(
    ctx: click.Context, broker_name: str, broker_id: int | None, cluster: str, as_json: bool
) -> None:
    """Elect a master for a broker group now (electMaster)."""
    result = _run(
        ctx,
        lambda a: a.elect_master(cluster, broker_name, broker_id, designate=broker_id is not None),
    )
    header = result.header
    if as_json:
        emit_json(
            {
                "stillExists": result.still_exists,
                "masterBrokerId": header.master_broker_id,
                "masterAddress": header.master_address,
                "masterEpoch": header.master_epoch,
                "syncStateSetEpoch": header.sync_state_set_epoch,
                "body": result.body,
            }
        )
        return
    verb = "is still" if result.still_exists else "is now"
    click.echo(
        f"{broker_name}: broker {header.master_broker_id} ({header.master_address}) {verb} "
        f"master, master epoch {header.master_epoch}"
    )


@controller_group.command("clean-broker-metadata")
@click.argument("broker_name")
@click.option("--broker-ids", help="`;`-separated ids to forget (default: the whole group).")
@click.option("--cluster", help="clusterName of the group.")
@click.option("--clean-living", is_flag=True, help="Also forget brokers that are alive.")
@json_option
@click.pass_context
def clean_broker_metadata(
    ctx: click.Context,
    broker_name: str,
    broker_ids: str | None,
    cluster: str | None,
    clean_living: bool,
    as_json: bool,
) -> None:
    """Forget broker ids of a group in the controller (cleanBrokerMetadata)."""
    ids: list[int] | None = None
    if broker_ids:
        try:
            ids = [int(i) for i in broker_ids.split(";") if i.strip()]
        except ValueError:
            raise click.UsageError(f"--broker-ids {broker_ids!r}: expected ids like 1;2") from None
    _run(ctx, lambda a: a.clean_broker_data(cluster, broker_name, ids, clean_living=clean_living))
    what = "ids " + ";".join(map(str, ids)) if ids else "every id"
    if as_json:
        emit_json({"brokerName": broker_name, "cleaned": ids})
    else:
        click.echo(f"{broker_name}: {what} forgotten")
