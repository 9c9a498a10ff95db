"""`ferry admin user ...` and `ferry admin acl ...`: ACL 2.0 users and ACLs.

They do what mqadmin's createUser, updateUser, deleteUser, getUser, listUser, createAcl,
updateAcl, deleteAcl, getAcl and listAcl do.

A change goes to the master of one broker group (`--broker ADDR`) or of every group
(`--cluster NAME`, default: every group the NameServer knows); reads ask one broker (the first
master). Requests are signed with the command's credentials (`ferry --access-key ...`), which
must be a Super user's. Passwords come from `--password` or FERRY_USER_PASSWORD and are never
printed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click

from ferrymq.cli.output import emit_json, emit_table
from ferrymq.client.admin import AdminClient
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl2 import Acl2Error, PolicyEntry, Resource
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

__all__ = ["acl_group", "user_group"]

_TIMEOUT = 10.0


async def _masters(namesrv: str, broker: str | None, cluster: str | None) -> list[str]:
    if broker:
        return [broker]
    async with AdminClient(namesrv) as admin:
        info = await admin.cluster_info()
    names = info.cluster_addr_table.get(cluster, []) if cluster else info.broker_addr_table
    masters = [
        info.broker_addr_table[name].broker_addrs[0]
        for name in sorted(names)
        if name in info.broker_addr_table and 0 in info.broker_addr_table[name].broker_addrs
    ]
    if not masters:
        raise FerryError(f"no master broker found{f' in cluster {cluster}' if cluster else ''}")
    return masters


def _call(
    ctx: click.Context,
    code: int,
    fields: dict[str, str],
    body: Any = None,
    *,
    change: bool,
) -> Any:
    """Send to the master(s); the first answer's JSON body (a change: the addresses changed)."""
    namesrv = str(ctx.obj["namesrv"])
    broker, cluster = ctx.params.get("broker"), ctx.params.get("cluster")
    data = b"" if body is None else json.dumps(body).encode()

    async def main() -> Any:
        addresses = await _masters(namesrv, broker, cluster)
        if not change:
            addresses = addresses[:1]
        answer: Any = None
        async with RpcClient() as rpc:
            for address in addresses:
                request = RemotingCommand(code=code, ext_fields=dict(fields), body=data)
                response = await rpc.call(address, request, _TIMEOUT)
                if response.code != ResponseCode.SUCCESS:
                    raise FerryError(f"{address}: {response.remark} (code {response.code})")
                if not change and answer is None:
                    answer = json.loads(response.body or b"null")
        return addresses if change else answer

    try:
        return asyncio.run(main())
    except FerryError as exc:
        raise click.ClickException(str(exc)) from None


def _target(command: Any) -> Any:
    command = click.option("--cluster", "-c", help="Every master of this cluster.")(command)
    return click.option("--broker", "-b", help="One broker's address (HOST:PORT).")(command)


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@click.group("user")
def user_group() -> None:
    """ACL 2.0 users (the username is the AccessKey, the password the SecretKey)."""


def _user_options(command: Any) -> Any:
    command = click.option(
        "--user-status", type=click.Choice(["enable", "disable"], case_sensitive=False)
    )(command)
    return click.option(
        "--user-type", type=click.Choice(["Super", "Normal"], case_sensitive=False)
    )(command)


@user_group.command("create")
@click.argument("username")
@click.option("--password", envvar="FERRY_USER_PASSWORD", required=True, help="Or env.")
@_user_options
@json_option
@_target
@click.pass_context
def user_create(
    ctx: click.Context, /, username: str, password: str, as_json: bool, **options: Any
) -> None:
    """Create a user (mqadmin createUser)."""
    info = {"username": username, "password": password}
    info["userType"] = options["user_type"] or "Normal"
    info["userStatus"] = options["user_status"] or "enable"
    brokers = _call(ctx, RequestCode.AUTH_CREATE_USER, {"username": username}, info, change=True)
    _done(as_json, f"user {username} created", _user_change(info, "created", brokers))


