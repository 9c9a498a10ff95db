"""The `ferry` command: one entry point for servers, tools and benchmarks.

Argument parsing and output only; the work happens in the modules each subcommand calls. Bad usage
prints a one-line error and exits with status 2 (click's convention), never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ferrymq import __version__
from ferrymq.chaos.runner import RunConfig, is_inside, run_inside, run_isolated
from ferrymq.chaos.schedule import SCHEDULES, TOPOLOGIES
from ferrymq.cli.admin import admin_group
from ferrymq.cli.bench import bench_consume, bench_e2e, bench_produce
from ferrymq.cli.connect import connect_group
from ferrymq.cli.duration import Duration
from ferrymq.cli.stream import consume_command, produce_command
from ferrymq.cmd.aclflags import acl_client_options, install_client_credentials
from ferrymq.cmd.bench_broker import (
    BrokerBenchConfig,
    ratios_acl,
    ratios_acl_tls,
    ratios_tls,
    ratios_to_nats,
    run_broker_bench,
)
from ferrymq.cmd.bench_connect import TIMINGS as CONNECT_TIMINGS
from ferrymq.cmd.bench_connect import ConnectBenchConfig, run_connect_bench
from ferrymq.cmd.bench_controller import ControllerBenchConfig, run_controller_bench
from ferrymq.cmd.bench_failover import FailoverBenchConfig, run_failover_bench
from ferrymq.cmd.bench_proxy import bench_proxy_command
from ferrymq.cmd.bench_replication import ReplicationBenchConfig, run_replication_bench
from ferrymq.cmd.bench_replication import ratios as replication_ratios
from ferrymq.cmd.bench_store import CaseResult, StoreBenchConfig, run_store_bench
from ferrymq.cmd.connect import worker_command
from ferrymq.cmd.console import console_command
from ferrymq.cmd.controller import controller_command
from ferrymq.cmd.local import Child
from ferrymq.cmd.measure import Row
from ferrymq.cmd.process import run_until_signal, setup_logging
from ferrymq.cmd.proxy import proxy_command
from ferrymq.cmd.servers import broker_command, namesrv_command
from ferrymq.cmd.tlsflags import client_tls, tls_client_options
from ferrymq.cmd.up import (
    DEFAULT_SEGMENT_BYTES,
    DiskFullError,
    ReadyInfo,
    UpConfig,
    finish_data_dir,
    run_up,
)
from ferrymq.errors import FerryError
from ferrymq.security.tls import TlsSettings, install
from ferrymq.testbugs import BUGS

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ferry")
@tls_client_options
@acl_client_options
def cli(
    tls: bool,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    access_key: str | None,
    secret_key: str | None,
    credentials_file: Path | None,
) -> None:
    """ferrymq: a highly available, RocketMQ-compatible message queue.

    `ferry --tls-ca CA ...` (or FERRY_TLS_CA=CA): every client command connects with TLS.
    `ferry --access-key AK --secret-key SK ...` (or FERRY_ACCESS_KEY/FERRY_SECRET_KEY, or
    --credentials-file): every request is signed for servers with aclEnable=true.
    """
    install(TlsSettings(client=client_tls(tls, tls_ca, tls_cert, tls_key)))
    install_client_credentials(access_key, secret_key, credentials_file)


cli.add_command(namesrv_command)
cli.add_command(broker_command)
cli.add_command(controller_command)
cli.add_command(admin_group)
cli.add_command(produce_command)
cli.add_command(consume_command)
connect_group.add_command(worker_command)
cli.add_command(connect_group)
cli.add_command(console_command)
cli.add_command(proxy_command)


@cli.command("demo")
@click.option(
    "--messages", type=click.IntRange(min=1, max=1_000_000), default=2000, show_default=True
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the servers keep their data and logs (default: a new temporary directory, "
    "removed when the demo passes).",
)
@click.option(
    "--mapped-file-size-commit-log",
    "segment_bytes",
    type=click.IntRange(min=1024 * 1024),
    default=16 * 1024 * 1024,
    show_default=True,
    help="Every broker's commit-log segment size in bytes.",
)
def demo_command(messages: int, data_dir: Path | None, segment_bytes: int) -> None:
    """Run the HA story: produce and consume, kill -9 the master, fail over, report."""
    # imported here: the demo's pipeline needs psycopg (the connect extra), the servers do not
    from ferrymq.cmd.demo import run_demo

    console = Console()
    report = asyncio.run(run_demo(messages, data_dir, console, segment_bytes))
    if not report.ok:
        sys.exit(1)


@cli.command("up")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the servers keep stores and logs; reuse it to restart with the same data "
    "(default: a new temporary directory, removed at exit unless a server failed).",
)
@click.option(
    "--mapped-file-size-commit-log",
    "segment_bytes",
    type=click.IntRange(min=1024 * 1024),
    default=DEFAULT_SEGMENT_BYTES,
    show_default=True,
    help="Every broker's commit-log segment size in bytes (RocketMQ's 1 GiB: 1073741824).",
)
@click.option(
    "--groups",
    type=click.IntRange(min=1, max=26),
    default=1,
    show_default=True,
    help="Broker groups (broker-a, broker-b, ...).",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=1, max=9),
    default=3,
    show_default=True,
    help="Brokers per group (sync replication when > 1).",
)
@click.option(
    "--controllers",
    type=click.IntRange(min=0, max=9),
    default=3,
    show_default=True,
    help="Controller nodes electing masters; 0: classic master/slave with static roles.",
)
@click.option(
    "--embedded-controller",
    is_flag=True,
    help="Run each controller node inside a NameServer instead of as its own process.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port-base",
    type=click.IntRange(min=0, max=65000),
    default=0,
    show_default=True,
    help="NameServer port; brokers take the ports after it, two each. 0: free ports.",
)
@click.option(
    "--flush-disk-type",
    type=click.Choice(["ASYNC_FLUSH", "SYNC_FLUSH"], case_sensitive=False),
    default="ASYNC_FLUSH",
    show_default=True,
)
@click.option(
    "--connect",
    "connect_workers",
    type=click.IntRange(min=0, max=16),
    default=2,
    show_default=True,
    help="Connect workers (REST on free ports; listed in the ready file).",
)
@click.option(
    "--console/--no-console",
    "with_console",
    default=True,
    show_default=True,
    help="Run the web console (ferry console) on a free port; its URL is in the ready file.",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the cluster as JSON here once it serves.",
)
@click.option(
    "--tls",
    "up_tls",
    is_flag=True,
    help="TLS only on every port (Connect's REST API too), certificates from a local CA (its "
    "path: tls_ca in the ready file).",
)
@click.option(
    "--broker-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A RocketMQ broker.conf (key=value) every broker also reads (ferry broker --config); "
    "ferry up's own settings (names, ports, roles, stores) win over it.",
)
def up_command(
    data_dir: Path | None,
    groups: int,
    replicas: int,
    controllers: int,
    embedded_controller: bool,
    host: str,
    port_base: int,
    flush_disk_type: str,
    connect_workers: int,
    with_console: bool,
    ready_file: Path | None,
    segment_bytes: int,
    up_tls: bool,
    broker_config: Path | None,
) -> None:
    """Run a local cluster (controllers, NameServer, brokers, Connect) until Ctrl-C or SIGTERM."""
    config = UpConfig(
        data_dir=data_dir or Path(tempfile.mkdtemp(prefix="ferrymq-up-")),
        console=with_console,
        segment_bytes=segment_bytes,
        groups=groups,
        replicas=replicas,
        controllers=controllers,
        embedded_controller=embedded_controller,
        host=host,
        port_base=port_base,
        flush_disk_type=flush_disk_type.upper(),
        ready_file=ready_file,
        connect=connect_workers,
        tls=up_tls,
        proxy=True,  # with --tls its ports serve the cluster's certificate too
        broker_flags=() if broker_config is None else ("--config", str(broker_config.resolve())),
    )
    console = Console(stderr=True)
    status = 0

    def ready(info: ReadyInfo) -> None:
        table = Table("server", "address", "pid", "data", title=f"ferrymq up ({config.data_dir})")
        for node in info["controllers"]:
            table.add_row(f"controller {node['id']}", node["addr"], str(node["pid"]), "")
        table.add_row("namesrv", info["namesrv"], str(info["namesrv_pid"]), "")
        for broker in info["brokers"]:
            table.add_row(
                f"{broker['broker_name']} ({broker['role']})",
                broker["addr"],
                str(broker["pid"]),
                broker["store_dir"],
            )
        for worker in info["connect"]:
            table.add_row(f"connect {worker['id']}", worker["url"], str(worker["pid"]), "")
        if info["console"]:
            table.add_row("console", info["console"], "", "")
        if info["proxy"]:
            table.add_row("proxy (gRPC, 5.x clients)", info["proxy"], "", "")
            table.add_row("proxy (remoting, 4.x)", str(info["proxy_remoting"]), "", "")
        console.print(table)
        console.print(f"export NAMESRV_ADDR={info['namesrv']}   (Ctrl-C stops everything)")
        if info["tls_ca"]:
            console.print(f"export FERRY_TLS_CA={info['tls_ca']}")
        elif info["proxy_tls_ca"]:
            console.print(f"proxy gRPC: TLS or plain text; TLS trusts {info['proxy_tls_ca']}")
        if info["connect"]:
            urls = ",".join(w["url"] for w in info["connect"])
            console.print(f"export FERRY_CONNECT_URL={urls}")

    def died(child: Child, fatal: bool) -> None:
        then = (
            "stopping the cluster"
            if fatal
            else "the cluster goes on"
            if child.name.startswith("connect-") or child.name == "console"
            else "its group fails over"
        )
        console.print(
            f"[red]{child.name} (pid {child.pid}) exited with {child.process.returncode}; "
            f"{then}; its log: {child.log_path}[/red]"
        )

    async def main(stop: asyncio.Event) -> None:
        nonlocal status
        status = await run_up(config, stop, ready, died)

    own = data_dir is None
    try:
        run_until_signal(main)
    except DiskFullError as exc:
        finish_data_dir(config.data_dir, own=own, ok=True, say=console.print)  # nothing in it
        raise click.ClickException(str(exc)) from None
    except RuntimeError as exc:
        finish_data_dir(config.data_dir, own=own, ok=False, say=console.print)
        raise click.ClickException(str(exc)) from None
    finish_data_dir(config.data_dir, own=own, ok=status == 0, say=console.print)
    sys.exit(status)


@cli.command("chaos")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where history.jsonl, results.json and node logs go (default: a new temporary directory).",
)
@click.option("--seed", type=int, default=1, show_default=True, help="Seeds the schedule and load.")
@click.option(
    "--schedule",
    type=click.Choice(SCHEDULES),
    default="standard",
    show_default=True,
    help="standard: about 5 minutes, every nemesis; smoke: under a minute; soak: rotating "
    "fault mixes for --duration.",
)
@click.option(
    "--topology",
    type=click.Choice(TOPOLOGIES),
    default="controller",
    show_default=True,
    help="controller: 3 controllers elect the master; controller-2groups: the same with two "
    "broker groups; classic: static master/slave roles.",
)
@click.option(
    "--duration",
    type=Duration(min_s=30),
    default=900.0,
    show_default=True,
    help="How long the soak schedule injects faults: seconds, or e.g. 20m, 1h.",
)
@click.option(
    "--bug",
    "bugs",
    multiple=True,
    type=click.Choice(BUGS),
    help="Turn on a test-only broker bug the run must catch (repeatable).",
)
@click.option(
    "--rate", type=click.FloatRange(min=1), default=100.0, show_default=True, help="Sends/s."
)
@click.option("--drain-timeout", type=click.FloatRange(min=1), default=60.0, show_default=True)
@click.option(
    "--converge-timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="How long the healed cluster gets to catch every replica up before the drain.",
)
@click.option(
    "--connect-workers",
    type=click.IntRange(min=0, max=5),
    default=3,
    show_default=True,
    help="Connect workers running the Connect workload (config writes checked like sends; the "
    "schedule hits the workers too); 0: none.",
)
@click.option(
    "--tls",
    "chaos_tls",
    is_flag=True,
    help="Every server and client with TLS only (no Connect workers: the Connect workload has "
    "no TLS yet).",
)
@click.option(
    "--acl",
    "chaos_acl",
    is_flag=True,
    help="ACL on every server (plain_acl.yml of one admin account under OUT/acl); servers, "
    "HA links and the harness sign with it.",
)
def chaos_command(
    out_dir: Path | None,
    seed: int,
    schedule: str,
    topology: str,
    duration: float,
    bugs: tuple[str, ...],
    rate: float,
    drain_timeout: float,
    converge_timeout: float,
    connect_workers: int,
    chaos_tls: bool,
    chaos_acl: bool,
) -> None:
    """Run controllers, 3-replica groups and Connect workers under faults; exit 1 on an anomaly.

    Needs root: the run happens in private network, PID and mount namespaces, on 127.0.0.x.
    """
    config = RunConfig(
        out_dir=(out_dir or Path(tempfile.mkdtemp(prefix="ferrymq-chaos-"))).absolute(),
        seed=seed,
        schedule=schedule,
        bugs=bugs,
        sends_per_second=rate,
        drain_timeout_s=drain_timeout,
        converge_timeout_s=converge_timeout,
        topology=topology,
        duration_s=duration,
        connect_workers=connect_workers,
        tls=chaos_tls,
        acl=chaos_acl,
    )
    if is_inside():
        setup_logging("INFO")
        asyncio.run(run_inside(config))
        return
    console = Console(stderr=True)
    console.print(
        f"ferry chaos: seed {seed}, schedule {schedule}, topology {topology}, "
        f"output {config.out_dir}"
    )
    results = run_isolated(config)
    table = Table("anomaly", "count", title=f"ferry chaos ({config.out_dir})")
    for name, count in results.anomalies.items():
        table.add_row(name, f"[red]{count}[/red]" if count else "0")
    console.print(table)
    console.print(f"operations: {results.operations}")
    console.print(f"faults: {results.faults}")
    console.print(f"stats: {results.stats}")
    if not results.valid:
        console.print(f"[red]anomalies found; see {config.out_dir / 'results.json'}[/red]")
        sys.exit(1)


@cli.group()
def bench() -> None:
    """Measure ferrymq side by side with a baseline; prints a JSON summary with --json."""


bench.add_command(bench_produce)
bench.add_command(bench_consume)
bench.add_command(bench_e2e)
bench.add_command(bench_proxy_command)


def _parse_ints(value: str, name: str) -> tuple[int, ...]:
    try:
        numbers = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not numbers or any(n <= 0 for n in numbers):
        raise click.BadParameter(f"{name} must be positive integers")
    return numbers


@bench.command("store")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write (default: a temporary directory on the system temp disk).",
)
@click.option("--sizes", default="100,1024", show_default=True, help="Message body sizes in bytes.")
@click.option("--batches", default="1,64", show_default=True, help="Messages per append.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.05),
    default=2.0,
    show_default=True,
    help="Time limit of each measurement.",
)
@click.option("--quick", is_flag=True, help="A short run (0.3 s per measurement).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench_store(
    directory: Path | None, sizes: str, batches: str, seconds: float, quick: bool, as_json: bool
) -> None:
    """Storage engine against raw disk writes: append, sync append, dispatch, reads."""
    config = StoreBenchConfig(
        directory=directory or Path(tempfile.gettempdir()) / "ferrymq-bench",
        sizes=_parse_ints(sizes, "--sizes"),
        batches=_parse_ints(batches, "--batches"),
        seconds=0.3 if quick else seconds,
        max_bytes=32 * 1024 * 1024 if quick else 256 * 1024 * 1024,
    )
    console = Console(stderr=True)
    with console.status("measuring") as status:
        results = run_store_bench(config, lambda name: status.update(f"measuring {name}"))
    summary = _summary(config, results)
    if as_json:
        click.echo(json.dumps(summary))
    else:
        _print_table(results)
        click.echo(
            f"async_ratio={summary['async_ratio']} sync_ratio={summary['sync_ratio']} "
            "(1 KiB x64, against raw write and raw write+fdatasync)"
        )


@bench.command("broker")
@click.option("--sizes", default="100,1024", show_default=True, help="Payload sizes in bytes.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.2),
    default=5.0,
    show_default=True,
    help="Length of each send measurement (split over the rounds).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1, max=100),
    default=5,
    show_default=True,
    help="Slices each send row is measured in, alternating ferrymq and NATS.",
)
@click.option(
    "--window",
    type=click.IntRange(min=1, max=10_000),
    default=256,
    show_default=True,
    help="Sends in flight in the windowed rows.",
)
@click.option("--no-nats", is_flag=True, help="Skip the NATS JetStream rows.")
@click.option("--no-cpp", is_flag=True, help="Skip the official C++-core client rows.")
@click.option(
    "--tls",
    "with_tls",
    is_flag=True,
    help="Also a TLS-only broker (ferrymq-tls), its sends in the same rounds as the plain one's.",
)
@click.option(
    "--acl",
    "with_acl",
    is_flag=True,
    help="Also an ACL 1.0 broker (ferrymq-acl, signed sends), in the same rounds as the plain one. "
    "With --tls: plain, ACL and ACL + TLS (ferrymq-acl-tls) side by side, no TLS-only broker.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench_broker(
    sizes: str,
    seconds: float,
    rounds: int,
    window: int,
    no_nats: bool,
    no_cpp: bool,
    with_tls: bool,
    with_acl: bool,
    as_json: bool,
) -> None:
    """One broker beside NATS JetStream R1: sync, windowed and raw sends, consumes; CPU per row."""
    config = BrokerBenchConfig(
        sizes=_parse_ints(sizes, "--sizes"),
        seconds=seconds,
        rounds=rounds,
        window=window,
        nats=not no_nats,
        cpp=not no_cpp,
        tls=with_tls,
        acl=with_acl,
    )
    console = Console(stderr=True)
    with console.status("measuring") as status:
        try:
            rows = asyncio.run(
                run_broker_bench(config, lambda name: status.update(f"measuring {name}"))
            )
        except RuntimeError as exc:  # a server did not start; its log tail says why
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "benchmark": "broker",
                    "machine": _machine(),
                    "window": window,
                    "seconds": seconds,
                    "rounds": rounds,
                    "rows": [r.as_json() for r in rows],
                    "ratios_to_nats": ratios_to_nats(rows),
                    "ratios_tls": ratios_tls(rows),
                    "ratios_acl": ratios_acl(rows),
                    "ratios_acl_tls": ratios_acl_tls(rows),
                }
            )
        )
        return
    _print_rows("ferry bench broker", rows)
    for ratio in ratios_to_nats(rows):
        click.echo(
            f"{ratio['mode']} {ratio['size']} B: ferrymq/NATS throughput "
            f"{ratio['throughput_ratio']}x, p99 NATS/ferrymq {ratio['p99_ratio']}"
        )
    for ratio in ratios_tls(rows):
        click.echo(
            f"{ratio['mode']} {ratio['size']} B: TLS/plain throughput {ratio['throughput_ratio']}x"
        )
    for ratio in ratios_acl(rows):
        click.echo(
            f"{ratio['mode']} {ratio['size']} B: ACL/plain throughput {ratio['throughput_ratio']}x"
        )
    for ratio in ratios_acl_tls(rows):
        click.echo(
            f"{ratio['mode']} {ratio['size']} B: ACL+TLS/plain throughput "
            f"{ratio['throughput_ratio']}x"
        )


@bench.command("spark")
@click.option("--rows", type=click.IntRange(min=1000), default=500_000, show_default=True)
@click.option("--size", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "--repeat",
    type=click.IntRange(min=1, max=20),
    default=3,
    show_default=True,
    help="Runs of the stream-read pair (alternating); the median is reported.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench_spark(rows: int, size: int, repeat: int, as_json: bool) -> None:
    """The ferrymq Spark data source beside Spark reading Parquet: batch, stream read, write."""
    from ferrymq.cmd.bench_spark import SparkBenchConfig, ratios, run_spark_bench

    config = SparkBenchConfig(
        rows=rows, size=size, max_offsets_per_trigger=max(1, rows // 2), repeat=repeat
    )
    console = Console(stderr=True)
    with console.status("measuring") as status:
        try:
            results = asyncio.run(run_spark_bench(config, status.update))
        except (RuntimeError, ImportError) as exc:
            raise click.ClickException(str(exc)) from None
    to_parquet = ratios(results)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "benchmark": "spark",
                    "machine": _machine(),
                    "rows": [r.as_json() for r in results],
                    "ratios": to_parquet,
                }
            )
        )
        return
    table = Table(title=f"ferry bench spark ({rows:,} rows of {size} B, local[2])")
    for column in ("job", "source", "sink", "rows", "seconds", "rows/s"):
        table.add_column(column, justify="left" if column in ("job", "source", "sink") else "right")
    for r in results:
        seconds = f"{r.seconds:.2f}"
        if len(r.runs) > 1:
            seconds += " (" + ", ".join(f"{run:.2f}" for run in r.runs) + ")"
        table.add_row(r.job, r.source, r.sink, f"{r.rows:,}", seconds, f"{r.rows_per_s:,.0f}")
    _wide_console().print(table)
    click.echo(" ".join(f"{k}={v}x" for k, v in to_parquet.items()) + " (ferrymq/Parquet)")


@bench.command("connectors")
@click.option("--rows", type=click.IntRange(min=1000), default=200_000, show_default=True)
@click.option(
    "--size",
    type=click.IntRange(min=16),
    default=100,
    show_default=True,
    help="Body bytes of the FileSource rows and of ferry bench produce beside them.",
)
@click.option(
    "--repeat",
    type=click.IntRange(min=1, max=20),
    default=3,
    show_default=True,
    help="Runs of each throughput job (alternating order); the median is reported.",
)
@click.option(
    "--latency-seconds",
    type=click.FloatRange(min=0),
    default=20.0,
    show_default=True,
    help="Measured seconds of the PostgreSQL -> PostgreSQL latency run (0 skips it).",
)
@click.option(
    "--latency-rate",
    type=click.FloatRange(min=1, max=5000),
    default=200.0,
    show_default=True,
    help="Rows inserted per second during the latency run.",
)
@click.option(
    "--interval-ms",
    type=click.IntRange(min=10),
    default=200,
    show_default=True,
    help="The latency run's poll.interval.ms (source) and trigger.interval.ms (sink).",
)
@click.option(
    "--warmup/--no-warmup",
    default=True,
    show_default=True,
    help="Unmeasured small runs of every job first (--no-warmup: the first job pays Spark's).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def bench_connectors(
    rows: int,
    size: int,
    repeat: int,
    latency_seconds: float,
    latency_rate: float,
    interval_ms: int,
    warmup: bool,
    as_json: bool,
) -> None:
    """Connectors beside their baselines: PostgreSQL sink, writes into ferrymq, latency."""
    from ferrymq.cmd.bench_connectors import ConnectorsBenchConfig, run_connectors_bench

    config = ConnectorsBenchConfig(
        rows=rows,
        size=size,
        repeat=repeat,
        latency_seconds=latency_seconds,
        latency_rate=latency_rate,
        interval_ms=interval_ms,
        warmup=warmup,
    )
    console = Console(stderr=True)
    with console.status("measuring") as status:
        try:
            result = asyncio.run(run_connectors_bench(config, status.update))
        except (RuntimeError, ImportError) as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps({"benchmark": "connectors", "machine": _machine(), **result.as_json()})
        )
        return
    table = Table(
        title=f"ferry bench connectors ({rows:,} rows, {result.master}, median of {repeat})"
    )
    for column in ("group", "system", "rows", "body B", "seconds", "rows/s"):
        table.add_column(column, justify="left" if column in ("group", "system") else "right")
    for r in result.rows:
        seconds = f"{r.seconds:.2f}"
        if len(r.runs) > 1:
            seconds += " (" + ", ".join(f"{run:.2f}" for run in r.runs) + ")"
        table.add_row(
            r.group, r.system, f"{r.rows:,}", str(r.size), seconds, f"{r.rows_per_s:,.0f}"
        )
    _wide_console().print(table)
    for name, reason in result.skipped.items():
        click.echo(f"skipped {name}: {reason}")
    click.echo(" ".join(f"{k}={v}x" for k, v in result.ratios().items()))
    if result.latency is not None:
        latency = result.latency
        click.echo(
            f"latency PostgreSQL commit -> copy committed ({latency.rows} rows at "
            f"{latency.rate:.0f}/s, intervals {latency.interval_ms} ms): p50 {latency.p50_ms} ms, "
            f"p99 {latency.p99_ms} ms, max {latency.max_ms} ms"
        )


def _print_rows(title: str, rows: list[Row]) -> None:
    table = Table(title=title)
    for column in (
        "system",
        "mode",
        "size",
        "msg/s",
        "MB/s",
        "p50 ms",
        "p99 ms",
        "client CPU %",
        "server CPU %",
        "failed",
    ):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            r.system,
            r.mode,
            str(r.size),
            f"{r.msgs_per_s:,.0f}",
            f"{r.mb_per_s:.1f}",
            "-" if r.p50_ms is None else f"{r.p50_ms:.2f}",
            "-" if r.p99_ms is None else f"{r.p99_ms:.2f}",
            f"{r.client_cpu_pct:.0f}",
            f"{r.server_cpu_pct:.0f}",
            str(r.failed),
        )
    _wide_console().print(table)


def _wide_console() -> Console:
    """Tables too wide for 80 columns stay one line per row when piped to a file."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


