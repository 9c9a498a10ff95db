"""`ferry admin topic reassign` and `ferry admin broker drain`: move queues between groups.

Controller mode only (issue 20 section 4; the design is `wire/queuemap.py`). The controller
starts the moves; its leader seals each queue on its source group and opens it on the target
from the offset it ended at. These commands print each move as it starts, then as it finishes
(`--no-wait`: only the start), one line each, or one JSON document with `--json`:
`{"topicVersion": N, "moves": [{"topic", "brokerName", "queueId", "fromBrokerName",
"fromQueueId", "toBrokerName", "toQueueId", "state", "endOffset"}]}`.
`--cancel` gives a move up before it finished; `broker forget GROUP` drops a drained group's
read-only segments (once consumers read them: what is not read by then is not read).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import click

from ferrymq.cli.output import emit_json
from ferrymq.client.admin import AdminClient, MoveProgress
from ferrymq.errors import FerryError, RemoteError
from ferrymq.wire.topics import ControllerReassignRequestHeader, QueueMoveBody, ReassignAction

__all__ = ["broker_drain", "broker_forget", "topic_reassign"]

_POLL_S = 0.2

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
wait_options = [
    click.option("--no-wait", is_flag=True, help="Return once the moves started."),
    click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=120.0,
        show_default=True,
        help="Seconds to wait for the moves to finish.",
    ),
]


def _with_wait_options(command: Any) -> Any:
    for option in reversed(wait_options):
        command = option(command)
    return command


def _describe(move: QueueMoveBody) -> str:
    return (
        f"{move.topic} queue {move.queue_id} of {move.broker_name}: "
        f"{move.from_broker_name}/{move.from_queue_id} -> {move.to_broker_name}/{move.to_queue_id}"
    )


def _json(version: int, progress: list[MoveProgress]) -> dict[str, Any]:
    return {
        "topicVersion": version,
        "moves": [
            {
                "topic": p.move.topic,
                "brokerName": p.move.broker_name,
                "queueId": p.move.queue_id,
                "fromBrokerName": p.move.from_broker_name,
                "fromQueueId": p.move.from_queue_id,
                "toBrokerName": p.move.to_broker_name,
                "toQueueId": p.move.to_queue_id,
                "state": p.state,
                "endOffset": p.end_offset,
            }
            for p in progress
        ],
    }


def _run_moves(
    ctx: click.Context,
    header: ControllerReassignRequestHeader,
    *,
    as_json: bool,
    no_wait: bool,
    timeout: float,
) -> None:
    """Start the moves, show each one's progress, fail if one was given up or timed out."""
    say = (lambda _text: None) if as_json else click.echo

    async def main() -> tuple[int, list[MoveProgress]]:
        async with AdminClient(str(ctx.obj["namesrv"])) as admin:
            body = await admin.reassign(header)
            if not body.moves:
                say("nothing to move")
            for move in body.moves:
                say(f"moving {_describe(move)}")
            progress = await admin.move_progress(body.moves)
            deadline = time.monotonic() + timeout
            shown: set[int] = set()
            while True:
                for i, item in enumerate(progress):
                    if item.state != "moving" and i not in shown:
                        shown.add(i)
                        if item.state == "done":
                            say(f"moved  {_describe(item.move)} at offset {item.end_offset}")
                        else:
                            say(f"given up: {_describe(item.move)}")
                if no_wait or all(p.state != "moving" for p in progress):
                    return body.topic_version, progress
                if time.monotonic() >= deadline:
                    return body.topic_version, progress
                await asyncio.sleep(_POLL_S)
                progress = await admin.move_progress(body.moves)

    try:
        version, progress = asyncio.run(main())
    except RemoteError as exc:
        raise click.ClickException(exc.remark or str(exc)) from None
    except FerryError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        emit_json(_json(version, progress))
    moving = [p for p in progress if p.state == "moving"]
    if moving and not no_wait:
        raise click.ClickException(
            f"{len(moving)} move(s) not finished within {timeout:g} s (still running: "
            "run the command again to follow them)"
        )
    if any(p.state == "cancelled" for p in progress) and header.action != ReassignAction.CANCEL:
        raise click.ClickException("a move was given up (cancelled) before it finished")