@user_group.command("update")
@click.argument("username")
@click.option("--password", envvar="FERRY_USER_PASSWORD", help="A new password (or env).")
@_user_options
@json_option
@_target
@click.pass_context
def user_update(
    ctx: click.Context, /, username: str, password: str | None, as_json: bool, **options: Any
) -> None:
    """Change a user's password, type or status (mqadmin updateUser)."""
    info: dict[str, str] = {"username": username}
    if password:
        info["password"] = password
    if options["user_type"]:
        info["userType"] = options["user_type"]
    if options["user_status"]:
        info["userStatus"] = options["user_status"]
    brokers = _call(ctx, RequestCode.AUTH_UPDATE_USER, {"username": username}, info, change=True)
    _done(as_json, f"user {username} updated", _user_change(info, "updated", brokers))


@user_group.command("delete")
@click.argument("username")
@json_option
@_target
@click.pass_context
def user_delete(ctx: click.Context, /, username: str, as_json: bool, **_: Any) -> None:
    """Delete a user and its ACL (mqadmin deleteUser)."""
    brokers = _call(ctx, RequestCode.AUTH_DELETE_USER, {"username": username}, change=True)
    info = {"username": username}
    _done(as_json, f"user {username} deleted", _user_change(info, "deleted", brokers))


def _done(as_json: bool, text: str, change: dict[str, Any]) -> None:
    """A change's one line, or with `--json` what was done as one JSON object."""
    if as_json:
        emit_json(change)
    else:
        click.echo(text)


def _user_change(info: dict[str, str], done: str, brokers: list[str]) -> dict[str, Any]:
    """What a user change did (never the password)."""
    shown = {k: v for k, v in info.items() if k != "password"}
    return {**shown, "passwordSet": "password" in info, done: True, "brokers": brokers}


def _user_rows(users: list[dict[str, str]]) -> list[list[str]]:
    return [[u.get("username", ""), u.get("userType", ""), u.get("userStatus", "")] for u in users]


@user_group.command("get")
@click.argument("username")
@json_option
@_target
@click.pass_context
def user_get(ctx: click.Context, /, username: str, as_json: bool, **_: Any) -> None:
    """Show a user (mqadmin getUser)."""
    user = _call(ctx, RequestCode.AUTH_GET_USER, {"username": username}, change=False)
    if as_json:
        emit_json(user)
    else:
        emit_table("User", ["username", "type", "status"], _user_rows([user]))


@user_group.command("list")
@click.option("--filter", "text", default="", help="Usernames containing this.")
@json_option
@_target
@click.pass_context
def user_list(ctx: click.Context, /, text: str, as_json: bool, **_: Any) -> None:
    """List users (mqadmin listUser)."""
    users = _call(ctx, RequestCode.AUTH_LIST_USER, {"filter": text}, change=False)
    if as_json:
        emit_json(users)
    else:
        emit_table("Users", ["username", "type", "status"], _user_rows(users))


@click.group("acl")
def acl_group() -> None:
    """ACL 2.0 policies of a subject (`User:name`)."""


def _acl_change(
    ctx: click.Context, code: int, subject: str, options: dict[str, Any]
) -> dict[str, Any]:
    """Send an ACL create or update; what was sent, with the brokers that took it."""
    resources = [r for r in options["resources"].split(",") if r.strip()]
    actions = [a for a in options["actions"].split(",") if a.strip()]
    ips = [ip for ip in (options["source_ip"] or "").split(",") if ip.strip()]
    try:
        entries = [PolicyEntry.of(r, actions, options["decision"], ips) for r in resources]
    except Acl2Error as exc:
        raise click.BadParameter(str(exc)) from None
    info = {
        "subject": subject,
        "policies": [
            {
                "policyType": "Custom",
                "entries": [
                    {
                        "resource": e.resource.key,
                        "actions": sorted(a.value for a in e.actions),
                        "sourceIps": list(e.source_ips),
                        "decision": e.decision.value,
                    }
                    for e in entries
                ],
            }
        ],
    }
    brokers = _call(ctx, code, {"subject": subject}, info, change=True)
    return {**info, "brokers": brokers}