@bench.command("replication")
@click.option("--sizes", default="100,1024", show_default=True, help="Payload sizes in bytes.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.2),
    default=5.0,
    show_default=True,
    help="Length of each row (split over the rounds).",
)
@click.option(
    "--window",
    type=click.IntRange(min=1, max=10_000),
    default=256,
    show_default=True,
    help="Sends in flight in the windowed rows.",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1, max=100),
    default=5,
    show_default=True,
    help="Slices each row is measured in, the systems taking turns.",
)
@click.option("--no-nats", is_flag=True, help="Skip the NATS JetStream rows.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench_replication(
    sizes: str, seconds: float, window: int, rounds: int, no_nats: bool, as_json: bool
) -> None:
    """Three replicas with sync replication beside one replica and beside NATS JetStream R3/R1."""
    config = ReplicationBenchConfig(
        sizes=_parse_ints(sizes, "--sizes"),
        seconds=seconds,
        rounds=rounds,
        window=window,
        nats=not no_nats,
    )
    console = Console(stderr=True)
    with console.status("measuring") as status:
        try:
            rows = asyncio.run(
                run_replication_bench(config, lambda name: status.update(f"measuring {name}"))
            )
        except RuntimeError as exc:  # a server did not start; its log tail says why
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "benchmark": "replication",
                    "machine": _machine(),
                    "window": window,
                    "seconds": seconds,
                    "rounds": rounds,
                    "rows": [r.as_json() for r in rows],
                    "ratios": replication_ratios(rows),
                }
            )
        )
        return
    _print_rows("ferry bench replication", rows)
    for ratio in replication_ratios(rows):

        def shown(value: float | None) -> str:
            return "-" if value is None else f"{value}x"

        click.echo(
            f"{ratio['mode']} {ratio['size']} B: ferrymq R3/R1 {shown(ratio['r3_over_r1'])}, "
            f"ferrymq R3 / NATS R3 {shown(ratio['r3_over_nats_r3'])} "
            f"(NATS R3/R1 {shown(ratio['nats_r3_over_r1'])})"
        )


