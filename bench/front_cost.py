"""What the gRPC port's front (proxy/front.py) costs a call, counted in instructions (issue 21).

One process (on uvloop, as `ferry proxy`) runs a `GrpcEndpoint` (no cluster: Heartbeat needs
none) and a grpc.aio client in the same event loop, under valgrind's callgrind with
instrumentation off. After a warm-up of 200 calls on each path it counts exactly `--calls`
sequential Heartbeat calls through the front (the public port) and as many straight to grpcio's
own plain listener behind it (the same server, no front), each between `callgrind_control
--zero/--instr=on` and `--dump`; the paths alternate over `--rounds`. Instructions per call,
client and server together, user space only (the kernel's work for the extra loopback hop is not
counted): the machine's load does not change them.
Nothing is asserted; docs/benchmarks.md ("RocketMQ 5 endpoint") has the command and numbers.

    .venv/bin/python bench/front_cost.py [--calls 2000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from callgrind import control, dump_total, valgrind

_UNDER: str = "FERRY_FRONT_COST_CHILD"


async def _child(calls: int, rounds: int, dump: Path) -> None:
    import grpc

    from ferrymq.proxy.server import GrpcEndpoint
    from ferrymq.proxy.stubs import SERVICE, load

    v2 = load()
    endpoint = GrpcEndpoint("127.0.0.1:9")
    await endpoint.start()
    paths = {"front": endpoint.address, "grpcio": endpoint.upstream["plain"]}
    channels = {name: grpc.aio.insecure_channel(address) for name, address in paths.items()}
    stubs: dict[str, Any] = {
        name: channel.unary_unary(
            f"/{SERVICE}/Heartbeat",
            request_serializer=v2.HeartbeatRequest.SerializeToString,
            response_deserializer=v2.HeartbeatResponse.FromString,
        )
        for name, channel in channels.items()
    }
    request = v2.HeartbeatRequest()
    try:
        for stub in stubs.values():
            for _ in range(200):
                await stub(request, timeout=60)
        dumps = 0
        for _ in range(rounds):
            for name, stub in stubs.items():
                await asyncio.to_thread(control, os.getpid(), "--zero")
                await asyncio.to_thread(control, os.getpid(), "--instr=on")
                for _ in range(calls):
                    await stub(request, timeout=60)
                await asyncio.to_thread(control, os.getpid(), "--dump")
                await asyncio.to_thread(control, os.getpid(), "--instr=off")
                dumps += 1
                total = await asyncio.to_thread(dump_total, Path(f"{dump}.{dumps}"))
                print(f"{name} {total / calls:.0f}", flush=True)
    finally:
        for channel in channels.values():
            await channel.close()
        await endpoint.close(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if os.environ.get(_UNDER):
        import uvloop  # the loop `ferry proxy` and the brokers run on

        uvloop.run(_child(args.calls, args.rounds, Path(os.environ[_UNDER])))
        return
    with tempfile.TemporaryDirectory() as where:
        dump = Path(where) / "callgrind.out"
        command = [*valgrind(dump), sys.executable, __file__,
                   "--calls", str(args.calls), "--rounds", str(args.rounds)]  # fmt: skip
        lines = subprocess.run(
            command, env={**os.environ, _UNDER: str(dump)}, check=True, capture_output=True,
            text=True, timeout=3600,
        ).stdout.split()  # fmt: skip
    per: dict[str, list[int]] = {}
    for name, value in zip(lines[::2], lines[1::2], strict=True):
        per.setdefault(name, []).append(int(value))
    front, bare = min(per["front"]), min(per["grpcio"])
    print(f"instructions a Heartbeat call (client and server), best of {args.rounds} rounds of "
          f"{args.calls}: through the front {front}, straight to grpcio {bare}, "
          f"front adds {front - bare} (+{100 * (front - bare) / bare:.1f} %)")  # fmt: skip
    print(f"rounds: {per}")


if __name__ == "__main__":
    main()
