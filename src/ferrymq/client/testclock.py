"""Moving a server's clock from a test (TEST_CLOCK, `wire/testclock.py`): bump, strobe, reset.

For clock-fault tests and the chaos harness's ClockNemesis only; servers refuse it unless they
were started with `FERRYMQ_TEST_CLOCK=1`.
"""

from __future__ import annotations

from ferrymq.errors import RemoteError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.testclock import ClockFault, ClockFaultRequestHeader, ClockFaultResponseHeader

__all__ = ["ClockFault", "ClockFaultResponseHeader", "move_clock"]


async def move_clock(
    rpc: RpcClient,
    address: str,
    action: ClockFault,
    *,
    delta_ms: int | None = None,
    period_ms: int | None = None,
    duration_ms: int | None = None,
    timeout: float = 3.0,
) -> ClockFaultResponseHeader:
    """Bump, strobe or reset the clock of the server at `address`; returns its clock now.

    Raises:
        RemoteError: the server refused (NO_PERMISSION: test clock not enabled there;
            INVALID_PARAMETER: a bad argument).
        RpcError: not sent, or no answer.
    """
    header = ClockFaultRequestHeader(
        action=action, delta_ms=delta_ms, period_ms=period_ms, duration_ms=duration_ms
    )
    request = RemotingCommand(code=RequestCode.TEST_CLOCK, ext_fields=to_ext_fields(header))
    response = await rpc.call(address, request, timeout)
    if response.code != ResponseCode.SUCCESS:
        try:
            name = ResponseCode(response.code).name
        except ValueError:
            name = None
        raise RemoteError(response.code, response.remark, code_name=name)
    return from_ext_fields(ClockFaultResponseHeader, response.ext_fields)