@bench.command("controller")
@click.option(
    "--requests",
    type=click.IntRange(min=10),
    default=1000,
    show_default=True,
    help="Sequential writes per latency row.",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.2),
    default=5.0,
    show_default=True,
    help="Length of each windowed row.",
)
@click.option(
    "--window",
    type=click.IntRange(min=1, max=1024),
    default=32,
    show_default=True,
    help="Writes in flight in the windowed rows.",
)
@click.option(
    "--failovers",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Leader kills (kill -9) per system.",
)
@click.option("--no-etcd", is_flag=True, help="Skip the etcd 3.4 rows.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench_controller(
    requests: int, seconds: float, window: int, failovers: int, no_etcd: bool, as_json: bool
) -> None:
    """Three controller nodes beside a three-node etcd 3.4: commit latency, throughput, failover."""
    config = ControllerBenchConfig(
        requests=requests, seconds=seconds, window=window, failovers=failovers, etcd=not no_etcd
    )
    console = Console(stderr=True)
    with console.status("measuring") as status:
        try:
            result = asyncio.run(
                run_controller_bench(config, lambda name: status.update(f"measuring {name}"))
            )
        except RuntimeError as exc:  # a server did not start, or etcd is missing
            raise click.ClickException(str(exc)) from None
    summary = result.summary()
    if as_json:
        click.echo(
            json.dumps(
                {
                    "benchmark": "controller",
                    "machine": _machine(),
                    "requests": requests,
                    "window": window,
                    "seconds": seconds,
                    "rows": [r.as_json() for r in result.rows],
                    "failovers_s": {
                        s: [round(g, 3) for g in gaps] for s, gaps in result.failovers.items()
                    },
                    **summary,
                }
            )
        )
        return
    _print_rows("ferry bench controller", result.rows)
    for system, gaps in result.failovers.items():
        click.echo(f"{system} failover after kill -9 (s): {', '.join(f'{g:.2f}' for g in gaps)}")
    click.echo(
        f"failover median {summary['failover_median_s']}, ferrymq/etcd "
        f"{summary['failover_over_etcd']}x; commit p50 ferrymq/etcd "
        f"{summary['commit_p50_over_etcd']}x"
    )


