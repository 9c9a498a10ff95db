"""`ferry admin broker`: drain a broker group before maintenance, switch a group's master.

- `wipe-write-perm GROUP` / `add-write-perm GROUP` (RocketMQ mqadmin `wipeWritePerm` /
  `addWritePerm`, WIPE_WRITE_PERM_OF_BROKER 205 / ADD_WRITE_PERM_OF_BROKER 327): every
  NameServer offers the group's queues read-only, so producers send elsewhere while consumers
  read what is left; then the group can be stopped. Each NameServer keeps this in memory: one
  that restarts offers the group for writing again.
- `switchover GROUP [--to-broker-id N | --to ADDR]` (classic mode, seed 004): a slave becomes
  the master and the master its slave, while both run (`client/switchover.py`). In controller
  mode the controller decides: `ferry admin controller elect-master GROUP --broker-id N`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from ferrymq.cli.output import emit_json, emit_table
from ferrymq.client.admin import AdminClient
from ferrymq.client.switchover import switch_master

__all__ = ["broker_group"]

T = TypeVar("T")

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _run(ctx: click.Context, work: Callable[[AdminClient], Awaitable[T]]) -> T:
    async def main() -> T:
        async with AdminClient(str(ctx.obj["namesrv"])) as admin:
            return await work(admin)

    return asyncio.run(main())


@click.group("broker")
def broker_group() -> None:
    """Drain broker groups and switch their masters."""


def _show_counts(what: str, broker_name: str, counts: dict[str, int], as_json: bool) -> None:
    if as_json:
        emit_json({"brokerName": broker_name, "topics": counts})
        return
    emit_table(
        f"{what} of {broker_name}",
        ["NameServer", "topics on the group"],
        list(counts.items()),
    )


@broker_group.command("wipe-write-perm")
@click.argument("broker_name")
@json_option
@click.pass_context
def wipe_write_perm(ctx: click.Context, broker_name: str, as_json: bool) -> None:
    """Stop offering a group's queues for writing (drain it; RocketMQ wipeWritePerm)."""
    counts = _run(ctx, lambda a: a.wipe_write_perm(broker_name))
    _show_counts("write permission wiped", broker_name, counts, as_json)


@broker_group.command("add-write-perm")
@click.argument("broker_name")
@json_option
@click.pass_context
def add_write_perm(ctx: click.Context, broker_name: str, as_json: bool) -> None:
    """Offer a drained group's queues for writing again (RocketMQ addWritePerm)."""
    counts = _run(ctx, lambda a: a.add_write_perm(broker_name))
    _show_counts("write permission added", broker_name, counts, as_json)


@broker_group.command("switchover")
@click.argument("broker_name")
@click.option("--to-broker-id", type=int, help="The slave to make master (its broker id).")
@click.option("--to", "to_address", help="The slave to make master (its address).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=30.0,
    show_default=True,
    help="Seconds the slave gets to catch up while the master is read-only.",
)
@json_option
@click.pass_context
def switchover(
    ctx: click.Context,
    broker_name: str,
    to_broker_id: int | None,
    to_address: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Swap a group's master and a slave while both run (classic mode).

    The master turns read-only, the slave catches up, the slave becomes master under a new
    epoch and the old master its slave; default target: the slave holding the most log.
    """
    if to_broker_id is not None and to_address is not None:
        raise click.UsageError("give --to-broker-id or --to, not both")
    result = asyncio.run(
        switch_master(
            str(ctx.obj["namesrv"]),
            broker_name,
            to_broker_id=to_broker_id,
            to_address=to_address,
            timeout=timeout,
        )
    )
    if as_json:
        emit_json(
            {
                "brokerName": result.broker_name,
                "oldMaster": result.old_master,
                "newMaster": result.new_master,
                "masterEpoch": result.master_epoch,
                "oldMasterBrokerId": result.old_master_broker_id,
                "logOffset": result.log_offset,
            }
        )
        return
    click.echo(
        f"{broker_name}: {result.new_master} is master at epoch {result.master_epoch}; "
        f"{result.old_master} follows it as broker {result.old_master_broker_id} "
        f"(both at log offset {result.log_offset})"
    )
