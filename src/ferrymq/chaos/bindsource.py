"""Run a `ferry` command with every outgoing TCP connection bound to one source address.

`python -m ferrymq.chaos.bindsource connect worker ...` with `FERRYMQ_CHAOS_SOURCE_IP=127.0.0.15`
runs `ferry connect worker ...` on an event loop whose `create_connection` binds to that address
whenever the caller names none. A Connect worker's clients (broker RPC, forwarded REST calls
through httpx/anyio) do not bind a source address themselves, so on the chaos loopback they
would all come from 127.0.0.1 (the NameServer's address) and a partition could not single the
worker out; bound, the worker is cut off like any other node. Only 127.x destinations are bound
(the whole run lives on the namespace's loopback).

The command runs as `python -m ferrymq.cmd.ferry` would (`runpy`): the harness starts it as a
process, like every other node.
"""

from __future__ import annotations

import asyncio
import os
import runpy
import sys
from collections.abc import Callable
from typing import Any, Final

from ferrymq.rpc import loop as rpc_loop

__all__ = ["SOURCE_IP_ENV", "bound_loop_factory", "main"]

SOURCE_IP_ENV: Final = "FERRYMQ_CHAOS_SOURCE_IP"


def bound_loop_factory(
    factory: Callable[[], asyncio.AbstractEventLoop], source_ip: str
) -> Callable[[], asyncio.AbstractEventLoop]:
    """A loop factory whose loops bind outgoing 127.x connections to `source_ip`."""

    def new_loop() -> asyncio.AbstractEventLoop:
        loop = factory()
        create_connection = loop.create_connection

        async def bound_create_connection(
            protocol_factory: Any, host: Any = None, port: Any = None, **kwargs: Any
        ) -> Any:
            if (
                kwargs.get("local_addr") is None
                and kwargs.get("sock") is None
                and isinstance(host, str)
                and host.startswith("127.")
            ):
                kwargs["local_addr"] = (source_ip, 0)
            return await create_connection(protocol_factory, host, port, **kwargs)

        loop.create_connection = bound_create_connection  # type: ignore[method-assign]
        return loop

    return new_loop


def main() -> None:
    """Patch the process's loop factory, then run `ferry` with this process's arguments."""
    source_ip = os.environ.get(SOURCE_IP_ENV, "")
    if source_ip:
        rpc_loop.new_event_loop = bound_loop_factory(rpc_loop.new_event_loop, source_ip)
    sys.argv = ["ferry", *sys.argv[1:]]
    runpy.run_module("ferrymq.cmd.ferry", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