@bench.command("failover")
@click.option(
    "--rounds",
    type=click.IntRange(min=1, max=100),
    default=5,
    show_default=True,
    help="Failures per system and mode.",
)
@click.option(
    "--rate",
    type=click.IntRange(min=1, max=10_000),
    default=200,
    show_default=True,
    help="Messages per second (open loop).",
)
@click.option(
    "--mode",
    "modes",
    type=click.Choice(["kill", "stop"]),
    multiple=True,
    default=("kill", "stop"),
    show_default=True,
    help="kill: kill -9 (a crash); stop: SIGSTOP (a silent failure). Repeat for both.",
)
@click.option("--no-nats", is_flag=True, help="Skip the NATS JetStream R3 rounds.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def bench_failover(
    rounds: int, rate: int, modes: tuple[str, ...], no_nats: bool, as_json: bool
) -> None:
    """Master (leader) failures under load: unavailability gap, election, loss, beside NATS R3."""
    config = FailoverBenchConfig(rounds=rounds, rate=rate, modes=modes, nats=not no_nats)
    console = Console(stderr=True)
    with console.status("measuring") as status:
        try:
            summaries = asyncio.run(
                run_failover_bench(config, lambda name: status.update(f"measuring {name}"))
            )
        except RuntimeError as exc:  # a server did not start, or a failover never finished
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(
            json.dumps(
                {
                    "benchmark": "failover",
                    "machine": _machine(),
                    "rate": rate,
                    "results": [s.as_json() for s in summaries],
                }
            )
        )
        return
    table = Table(title=f"ferry bench failover ({rounds} rounds, {rate} msg/s)")
    for column in (
        "system",
        "mode",
        "gap median s",
        "gap p99 s",
        "elect median s",
        "follow median s",
        "acked",
        "lost",
        "duplicated",
    ):
        table.add_column(column, justify="right")
    for s in summaries:
        table.add_row(
            s.system,
            s.mode,
            f"{s.stat('gap_s', 0.5):.2f}",
            f"{s.stat('gap_s', 0.99):.2f}",
            f"{s.stat('elect_s', 0.5):.2f}",
            f"{s.stat('follow_s', 0.5):.2f}",
            f"{s.acknowledged:,}",
            str(s.lost),
            str(s.duplicated),
        )
    _wide_console().print(table)


