"""TEST_CLOCK over real sockets: refused (and harmless) unless enabled; bump, strobe, reset; bad
arguments answer INVALID_PARAMETER naming what is wrong."""

from collections.abc import AsyncIterator

import pytest

from ferrymq.client.testclock import ClockFault, move_clock
from ferrymq.clock import CLOCK, Clock
from ferrymq.errors import RemoteError
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.server import Router, RpcServer
from ferrymq.rpc.testclock import serve_test_clock
from ferrymq.testing import LocalCluster
from ferrymq.wire.bodies import ClusterInfo, decode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand


@pytest.fixture
async def enabled() -> AsyncIterator[tuple[str, Clock]]:
    """A server whose TEST_CLOCK is enabled and moves a clock of its own (not the process's)."""
    clock = Clock()
    router = Router("clock test")
    serve_test_clock(router, clock, enabled=True)
    async with RpcServer(router) as server:
        yield server.address, clock


async def test_servers_refuse_the_test_clock_unless_started_with_it_and_keep_serving(
    cluster: LocalCluster, client: RpcClient
) -> None:
    for address in (cluster.namesrv_addr, cluster.broker.address):
        with pytest.raises(RemoteError) as refused:
            await move_clock(client, address, ClockFault.BUMP, delta_ms=60_000)
        assert refused.value.code == ResponseCode.NO_PERMISSION
        assert "FERRYMQ_TEST_CLOCK=1" in refused.value.remark
    assert CLOCK.offset() == 0.0
    response = await client.call(
        cluster.namesrv_addr, RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO), 3
    )
    assert response.code == ResponseCode.SUCCESS
    assert decode_body(response.body, ClusterInfo).broker_addr_table


async def test_bump_strobe_and_reset_move_the_servers_clock(
    enabled: tuple[str, Clock], client: RpcClient
) -> None:
    address, clock = enabled
    answer = await move_clock(client, address, ClockFault.BUMP, delta_ms=-288_000)
    assert (answer.offset_ms, answer.strobing) == (-288_000, False)
    assert clock.offset() == -288.0
    answer = await move_clock(client, address, ClockFault.BUMP, delta_ms=11)
    assert answer.offset_ms == -287_989
    answer = await move_clock(
        client, address, ClockFault.STROBE, delta_ms=5_000, period_ms=60_000, duration_ms=30_000
    )
    assert answer.strobing
    assert clock.is_strobing
    answer = await move_clock(client, address, ClockFault.RESET)
    assert (answer.offset_ms, answer.strobing) == (0, False)
    assert clock.offset() == 0.0


@pytest.mark.parametrize(
    ("ext_fields", "complaint"),
    [
        ({"action": "warp", "deltaMs": "5"}, "action"),
        ({"deltaMs": "5"}, "action"),
        ({"action": "bump"}, "delta_ms is missing"),
        ({"action": "bump", "deltaMs": "soon"}, "deltaMs"),
        ({"action": "bump", "deltaMs": str(10**12)}, "beyond"),
        ({"action": "strobe", "deltaMs": "5", "periodMs": "0", "durationMs": "1000"}, "period"),
        ({"action": "strobe", "deltaMs": "5", "periodMs": "10"}, "duration_ms is missing"),
        ({"action": "strobe", "deltaMs": "5", "periodMs": "10", "durationMs": "-1"}, "lasts"),
    ],
)
async def test_bad_arguments_answer_invalid_parameter_and_change_nothing(
    enabled: tuple[str, Clock], client: RpcClient, ext_fields: dict[str, str], complaint: str
) -> None:
    address, clock = enabled
    clock.bump(1.0)
    request = RemotingCommand(code=RequestCode.TEST_CLOCK, ext_fields=ext_fields)
    response = await client.call(address, request, 3)
    assert response.code == ResponseCode.INVALID_PARAMETER
    assert complaint in (response.remark or "")
    assert clock.offset() == 1.0
    assert not clock.is_strobing
