"""`ferry console`: serve the web console of one cluster until SIGINT or SIGTERM.

Prints the console's URL (the port read back, so `--port 0` works) once it serves, and writes it
to `--ready-file` as `{"url", "addr", "pid"}`. Needs the `connect` extra (FastAPI, uvicorn).
With `--tls` (the servers' `--tls*` flags) the console serves https with that certificate and
reaches the cluster and Connect over TLS (else its client side may come from `FERRYMQ_TLS`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from ferrymq.cmd.process import fail, run_until_signal, setup_logging, write_ready
from ferrymq.cmd.tlsflags import install_tls, tls_server_options

__all__ = ["console_command"]


@click.command("console", context_settings={"max_content_width": 100})
@click.option(
    "--namesrv",
    "-n",
    envvar="NAMESRV_ADDR",
    required=True,
    help="NameServer address(es), `;`-separated (or NAMESRV_ADDR).",
)
@click.option(
    "--controller",
    default=None,
    help="Controller address(es), `;`-separated (default: the ones the brokers name).",
)
@click.option(
    "--connect",
    "connect_url",
    default=None,
    help="A Connect worker's REST URL, for the connectors page.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="0: a free port."
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2, max=60),
    default=1.0,
    show_default=True,
    help="Seconds between the samples behind the live charts.",
)
@click.option("--log-level", default="WARNING", show_default=True)
@tls_server_options
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='Write {"url", "addr", "pid"} as JSON here once serving.',
)
def console_command(
    namesrv: str,
    controller: str | None,
    connect_url: str | None,
    host: str,
    port: int,
    interval: float,
    log_level: str,
    ready_file: Path | None,
    **flags: Any,
) -> None:
    """Serve the web console: cluster, topics, groups, controller, messages, connectors."""
    setup_logging(log_level)
    if any(value for name, value in flags.items() if name.startswith("tls__")):
        install_tls({}, flags)  # https here, TLS toward the cluster and Connect
    if connect_url is not None and not connect_url.startswith(("http://", "https://")):
        fail(f"--connect takes a URL (http://host:port), not {connect_url!r}")
    try:  # FastAPI and uvicorn come with the `connect` extra
        from ferrymq.console.server import Console
    except ImportError as exc:
        fail(f"the console needs the connect extra: pip install 'ferrymq[connect]' ({exc})")

    async def main(stop: asyncio.Event) -> None:
        try:
            console = Console(
                namesrv,
                controller_addr=controller,
                connect_url=connect_url,
                host=host,
                port=port,
                interval=interval,
            )
            await console.__aenter__()
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        try:
            click.echo(f"ferry console: {console.url}", nl=True)
            write_ready(ready_file, {"url": console.url, "addr": console.url})
            serving = asyncio.ensure_future(console.serve_forever())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if serving.done():
                serving.result()
            serving.cancel()
        finally:
            await console.__aexit__(None, None, None)

    run_until_signal(main)