@bench.command("connect")
@click.option(
    "--rounds",
    type=click.IntRange(min=1, max=100),
    default=10,
    show_default=True,
    help="Leader kills (kill -9) per timing profile.",
)
@click.option(
    "--timings",
    "timings",
    type=click.Choice(list(CONNECT_TIMINGS)),
    multiple=True,
    default=tuple(CONNECT_TIMINGS),
    show_default=True,
    help="Worker timing profiles for the failover rounds (repeat for several); the REST "
    "latency runs on the first one's cluster.",
)
@click.option(
    "--writes",
    type=click.IntRange(min=0),
    default=400,
    show_default=True,
    help="Measured writes per side (leader, follower); 0 skips the latency phase.",
)
@click.option(
    "--slice-writes",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Writes per slice; the sides alternate every slice.",
)
@click.option(
    "--connectors",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="STOPPED connectors in the log a starting worker replays.",
)
@click.option(
    "--start-samples",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Worker starts per log (empty, full); 0 skips the start phase.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def bench_connect(
    rounds: int,
    timings: tuple[str, ...],
    writes: int,
    slice_writes: int,
    connectors: int,
    start_samples: int,
    as_json: bool,
) -> None:
    """Connect workers: leader failover after kill -9, REST writes via a follower, start time."""
    config = ConnectBenchConfig(
        rounds=rounds,
        timings=tuple(dict.fromkeys(timings)),
        writes=writes,
        slice_writes=slice_writes,
        connectors=connectors,
        start_samples=start_samples,
    )
    console = Console(stderr=True)
    with console.status("measuring") as status:
        try:
            result = asyncio.run(run_connect_bench(config, status.update))
        except RuntimeError as exc:  # a server did not start, or a failover never finished
            raise click.ClickException(str(exc)) from None
    failovers = [f.as_json() for f in result.failovers]
    latency = result.latency.as_json() if result.latency else None
    start = result.start.as_json() if result.start else None
    if as_json:
        summary = {"benchmark": "connect", "machine": _machine(), "rounds": rounds}
        click.echo(
            json.dumps({**summary, "failover": failovers, "latency": latency, "start": start})
        )
        return
    console = _wide_console()
    table = Table(title=f"ferry bench connect: leader failover after kill -9 ({rounds} rounds, s)")
    for column in ("timings", "write median", "write p90", "write max", "claim median",
                   "claim p90", "claim max"):  # fmt: skip
        table.add_column(column, justify="right")
    for failover in failovers:
        table.add_row(
            f"{failover['timing']} (heartbeat {failover['heartbeat_interval_ms']} ms, "
            f"grace {failover['leader_failover_grace_ms']} ms)",
            *(
                f"{failover[f'{figure}_{label}_s']:.2f}"
                for figure in ("write", "claim")
                for label in ("median", "p90", "max")
            ),
        )
    console.print(table)
    if latency:
        table = Table(
            title=f"REST write latency, ms ({latency['writes_per_side']} writes per side, "
            f"{latency['timing']} timings)"
        )
        for column in ("side", "p50", "p99"):
            table.add_column(column, justify="right")
        for side in ("leader", "follower"):
            table.add_row(side, f"{latency[f'{side}_p50_ms']}", f"{latency[f'{side}_p99_ms']}")
        table.add_row(
            "follower / leader",
            f"{latency['follower_over_leader_p50']}x",
            f"{latency['follower_over_leader_p99']}x",
        )
        console.print(table)
    if start:
        table = Table(title="worker start to serve, median s")
        for column in ("config log", "ready file", "GET /health 200"):
            table.add_column(column, justify="right")
        table.add_row(
            "empty", f"{start['empty_ready_median_s']}", f"{start['empty_serve_median_s']}"
        )
        table.add_row(
            f"{start['connectors']} connectors ({start['log_records']} records)",
            f"{start['full_ready_median_s']}",
            f"{start['full_serve_median_s']}",
        )
        console.print(table)
        console.print(f"full / empty (serve): {start['full_over_empty']}x")


def _machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }


