"""`ferry admin broker`: drain a broker group before maintenance, switch a group's master.

- `wipe-write-perm GROUP` / `add-write-perm GROUP` (RocketMQ mqadmin `wipeWritePerm` /
  `addWritePerm`, WIPE_WRITE_PERM_OF_BROKER 205 / ADD_WRITE_PERM_OF_BROKER 327): every
  NameServer offers the group's queues read-only, so producers send elsewhere while consumers
  read what is left; then the group can be stopped. Each NameServer keeps this in memory: one
  that restarts offers the group for writing again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import click

from ferrymq.cli.output import emit_json, emit_table
from ferrymq.client.admin import AdminClient

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
