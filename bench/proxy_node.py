"""The official Node.js 5.x client through the gRPC endpoint beside ferrymq's SDK (issue 21).

    .venv/bin/python bench/proxy_node.py [--messages 2000] [--rounds 3] [--size 100]

A second official 5.x client beside `ferry bench proxy`'s Python one, to tell the client's
cost from the endpoint's: same cluster shape (a NameServer, one broker, the endpoint as
processes), same modes (sync sends, 64 in flight, receive + one ack at a time), and the CPU per
message of the client (`process.cpuUsage` in node), the endpoint and the broker over the timed
part. Needs `node` (>= 16.19) and `npm`; the client (npm `rocketmq-client-nodejs` 1.0.8) is
installed once under ~/.cache/ferrymq/rmq5-node.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ferrymq.client.admin import AdminClient
from ferrymq.cmd.bench_proxy import CpuMeter, _sdk_receive, _sdk_send, metered_worker
from ferrymq.cmd.up import ProcessCluster, UpConfig

NODE_CLIENT = "rocketmq-client-nodejs@1.0.8"
NODE_HOME = Path.home() / ".cache" / "ferrymq" / "rmq5-node"
WORKER = Path(__file__).with_name("proxy_node_worker.js")


def node_modules() -> Path:
    """The client's node_modules, installed with npm when missing."""
    modules = NODE_HOME / "node_modules"
    if not (modules / "rocketmq-client-nodejs").is_dir():
        NODE_HOME.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "init", "-y"], cwd=NODE_HOME, check=True, capture_output=True)
        subprocess.run(["npm", "install", NODE_CLIENT], cwd=NODE_HOME, check=True)
    return modules


async def node(meter: CpuMeter, *args: str) -> dict[str, Any]:
    """Run the node worker, metered (`metered_worker`)."""
    env = {**os.environ, "NODE_PATH": str(node_modules())}
    return await metered_worker(["node", str(WORKER), *args], meter, env)


async def run(messages: int, rounds: int, size: int) -> dict[str, Any]:
    data_dir = Path(tempfile.mkdtemp(prefix="ferrymq-bench-proxy-node-"))
    cluster = ProcessCluster(
        UpConfig(data_dir=data_dir, replicas=1, controllers=0, proxy=True, segment_bytes=256 << 20)
    )
    rows: dict[tuple[str, str], list[tuple[float, dict[str, float]]]] = {}
    try:
        await cluster.start()
        assert cluster.proxy is not None
        endpoint = str(cluster.proxy.info["grpc"])
        namesrv = cluster.namesrv_addr
        (broker,) = cluster.brokers.values()
        servers = {"endpoint": cluster.proxy.pid, "broker": broker.pid}
        async with AdminClient(namesrv) as admin:
            for round_ in range(rounds):
                for window in (1, 64):
                    mode = "send" if window == 1 else f"send w{window}"
                    tag = f"{round_}w{window}"
                    sdk_topic, node_topic = f"NodeBenchSdk{tag}", f"NodeBench{tag}"
                    for topic in (sdk_topic, node_topic):
                        await admin.create_topic(topic, queues=4)
                    await asyncio.sleep(1.0)
                    meter = CpuMeter(servers)
                    rate = await _sdk_send(namesrv, sdk_topic, messages, size, window, meter)
                    rows.setdefault(("ferrymq-sdk", mode), []).append(
                        (rate, meter.per_message_us(messages))
                    )
                    meter = CpuMeter(servers)
                    sent = await node(
                        meter, "send", endpoint, node_topic, str(messages), str(size), str(window)
                    )
                    if sent["failed"]:
                        raise RuntimeError(f"node client: {sent['failed']} sends failed")
                    rows.setdefault(("rocketmq-5.x-nodejs", mode), []).append(
                        (messages / sent["seconds"], meter.per_message_us(messages))
                    )
                    if window != 1:
                        continue
                    total = messages + 20
                    meter = CpuMeter(servers)
                    rate = await _sdk_receive(namesrv, sdk_topic, f"g{sdk_topic}", total, meter)
                    rows.setdefault(("ferrymq-sdk", "receive+ack"), []).append(
                        (rate, meter.per_message_us(total))
                    )
                    meter = CpuMeter(servers)
                    got = await node(
                        meter, "receive", endpoint, node_topic, f"g{node_topic}", str(total)
                    )
                    if got["received"] < total:
                        raise RuntimeError(f"node client received {got['received']} of {total}")
                    rows.setdefault(("rocketmq-5.x-nodejs", "receive+ack"), []).append(
                        (total / got["seconds"], meter.per_message_us(total))
                    )
    finally:
        await cluster.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    out = []
    for (system, mode), measured in rows.items():
        rates = [rate for rate, _ in measured]
        cpu = {
            name: round(statistics.median(c[name] for _, c in measured), 1)
            for name in measured[0][1]
        }
        out.append(
            {
                "system": system,
                "mode": mode,
                "size": size,
                "msgs_per_s": round(statistics.median(rates), 1),
                "rounds": [round(r, 1) for r in rates],
                "cpu_us_per_msg": cpu,
            }
        )
    by_key: dict[tuple[str, str], float] = {
        (str(r["system"]), str(r["mode"])): float(str(r["msgs_per_s"])) for r in out
    }
    ratios = {
        mode: round(rate / by_key[("ferrymq-sdk", mode)], 3)
        for (system, mode), rate in by_key.items()
        if system != "ferrymq-sdk"
    }
    return {"benchmark": "proxy-node", "rows": out, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args.messages, args.rounds, args.size))))


if __name__ == "__main__":
    main()
