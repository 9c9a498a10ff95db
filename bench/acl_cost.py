"""What ACL 1.0 costs a send, per request and per side, counted in-process (issue 23).

Each line is the CPU (`time.process_time`, this process only, so other processes' load does not
add to it) of one step over `--requests` SEND_MESSAGE_V2 requests as the SDK's producer builds
them (fields `a`..`i`, a 100 B body), the best of `--repeats` passes, in microseconds a request:

- client: signing (`acl.sign`, on a fresh copy of the fields, as the SDK signs each request) and
  the frame encode with and without the two added fields (AccessKey, Signature);
- broker: the frame decode with and without them, and the guard's whole check
  (`AclGuard.check`: the account, the signature, the admin flag, the topic's perm), then the
  guard in front of a handler that does nothing against that handler alone (what wrapping adds).

Added per request = sign + (encode signed - encode plain) on the client, check + (decode signed -
decode plain) + (guarded call - bare call) on the broker.

`--steps-callgrind N` counts instructions of the two ACL steps alone instead: this script runs
itself under callgrind once with 1 and once with 3 passes of N requests over `acl.sign` (client:
a fresh copy of the fields, made before the passes) and over `AclGuard.check` (broker); the
difference over 2N is each step's instructions a call, the setup cancelled out (with `--old-src
DIR`, the same for the code under DIR).

`--callgrind SENDS` counts a real broker process instead: a plain broker and an `aclEnable` one
(and with `--old-src DIR`, an `aclEnable` broker running the `ferrymq` package under DIR, e.g. an
older commit's `src` from `git archive`) each run under valgrind's callgrind, instrumentation
off until a warm-up of 200 sends is done, then on for exactly SENDS acknowledged SDK sends
(`--window` in flight, signed for the ACL brokers) counted with `callgrind_control`, as
bench/metrics_cost.py does: instructions per send, which the machine's load does not change. The
sides alternate over `--rounds`. Nothing is asserted; docs/benchmarks.md ("Security: ACL against
plain") has the commands and the numbers.

    .venv/bin/python bench/acl_cost.py [--requests 50000] [--repeats 5] [--size 100] [--json]
    .venv/bin/python bench/acl_cost.py --callgrind 4000 [--rounds 2] [--window 16]
        [--old-src DIR]
    .venv/bin/python bench/acl_cost.py --steps-callgrind 2000 [--old-src DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from callgrind import count_sends, valgrind

from ferrymq.client.admin import AdminClient
from ferrymq.client.producer import Producer
from ferrymq.cmd.local import FERRY, spawn
from ferrymq.rpc.client import RpcClient
from ferrymq.security.acl import Credentials, sign
from ferrymq.security.aclguard import AclFile, AclGuard
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import ROCKETMQ_VERSION, RemotingCommand, decode_frame, encode_frame

_ACL = """accounts:
- {accessKey: bench-admin, secretKey: bench-admin-secret, admin: true}
- {accessKey: bench-producer, secretKey: bench-producer-secret, defaultTopicPerm: PUB}
"""
_CREDENTIALS = Credentials("bench-producer", "bench-producer-secret")
_ADMIN = Credentials("bench-admin", "bench-admin-secret")


class _Conn:
    peer = "127.0.0.1:40000"


def _fields(n: int) -> dict[str, str]:
    """SEND_MESSAGE_V2's fields as `Producer._request` writes them (a different time each)."""
    return {
        "a": "bench-producer",
        "b": "Bench100",
        "c": "TBW102",
        "d": "4",
        "e": str(n % 4),
        "f": "0",
        "g": str(1_764_140_000_000 + n),
        "h": "0",
        "i": f"UNIQ_KEY\x01AC11000100002A9F00000000{n:08X}\x02WAIT\x01true\x02",
    }


def _best(step: Callable[[], None], repeats: int, requests: int) -> float:
    """Microseconds of CPU a request: the best of `repeats` passes of `step` (one pass)."""
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        step()
        best = min(best, time.process_time() - started)
    return best / requests * 1e6