@click.command("reassign")
@click.argument("topic")
@click.option("--queue", "queue_id", type=click.IntRange(0, 1023), required=True)
@click.option("--to", "to_broker_name", help="The broker group to move the queue to.")
@click.option(
    "--broker-name",
    help="The group the queue is named by (default: the one group other than --to with it).",
)
@click.option("--cancel", is_flag=True, help="Give the queue's running move up.")
@json_option
@_with_wait_options
@click.pass_context
def topic_reassign(
    ctx: click.Context,
    topic: str,
    queue_id: int,
    to_broker_name: str | None,
    broker_name: str | None,
    cancel: bool,
    as_json: bool,
    no_wait: bool,
    timeout: float,
) -> None:
    """Move a queue of TOPIC to another broker group (controller mode)."""
    if cancel == (to_broker_name is not None):
        raise click.UsageError("give --to GROUP, or --cancel")
    if broker_name is None:
        broker_name = _queue_group(ctx, topic, queue_id, to_broker_name)
    header = ControllerReassignRequestHeader(
        action=ReassignAction.CANCEL if cancel else ReassignAction.MOVE,
        topic=topic,
        broker_name=broker_name,
        queue_id=queue_id,
        to_broker_name=to_broker_name,
    )
    _run_moves(ctx, header, as_json=as_json, no_wait=no_wait or cancel, timeout=timeout)


def _queue_group(ctx: click.Context, topic: str, queue_id: int, to: str | None) -> str:
    async def record() -> list[str]:
        async with AdminClient(str(ctx.obj["namesrv"])) as admin:
            placement = await admin.topic_record(topic)
        if placement is None:
            raise click.ClickException(f"topic {topic} does not exist")
        return [
            name
            for name, queues in sorted(placement.placement.items())
            if name != to and queue_id < queues.read_queue_nums
        ]

    try:
        groups = asyncio.run(record())
    except FerryError as exc:
        raise click.ClickException(str(exc)) from None
    if len(groups) == 1:
        return groups[0]
    if not groups:
        raise click.ClickException(f"topic {topic} has no queue {queue_id} to move")
    raise click.UsageError(
        f"queue {queue_id} of {topic} is a queue of each of {', '.join(groups)}: name one with "
        "--broker-name"
    )


@click.command("drain")
@click.argument("broker_name")
@click.option("--to", "to_broker_name", help="Move every queue to this group (default: spread).")
@click.option("--topic", help="Only this topic's queues.")
@json_option
@_with_wait_options
@click.pass_context
def broker_drain(
    ctx: click.Context,
    broker_name: str,
    to_broker_name: str | None,
    topic: str | None,
    as_json: bool,
    no_wait: bool,
    timeout: float,
) -> None:
    """Move every queue off BROKER_NAME (controller mode), e.g. before removing the group."""
    header = ControllerReassignRequestHeader(
        action=ReassignAction.DRAIN,
        topic=topic,
        broker_name=broker_name,
        to_broker_name=to_broker_name,
    )
    _run_moves(ctx, header, as_json=as_json, no_wait=no_wait, timeout=timeout)


@click.command("forget")
@click.argument("broker_name")
@click.option("--topic", help="Only this topic's segments.")
@json_option
@click.pass_context
def broker_forget(ctx: click.Context, broker_name: str, topic: str | None, as_json: bool) -> None:
    """Drop a drained group's read-only queues (after consumers read them to their end)."""
    header = ControllerReassignRequestHeader(
        action=ReassignAction.FORGET, topic=topic, broker_name=broker_name
    )

    async def main() -> list[str]:
        async with AdminClient(str(ctx.obj["namesrv"])) as admin:
            return [t.topic for t in (await admin.reassign(header)).topics]

    try:
        topics = asyncio.run(main())
    except RemoteError as exc:
        raise click.ClickException(exc.remark or str(exc)) from None
    except FerryError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        emit_json({"brokerName": broker_name, "forgotten": topics})
        return
    click.echo(f"{broker_name}: read-only queues of {len(topics)} topic(s) forgotten")
