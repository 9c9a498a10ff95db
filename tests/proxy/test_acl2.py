"""ACL 2.0 on the endpoint (issue 23): both ports check clients against the controllers' users.

In process, real sockets: one controller node with authenticationEnabled (init user root), a
NameServer, a broker in controller mode with ACL 2.0, and the endpoint (`InProcessProxy`, as
`ferry proxy --authentication-enabled true --controller-addr ...` runs it) pulling the users and
ACLs from the controller. Raw gRPC calls signed as the 5.x clients sign (MQv2-HMAC-SHA1).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextlib import AsyncExitStack
from pathlib import Path

import grpc
from click.testing import CliRunner

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerConfig
from ferrymq.cmd.proxy import InProcessProxy, proxy_command
from ferrymq.cmd.servers import _start_proxy
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.proxy.auth import call_host
from ferrymq.proxy.stubs import load
from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import Credentials, Perm
from ferrymq.security.acl2 import (
    Acl,
    AuthState,
    PolicyEntry,
    PolicyType,
    User,
    UserStatus,
    UserType,
)
from ferrymq.security.aclcredentials import install_credentials
from ferrymq.security.grpcacl import decide_grpc2
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

from ..integration.remoting import create_topic, send
from ..integration.test_acl2_controller import (
    ALICE,
    ROOT,
    _admin,
    _broker_config,
    _leader,
    _Node,
    _until,
)
from . import raw
from .test_acl import _send, _signed


@dataclasses.dataclass(frozen=True)
class _Cluster:
    config: BrokerConfig
    broker: Broker
    root: RpcClient
    proxy: InProcessProxy
    grpc: str
    remoting: str


async def _cluster(tmp_path: Path, stack: AsyncExitStack) -> _Cluster:
    """A controller (init user root), a NameServer, a broker and the endpoint, on `stack`."""
    node = _Node("n1", tmp_path)
    controller = await node.listen()
    stack.push_async_callback(node.stop)
    await node.start({"n1": controller})
    await _until(lambda: _leader({"n1": node}) is not None, "a controller leader")
    namesrv = NameServer(NamesrvConfig(listen_port=0, scan_interval=0.2))
    await namesrv.start()
    stack.push_async_callback(namesrv.close)
    config = _broker_config(tmp_path, "broker-a", controller, namesrv.address)
    broker = Broker(config)
    await broker.start()
    stack.push_async_callback(broker.close)
    await _until(lambda: broker.state.is_master and not broker.fenced, "a master")
    root = await stack.enter_async_context(RpcClient(credentials=ROOT))
    for topic in ("open", "secret"):
        await create_topic(root, broker.address, topic, queues=1)
    proxy = InProcessProxy(
        namesrv.address,
        grpc_port=0,
        remoting_port=0,
        controllers=[controller],
        authorization=True,
    )
    stack.push_async_callback(proxy.close)
    await proxy.start()
    assert proxy.endpoint is not None
    assert proxy.relay is not None
    return _Cluster(config, broker, root, proxy, proxy.endpoint.address, proxy.relay.address)


async def test_endpoint_checks_the_controllers_users_signatures_and_acls(tmp_path: Path) -> None:
    v2 = load()
    install_credentials(ROOT)  # every server's own calls, the endpoint's too, sign as root
    try:
        async with asyncio.timeout(60), AsyncExitStack() as stack:
            cluster = await _cluster(tmp_path, stack)
            config, broker, root = cluster.config, cluster.broker, cluster.root
            proxy = cluster.proxy
            assert proxy.endpoint is not None
            assert proxy.relay is not None
            channel = await stack.enter_async_context(
                grpc.aio.insecure_channel(proxy.endpoint.address)
            )
            grpc_send = raw.rpc(channel, v2, "SendMessage")
            alice = _signed("alice", "alice-pw")
            unknown = await grpc_send(_send(v2, "open"), metadata=alice, timeout=10)
            assert unknown.status.code == 40100, unknown.status  # not created yet
            assert "User:alice is not found" in unknown.status.message

            # made after the endpoint started: it pulls them within a second or so
            await _admin(
                root,
                broker.address,
                RequestCode.AUTH_CREATE_USER,
                {"username": "alice", "password": "alice-pw"},
            )
            await _admin(
                root,
                broker.address,
                RequestCode.AUTH_CREATE_ACL,
                {"subject": "User:alice", "policies": [{"entries": [
                    {"resource": "Topic:open", "actions": ["Pub"], "decision": "Allow"},
                    {"resource": "Topic:secret", "actions": ["All"], "decision": "Deny"},
                ]}]},
            )  # fmt: skip
            users = proxy.users
            assert users is not None
            await _until(lambda: "User:alice" in users.state.acls, "the endpoint pulled alice", 10)
            ok = await grpc_send(_send(v2, "open"), metadata=alice, timeout=10)
            assert ok.status.code == v2.code("OK"), ok.status
            denied = await grpc_send(_send(v2, "secret"), metadata=alice, timeout=10)
            assert denied.status.code == v2.code("FORBIDDEN") == 40300, denied.status
            assert "Topic:secret" in denied.status.message
            wrong = _signed("alice", "not-her-password")
            refused = await grpc_send(_send(v2, "open"), metadata=wrong, timeout=10)
            assert refused.status.code == v2.code("UNAUTHORIZED"), refused.status
            assert "check signature failed for User:alice" in refused.status.message
            unsigned = await grpc_send(_send(v2, "open"), timeout=10)
            assert unsigned.status.code == 40100, unsigned.status

            # a controller-mode broker's enableProxy endpoint: the same, with the broker's keys
            in_broker = await _start_proxy(
                dataclasses.replace(
                    config, enable_proxy=True, grpc_server_port=0, remoting_listen_port=-1
                )
            )
            stack.push_async_callback(in_broker.close)
            assert in_broker.endpoint is not None
            async with grpc.aio.insecure_channel(in_broker.endpoint.address) as its:
                its_send = raw.rpc(its, v2, "SendMessage")
                ok = await its_send(_send(v2, "open"), metadata=alice, timeout=10)
                assert ok.status.code == v2.code("OK"), ok.status
                denied = await its_send(_send(v2, "secret"), metadata=alice, timeout=10)
                assert denied.status.code == 40300, denied.status

            # the remoting port: Acl2Guard on the same users
            async with RpcClient(credentials=ALICE) as as_alice:
                sent = await send(as_alice, proxy.relay.address, "open", b"via remoting")
                assert sent.code == ResponseCode.SUCCESS, sent.remark
                no = await send(as_alice, proxy.relay.address, "secret", b"no")
                assert no.code == ResponseCode.NO_PERMISSION, no.remark
            install_credentials(None)
            anonymous = RpcClient()
            install_credentials(ROOT)
            async with anonymous:
                route = RemotingCommand(
                    code=RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "open"}
                )
                answer = await anonymous.call(proxy.relay.address, route, 5)
                assert answer.code == ResponseCode.NO_PERMISSION, answer.remark
    finally:
        install_credentials(None)


async def test_source_ip_blocks_of_policies_hold_on_both_ports(tmp_path: Path) -> None:
    """A policy's sourceIps decide on the client's peer address (127.0.0.1 here), as on a broker.

    `near` may publish from 127.0.0.0/24, `far` only from 127.0.1.0/24 (never connected from).
    """
    v2 = load()
    install_credentials(ROOT)
    try:
        async with asyncio.timeout(60), AsyncExitStack() as stack:
            cluster = await _cluster(tmp_path, stack)
            for name, block in (("near", "127.0.0.0/24"), ("far", "127.0.1.0/24")):
                await _admin(
                    cluster.root,
                    cluster.broker.address,
                    RequestCode.AUTH_CREATE_USER,
                    {"username": name, "password": f"{name}-pw"},
                )
                await _admin(
                    cluster.root,
                    cluster.broker.address,
                    RequestCode.AUTH_CREATE_ACL,
                    {"subject": f"User:{name}", "policies": [{"entries": [
                        {"resource": "Topic:open", "actions": ["Pub"], "decision": "Allow",
                         "sourceIps": [block]},
                    ]}]},
                )  # fmt: skip
            users = cluster.proxy.users
            assert users is not None
            await _until(lambda: "User:far" in users.state.acls, "the endpoint pulled far", 10)
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(cluster.grpc))
            grpc_send = raw.rpc(channel, v2, "SendMessage")
            near = await grpc_send(
                _send(v2, "open"), metadata=_signed("near", "near-pw"), timeout=10
            )
            assert near.status.code == v2.code("OK"), near.status
            far = await grpc_send(_send(v2, "open"), metadata=_signed("far", "far-pw"), timeout=10)
            assert far.status.code == 40300, far.status
            assert "Topic:open" in far.status.message
            for name, code in (("near", ResponseCode.SUCCESS), ("far", ResponseCode.NO_PERMISSION)):
                async with RpcClient(credentials=Credentials(name, f"{name}-pw")) as client:
                    sent = await send(client, cluster.remoting, "open", b"from 127.0.0.1")
                    assert sent.code == code, (name, sent.remark)
    finally:
        install_credentials(None)


def test_acl2_without_controllers_is_refused() -> None:
    runner = CliRunner()
    result = runner.invoke(
        proxy_command, ["--namesrv", "127.0.0.1:1", "--authentication-enabled", "true"]
    )
    assert result.exit_code == 2, result.output
    assert "needs --controller-addr" in result.output
    result = runner.invoke(
        proxy_command, ["--namesrv", "127.0.0.1:1", "--authorization-enabled", "true"]
    )
    assert result.exit_code == 2
    assert "needs --authentication-enabled true" in result.output


def test_the_signed_date_window_is_set_by_a_flag(tmp_path: Path) -> None:
    """`--auth-max-clock-skew-seconds` must be > 0; `InProcessProxy` hands it to the guard."""
    result = CliRunner().invoke(
        proxy_command, ["--namesrv", "127.0.0.1:1", "--auth-max-clock-skew-seconds", "0"]
    )
    assert result.exit_code == 2, result.output
    assert "--auth-max-clock-skew-seconds" in result.output
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text("accounts: [{accessKey: client-v5, secretKey: sk-secret}]\n")
    proxy = InProcessProxy("127.0.0.1:1", grpc_port=0, acl_file=acl_file, max_clock_skew=60)
    assert proxy.endpoint is not None
    assert proxy.endpoint.guard is not None
    assert proxy.endpoint.guard.max_clock_skew == 60


def test_decide_grpc2_rules() -> None:
    """The pure decision: a disabled user, QueryRoute's PUB-or-SUB, Super, authorization off."""
    sub_only = PolicyEntry.of("Topic:t", ["Sub"])
    state = AuthState(
        {
            "bob": User("bob", "pw"),
            "off": User("off", "pw", status=UserStatus.DISABLE),
            "su": User("su", "pw", UserType.SUPER),
        },
        {"User:bob": Acl("User:bob", {PolicyType.CUSTOM: (sub_only,)})},
    )

    def decide(user: str, resource: str, perm: Perm, authorization: bool = True) -> str | None:
        refusal = decide_grpc2(
            state,
            metadata={k.lower(): v for k, v in _signed(user, "pw")},
            host="127.0.0.1",
            resources=lambda: [(resource, perm)],
            now=time.time(),
            authorization=authorization,
        )
        return None if refusal is None else refusal.status

    assert decide("off", "t", Perm.SUB) == "UNAUTHORIZED"
    assert decide("bob", "t", Perm.ANY) is None  # QueryRoute: Sub is enough
    assert decide("bob", "t", Perm.PUB) == "FORBIDDEN"
    assert decide("bob", "t", Perm.PUB, authorization=False) is None
    assert decide("bob", "%RETRY%g", Perm.SUB) == "FORBIDDEN"  # no policy on Group:g
    assert decide("su", "other", Perm.PUB) is None