def measure(requests: int, repeats: int, size: int) -> dict[str, float]:
    """Each step's microseconds a request (see the module)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plain_acl.yml"
        path.write_text(_ACL)
        return _measure(AclFile(path), requests, repeats, size)


def _measure(acl: AclFile, requests: int, repeats: int, size: int) -> dict[str, float]:
    body = os.urandom(size)
    plain = [_fields(n) for n in range(requests)]
    signed = [dict(f) for f in plain]
    for fields in signed:
        sign(fields, body, _CREDENTIALS, ROCKETMQ_VERSION)
    code = RequestCode.SEND_MESSAGE_V2
    plain_cmds = [RemotingCommand(code, ext_fields=f, body=body) for f in plain]
    signed_cmds = [RemotingCommand(code, ext_fields=f, body=body) for f in signed]
    plain_frames = [encode_frame(c)[4:] for c in plain_cmds]
    signed_frames = [encode_frame(c)[4:] for c in signed_cmds]
    decoded = [decode_frame(f) for f in signed_frames]

    async def nothing(conn: _Conn, request: RemotingCommand) -> None:
        return None

    guard: AclGuard[_Conn, None] = AclGuard(nothing, acl, "bench")
    conn = _Conn()

    def calling(handler: Callable[[_Conn, RemotingCommand], Any]) -> Callable[[], None]:
        def step() -> None:
            for request in decoded:
                coro = handler(conn, request)
                try:  # noqa: SIM105 - contextlib.suppress would add its own cost
                    coro.send(None)
                except StopIteration:
                    pass

        return step

    def each(function: Callable[[Any], object], items: list[Any]) -> Callable[[], None]:
        def step() -> None:
            for item in items:  # nothing kept: no garbage collection inside the timing
                function(item)

        return step

    def check(request: RemotingCommand) -> None:
        if guard.check(conn, request) is not None:
            raise AssertionError("the bench request was refused")

    steps: dict[str, Callable[[], None]] = {
        "client: fields copy (subtracted from sign)": each(dict, plain),
        "client: sign": each(lambda f: sign(dict(f), body, _CREDENTIALS, ROCKETMQ_VERSION), plain),
        "client: encode plain": each(encode_frame, plain_cmds),
        "client: encode signed": each(encode_frame, signed_cmds),
        "broker: decode plain": each(decode_frame, plain_frames),
        "broker: decode signed": each(decode_frame, signed_frames),
        "broker: check": each(check, decoded),
        "broker: bare handler call": calling(nothing),
        "broker: guarded handler call": calling(guard),
    }
    out = {name: round(_best(step, repeats, requests), 3) for name, step in steps.items()}
    out["client: added"] = round(
        out["client: sign"]
        - out["client: fields copy (subtracted from sign)"]
        + out["client: encode signed"]
        - out["client: encode plain"],
        3,
    )
    out["broker: added"] = round(
        out["broker: guarded handler call"]
        - out["broker: bare handler call"]
        + out["broker: decode signed"]
        - out["broker: decode plain"],
        3,
    )
    return out


def _run_step(step: str, passes: int, requests: int) -> None:
    """`passes` passes of `step` (sign or check) over `requests` requests (see the module)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plain_acl.yml"
        path.write_text(_ACL)
        acl = AclFile(path)
    body = bytes(range(100))
    plain = [_fields(n) for n in range(requests)]
    copies = [[dict(f) for f in plain] for _ in range(3)]  # as many whatever `passes` is
    signed = [dict(f) for f in plain]
    for fields in signed:
        sign(fields, body, _CREDENTIALS, ROCKETMQ_VERSION)
    code = RequestCode.SEND_MESSAGE_V2
    frames = [encode_frame(RemotingCommand(code, ext_fields=f, body=body))[4:] for f in signed]
    decoded = [decode_frame(f) for f in frames]

    async def nothing(conn: _Conn, request: RemotingCommand) -> None:
        return None

    guard: AclGuard[_Conn, None] = AclGuard(nothing, acl, "bench")
    conn = _Conn()
    if guard.check(conn, decoded[0]) is not None:  # warm: imports, caches
        raise AssertionError("the bench request was refused")
    for number in range(passes):
        if step == "sign":
            for fields in copies[number]:
                sign(fields, body, _CREDENTIALS, ROCKETMQ_VERSION)
        else:
            for request in decoded:
                guard.check(conn, request)


def _dump_total(dump: Path) -> int:
    """A callgrind dump's `totals:` (all instructions of the run)."""
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


def _steps_callgrind(requests: int, old_src: str | None) -> dict[str, dict[str, int]]:
    """Instructions a call of sign and of check, by callgrind runs of 3 passes less 1."""
    out: dict[str, dict[str, int]] = {}
    for name, src in [("current", None), ("old", old_src)]:
        if name == "old" and src is None:
            continue
        env = {**os.environ, **({"PYTHONPATH": src} if src else {})}
        with tempfile.TemporaryDirectory() as tmp:
            counts: dict[str, int] = {}
            for step in ("sign", "check"):
                totals = []
                for passes in (1, 3):
                    dump = Path(tmp) / f"{step}-{passes}.callgrind"
                    command = [
                        "valgrind", "--tool=callgrind", f"--callgrind-out-file={dump}",
                        sys.executable, __file__, "--step", step, "--passes", str(passes),
                        "--requests", str(requests),
                    ]  # fmt: skip
                    subprocess.run(command, check=True, env=env, capture_output=True, timeout=900)
                    totals.append(_dump_total(dump))
                counts[step] = round((totals[1] - totals[0]) / (2 * requests))
        out[name] = counts
    return out


