"""`ferry connect worker`: run a Connect worker until SIGINT or SIGTERM.

Takes a RocketMQ Connect `connect.properties` (`--config`) and a `--kebab-case` flag for every
key (`--namesrv-addr`, `--http-port`, `--worker-id`, ...; flags win over the file). A bad value,
an unusable config topic, or an advertised URL that does not reach the worker stops it at start
with one line and exit status 2. The task runtime is Spark (`connectors.runtime`), started on
the worker's first task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ferrymq.cmd.metrics import metrics_endpoint, metrics_options
from ferrymq.cmd.process import fail, kebab, run_until_signal, setup_logging, write_ready
from ferrymq.cmd.tlsflags import install_tls, tls_server_options
from ferrymq.config import ConfigError, build_config, config_keys, parse_properties
from ferrymq.connect.config import WorkerConfig
from ferrymq.errors import FerryError
from ferrymq.security.acl import Credentials
from ferrymq.security.aclcredentials import export_credentials

__all__ = ["worker_command"]

log = logging.getLogger("ferrymq")


def _key_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add a `--kebab-case` option for every worker config key."""
    for key in sorted(config_keys(WorkerConfig), reverse=True):
        command = click.option(
            f"--{kebab(key)}", f"key__{key}", default=None, metavar="VALUE", help=f"{key}."
        )(command)
    return command


def load_worker_config(config_file: Path | None, keys: dict[str, str | None]) -> WorkerConfig:
    """The worker config from a file and flags (flags win).

    Raises:
        ConfigError: a bad value (the message names the key).
    """
    values: dict[str, str] = {}
    if config_file is not None:
        try:
            values.update(parse_properties(config_file.read_text(), str(config_file)))
        except OSError as exc:
            raise ConfigError("--config", f"{config_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError("--config", f"{config_file}: {exc}") from None
    values = install_tls(values, keys)  # the REST API's and the worker's own connections
    values.update({name.removeprefix("key__"): v for name, v in keys.items() if v is not None})
    config, ignored = build_config(WorkerConfig, values)
    for key in ignored:
        log.warning("config key %s is not used by ferrymq Connect; ignored", key)
    return config.check()


@click.command("worker", context_settings={"max_content_width": 100})
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A connect.properties file (key=value, RocketMQ Connect's keys).",
)
@click.option(
    "--spark-master",
    default=None,
    help="Where tasks' Spark queries run (any Spark master URL; local[N,F]: F tries a task) "
    "[default: local[2 x this machine's cores,4]].",
)
@click.option("--log-level", default="INFO", show_default=True)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Write {"id", "url", "pid"} as JSON here once serving.',
)
@_key_options
@metrics_options
@tls_server_options
def worker_command(
    config_file: Path | None,
    spark_master: str | None,
    log_level: str,
    ready_file: Path | None,
    metrics_exporter_type: str,
    metrics_prom_exporter_host: str,
    metrics_prom_exporter_port: int,
    **keys: str | None,
) -> None:
    """Run a Connect worker (REST API, config log follower, tasks on Spark)."""
    setup_logging(log_level)
    try:
        config = load_worker_config(config_file, keys)
    except ConfigError as exc:
        fail(str(exc))
    try:  # the REST server and the plugins come with the `connect` extra
        from ferrymq.connect import metrics as connect_metrics
        from ferrymq.connect.plugin import Plugins
        from ferrymq.connect.worker import Worker, WorkerStartError
        from ferrymq.connectors.runtime import SPARK_MASTER, SparkTaskRunner
    except ImportError as exc:
        fail(f"a Connect worker needs the connect extra: pip install 'ferrymq[connect]' ({exc})")
    plugins = Plugins()
    if config.access_key or config.secret_key:
        try:
            export_credentials(Credentials(config.access_key, config.secret_key))
        except ValueError:
            fail("config accessKey/secretKey: give both or neither")

    async def main(stop: asyncio.Event) -> None:
        runner = SparkTaskRunner(
            plugins,
            cluster_id=config.connect_cluster_id,
            namesrv_addr=config.namesrv_addr,
            state_dir=config.store_path_root_dir,
            spark_master=spark_master or SPARK_MASTER,
        )
        try:
            async with (
                Worker(config, runner=runner, plugins=plugins) as worker,
                metrics_endpoint(
                    metrics_exporter_type,
                    metrics_prom_exporter_host or config.http_host,
                    metrics_prom_exporter_port,
                    [lambda: connect_metrics.collect(worker.herder.tasks)],
                ) as endpoint,
            ):
                write_ready(
                    ready_file,
                    {
                        "id": worker.worker_id,
                        "url": worker.url,
                        "addr": worker.url,
                        "metrics": endpoint.address if endpoint else None,
                    },
                )
                serving = asyncio.ensure_future(worker.serve_forever())
                stopped = asyncio.ensure_future(stop.wait())
                await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if serving.done():
                    serving.result()
                serving.cancel()
        finally:
            await runner.close()

    try:
        run_until_signal(main)
    except WorkerStartError as exc:
        fail(str(exc))
    except FerryError as exc:
        fail(str(exc))