def test_percent_encoded_ipv6_peers_meet_source_blocks() -> None:
    """grpcio's `ipv6:%5B::1%5D:port` peer is ::1 for sourceIps, in an Allow and in a Deny."""
    assert call_host("ipv4:127.0.0.1:5000") == "127.0.0.1"
    assert call_host("ipv6:[::1]:5") == call_host("ipv6:%5B::1%5D:54621") == "::1"
    entries = (
        PolicyEntry.of("Topic:t", ["Pub"], source_ips=["::1/128"]),
        PolicyEntry.of("Topic:u", ["Pub"], "Deny", source_ips=["::1"]),
        PolicyEntry.of("Topic:*", ["Pub"]),
    )
    state = AuthState(
        {"v6": User("v6", "pw")}, {"User:v6": Acl("User:v6", {PolicyType.CUSTOM: entries})}
    )

    def decide(topic: str) -> str | None:
        refusal = decide_grpc2(
            state,
            metadata={k.lower(): v for k, v in _signed("v6", "pw")},
            host=call_host("ipv6:%5B::1%5D:54621"),
            resources=lambda: [(topic, Perm.PUB)],
            now=time.time(),
        )
        return None if refusal is None else refusal.status

    assert decide("t") is None
    assert decide("u") == "FORBIDDEN"  # undecoded, the Deny would not match and Topic:* allow