async def _counted_broker(
    workdir: Path, name: str, acl: bool, src: str | None, args: argparse.Namespace
) -> int:
    """Instructions one broker runs for exactly `args.callgrind` acknowledged sends."""
    namesrv = await spawn(
        f"{name}-namesrv", ["namesrv", "--listen", "127.0.0.1:0", "--log-level", "WARNING"], workdir
    )
    ready, dump = workdir / f"{name}.ready.json", workdir / f"{name}.callgrind"
    acl_file = workdir / "plain_acl.yml"
    acl_file.write_text(_ACL)
    flags = ["--acl-enable", "true", "--acl-file", str(acl_file)] if acl else []
    env = {**os.environ, **({"PYTHONPATH": src} if src else {})}
    with (workdir / f"{name}.log").open("ab") as log:
        broker = await asyncio.create_subprocess_exec(
            *valgrind(dump),
            *FERRY, "broker", "--listen", "127.0.0.1:0", "--namesrv", namesrv.addr,
            "--store-dir", str(workdir / f"{name}-store"), "--log-level", "WARNING",
            "--mapped-file-size-commit-log", str(64 * 1024 * 1024), *flags,
            "--ready-file", str(ready),
            stdout=asyncio.subprocess.DEVNULL, stderr=log, env=env, cwd=workdir,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # valgrind without instrumentation: ~10 s here
        while not ready.exists():
            if broker.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name}'s broker did not start under valgrind: {workdir}")
            await asyncio.sleep(0.1)
        async with (
            RpcClient(credentials=_ADMIN if acl else None) as admin_rpc,
            AdminClient(namesrv.addr, rpc=admin_rpc) as admin,
        ):
            await admin.create_topic("Cost", queues=4)
            while await admin.route("Cost") is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("the topic never reached the NameServer")
                await asyncio.sleep(0.1)
        credentials = _CREDENTIALS if acl else None
        async with Producer(
            namesrv.addr, f"{name}-producer", send_timeout=60, credentials=credentials
        ) as producer:
            payload = os.urandom(args.size)

            async def send() -> object:
                return await producer.send("Cost", payload)

            for _ in range(200):  # routes, connections, the first send's imports and caches
                await send()
            return await count_sends(broker.pid, dump, send, args.callgrind, args.window)
    finally:
        if broker.returncode is None:
            broker.terminate()
            await broker.wait()
        await namesrv.stop()


async def _callgrind(args: argparse.Namespace) -> dict[str, Any]:
    """Instructions per send of each broker side, alternating the order by round."""
    sides: dict[str, tuple[bool, str | None]] = {"plain": (False, None), "acl": (True, None)}
    if args.old_src:
        sides["acl, --old-src"] = (True, args.old_src)
    counts: dict[str, list[float]] = {name: [] for name in sides}
    workdir = Path(tempfile.mkdtemp(prefix="ferrymq-bench-acl-instructions-"))
    try:
        for number in range(args.rounds):
            order = list(sides) if number % 2 == 0 else list(sides)[::-1]
            for name in order:
                acl, src = sides[name]
                label = f"{name.split(',')[0]}{'-old' if src else ''}-{number}"
                total = await _counted_broker(workdir, label, acl, src, args)
                counts[name].append(total / args.callgrind)
                print(f"round {number}: {name}: {total / args.callgrind:,.0f} instructions a send")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    per_send = {name: sum(c) / len(c) for name, c in counts.items()}
    plain = per_send["plain"]
    return {
        "sends": args.callgrind,
        "rounds": args.rounds,
        "instructions_per_send": {k: round(v) for k, v in per_send.items()},
        "per_round": {k: [round(v) for v in c] for k, c in counts.items()},
        "added_over_plain_pct": {
            k: round((v / plain - 1) * 100, 2) for k, v in per_send.items() if k != "plain"
        },
    }


def main() -> None:
    """Parse the flags, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--callgrind", type=int, metavar="SENDS")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--old-src", metavar="DIR")
    parser.add_argument("--steps-callgrind", type=int, metavar="N")
    parser.add_argument("--step", choices=["sign", "check"], help=argparse.SUPPRESS)
    parser.add_argument("--passes", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step is not None:  # one counted run of --steps-callgrind
        _run_step(args.step, args.passes, args.requests)
        return
    if args.steps_callgrind is not None:
        old = os.path.abspath(args.old_src) if args.old_src else None
        print(json.dumps(_steps_callgrind(args.steps_callgrind, old), indent=2))
        return
    if args.callgrind is not None:
        if args.callgrind < args.window:
            parser.error("--callgrind needs at least --window sends")
        if shutil.which("valgrind") is None:
            sys.exit("--callgrind needs valgrind (Debian's valgrind package)")
        if args.old_src:
            args.old_src = os.path.abspath(args.old_src)
        print(json.dumps(asyncio.run(_callgrind(args)), indent=2))
        return
    result = measure(args.requests, args.repeats, args.size)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, micros in result.items():
        print(f"{name:45s} {micros:8.2f} us")


if __name__ == "__main__":
    main()