def _acl_options(command: Any) -> Any:
    command = click.option("--decision", default="Allow", show_default=True)(command)
    command = click.option("--source-ip", help="Addresses or CIDR blocks, comma-separated.")(
        command
    )
    command = click.option(
        "--actions", required=True, help="Pub, Sub, Create, Update, Delete, Get, List, All."
    )(command)
    return click.option(
        "--resources", required=True, help="Topic:name, Group:name, Topic:prefix*, Topic:*, *."
    )(command)


@acl_group.command("create")
@click.argument("subject")
@_acl_options
@json_option
@_target
@click.pass_context
def acl_create(ctx: click.Context, /, subject: str, as_json: bool, **options: Any) -> None:
    """Add entries to a subject's ACL (mqadmin createAcl)."""
    change = _acl_change(ctx, RequestCode.AUTH_CREATE_ACL, subject, options)
    _done(as_json, f"acl of {subject} created", {**change, "created": True})


@acl_group.command("update")
@click.argument("subject")
@_acl_options
@json_option
@_target
@click.pass_context
def acl_update(ctx: click.Context, /, subject: str, as_json: bool, **options: Any) -> None:
    """Replace the entries of those resources in a subject's ACL (mqadmin updateAcl)."""
    change = _acl_change(ctx, RequestCode.AUTH_UPDATE_ACL, subject, options)
    _done(as_json, f"acl of {subject} updated", {**change, "updated": True})


@acl_group.command("delete")
@click.argument("subject")
@click.option("--resources", default="", help="Only these entries (default: the whole ACL).")
@json_option
@_target
@click.pass_context
def acl_delete(
    ctx: click.Context, /, subject: str, resources: str, as_json: bool, **_: Any
) -> None:
    """Delete a subject's ACL or some of its entries (mqadmin deleteAcl)."""
    try:
        for key in resources.split(","):
            if key.strip():
                Resource.parse(key)
    except Acl2Error as exc:
        raise click.BadParameter(str(exc)) from None
    fields = {"subject": subject, "resource": resources}
    brokers = _call(ctx, RequestCode.AUTH_DELETE_ACL, fields, change=True)
    change = {"subject": subject, "resources": [r for r in resources.split(",") if r.strip()]}
    _done(as_json, f"acl of {subject} deleted", {**change, "deleted": True, "brokers": brokers})


def _acl_rows(acls: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            acl["subject"],
            policy["policyType"],
            entry["resource"],
            ",".join(entry["actions"]),
            ",".join(entry["sourceIps"]),
            entry["decision"],
        ]
        for acl in acls
        for policy in acl["policies"]
        for entry in policy["entries"]
    ]


_ACL_COLUMNS = ["subject", "policy", "resource", "actions", "source IPs", "decision"]


@acl_group.command("get")
@click.argument("subject")
@json_option
@_target
@click.pass_context
def acl_get(ctx: click.Context, /, subject: str, as_json: bool, **_: Any) -> None:
    """Show a subject's ACL (mqadmin getAcl)."""
    acl = _call(ctx, RequestCode.AUTH_GET_ACL, {"subject": subject}, change=False)
    if as_json:
        emit_json(acl)
    else:
        emit_table("ACL", _ACL_COLUMNS, _acl_rows([acl]))


@acl_group.command("list")
@click.option("--subject-filter", default="")
@click.option("--resource-filter", default="")
@json_option
@_target
@click.pass_context
def acl_list(
    ctx: click.Context, /, subject_filter: str, resource_filter: str, as_json: bool, **_: Any
) -> None:
    """List ACLs (mqadmin listAcl)."""
    fields = {"subjectFilter": subject_filter, "resourceFilter": resource_filter}
    acls = _call(ctx, RequestCode.AUTH_LIST_ACL, fields, change=False)
    if as_json:
        emit_json(acls)
    else:
        emit_table("ACLs", _ACL_COLUMNS, _acl_rows(acls))