def _summary(config: StoreBenchConfig, results: list[CaseResult]) -> dict[str, object]:
    headline = next((r for r in results if r.size == 1024 and r.batch == 64), results[-1])
    return {
        "benchmark": "store",
        "machine": _machine(),
        "directory": str(config.directory),
        "seconds_per_measurement": config.seconds,
        "async_ratio": round(headline.async_ratio, 3),
        "sync_ratio": round(headline.sync_ratio, 3),
        "headline_case": {"size": headline.size, "batch": headline.batch},
        "cases": [r.as_json() for r in results],
    }


def _print_table(results: list[CaseResult]) -> None:
    table = Table(title="ferry bench store (MB/s, msg/s)")
    for column in (
        "size x batch",
        "raw write",
        "async append",
        "ratio",
        "async, sparse segments",
        "raw write+fsync",
        "sync append",
        "ratio",
        "sync, sparse segments",
        "dispatch",
        "replay",
        "read",
    ):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            f"{r.size} B x {r.batch}",
            f"{r.raw_write.mb_per_s:.0f}",
            f"{r.async_append.mb_per_s:.0f} ({r.async_append.msg_per_s:,.0f}/s)",
            f"{r.async_ratio:.2f}",
            f"{r.async_append_sparse.mb_per_s:.0f}",
            f"{r.raw_write_fsync.mb_per_s:.1f}",
            f"{r.sync_append.mb_per_s:.1f} ({r.sync_append.msg_per_s:,.0f}/s)",
            f"{r.sync_ratio:.2f}",
            f"{r.sync_append_sparse.mb_per_s:.1f}",
            f"{r.dispatch.msg_per_s:,.0f}/s",
            f"{r.replay.msg_per_s:,.0f}/s",
            f"{r.read.msg_per_s:,.0f}/s",
        )
    _wide_console().print(table)


def main(args: list[str] | None = None) -> None:
    """Run the `ferry` command (`args`: instead of argv); any error is one line on stderr."""
    try:
        cli.main(args=args, standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"ferry: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except FerryError as exc:
        click.echo(f"ferry: error: {exc}", err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"ferry: error: {exc.strerror or exc}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
