"""A Connect worker: one asyncio process serving REST, following the config log, running tasks.

`Worker.start` (in this order, each failure a `WorkerStartError` with one clear line):
1. bind the REST listener (port 0 allowed: the port is read back) and fix the worker id and the
   advertised URL;
2. make sure the cluster's topics exist: the config log as a fenced topic with one queue on one
   broker group, the status and position topics with one queue (created when missing, as Kafka
   Connect creates its internal topics; an existing config topic that is not fenced, or has
   more than one queue, stops the worker: its one-writer guarantee would not hold);
3. serve REST and check that the advertised URL reaches this very process (`GET /` answers
   with this process's instance id: a wrong URL would send every forwarded write astray);
4. run the herder (config log, membership, leadership, assignment, tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
import uuid
from collections.abc import Generator
from types import TracebackType
from typing import Self

import httpx
import uvicorn

from ferrymq.client.admin import AdminClient
from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.fenced import FencedTopicWriter
from ferrymq.client.membership import GroupMembership
from ferrymq.client.producer import Producer
from ferrymq.connect.config import WorkerConfig
from ferrymq.connect.configlog import LoggedRecord, decode_logged
from ferrymq.connect.errors import UnavailableError
from ferrymq.connect.herder import Herder
from ferrymq.connect.plugin import Plugins
from ferrymq.connect.rest import build_app
from ferrymq.connect.statuslog import StatusLog
from ferrymq.connect.tasks import TaskManager, TaskRunner
from ferrymq.errors import FerryError, RemoteError
from ferrymq.model import MessageQueue
from ferrymq.security import tlsreload
from ferrymq.security.tls import process_client_tls, process_server_tls
from ferrymq.wire.codes import ResponseCode

__all__ = ["Worker", "WorkerStartError"]

log = logging.getLogger(__name__)

_SELF_CHECK_S = 5.0
_RAW_LOG_WAIT_S = 5.0
_SHUTDOWN_S = 5.0
"""How long REST calls in progress may take to finish when the worker stops."""
_STOP_TASKS_S = 60.0
"""How long a close waits for its tasks' queries to stop (a Spark query stops in seconds)."""


class WorkerStartError(FerryError):
    """The worker cannot start: the message says why, in one line."""


class Worker:
    """One Connect worker (use `async with`)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        runner: TaskRunner,
        plugins: Plugins | None = None,
    ) -> None:
        self.config = config.check()
        self.plugins = plugins if plugins is not None else Plugins()
        self.runner = runner
        self.instance = uuid.uuid4().hex
        self._tls = process_server_tls()
        """The REST API's TLS: the process's (`ferry connect worker --tls`); not disabled = TLS only
        (HTTP has no first byte to tell plain text by)."""
        # over TLS, an idle kept-alive connection would hold the REST server's stop until its
        # graceful timeout (the TLS close waits for a reply nobody reads): none kept then
        keep = 0 if self._tls.context is not None else httpx.Limits().max_keepalive_connections
        self.http = httpx.AsyncClient(
            verify=process_client_tls().context or True,
            limits=httpx.Limits(max_keepalive_connections=keep),
        )
        self.worker_id = ""
        self.url = ""
        self.port = 0
        self._socket: socket.socket | None = None
        self._server: _RestServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._consumer: PullConsumer | None = None
        self._producer: Producer | None = None
        self._writer: FencedTopicWriter | None = None
        self._membership: GroupMembership | None = None
        self._herder: Herder | None = None

    @property
    def herder(self) -> Herder:
        """The worker's core (after `start`)."""
        assert self._herder is not None, "the worker has not started"
        return self._herder

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        """Bind, check the topics, serve, self-check, run.

        Raises:
            WorkerStartError: with the reason, in one line.
        """
        config = self.config
        try:
            await self._start()
        except WorkerStartError:
            await self.close()
            raise
        except (FerryError, OSError) as exc:
            await self.close()
            raise WorkerStartError(f"{type(exc).__name__}: {exc}") from exc
        log.info(
            "worker %s of cluster %s serving at %s (config log %s)",
            self.worker_id,
            config.connect_cluster_id,
            self.url,
            config.config_store_topic,
        )

    async def _start(self) -> None:
        config = self.config
        family = socket.AF_INET6 if ":" in config.http_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((config.http_host, config.http_port))
        except OSError as exc:
            sock.close()
            raise WorkerStartError(
                f"cannot listen on {config.http_host}:{config.http_port}: {exc.strerror or exc}"
            ) from None
        sock.listen(128)
        sock.setblocking(False)
        self._socket = sock
        self.port = sock.getsockname()[1]
        self.url = config.url_for(self.port)
        if self._tls.context is not None and not config.advertised_url:
            self.url = "https" + self.url.removeprefix("http")
        self.worker_id = config.id_for(self.port)
        await self._ensure_topics()
        self._consumer = PullConsumer(config.namesrv_addr, f"{config.group}-reader")
        self._producer = Producer(config.namesrv_addr, config.group)
        await self._producer.start()
        self._writer = FencedTopicWriter(config.namesrv_addr, config.config_store_topic)
        self._membership = GroupMembership(
            config.namesrv_addr, config.config_store_topic, config.group
        )
        status = StatusLog(
            self._producer,
            self._consumer,
            config.connect_status_topic,
            lookback_ms=2 * config.status_republish_ms,
        )
        run = secrets.token_hex(6)  # this start's run: tasks of an earlier one are not ours
        log.info("worker %s starts as run %s", self.worker_id, run)
        tasks = TaskManager(
            worker_id=self.worker_id,
            runner=self.runner,
            report=status.publish,
            wall_ms=_wall_ms,
            run=run,
        )
        self._herder = Herder(
            config,
            worker_id=self.worker_id,
            url=self.url,
            plugins=self.plugins,
            tasks=tasks,
            status=status,
            consumer=self._consumer,
            writer=self._writer,
            membership=self._membership,
        )
        app = build_app(self)
        server_config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            loop="none",
            timeout_graceful_shutdown=int(_SHUTDOWN_S) - 1,
        )
        if self._tls.context is not None:
            server_config.load()  # then uvicorn serves with our context, built in one place
            server_config.ssl = self._tls.context
        self._server = _RestServer(server_config)
        self._tasks.append(asyncio.create_task(self._serve(sock), name="rest"))
        await self._self_check()
        self._tasks.append(asyncio.create_task(self.herder.run(), name="herder"))
        if self._tls.context is not None and self._tls.source is not None:  # new certs, no restart
            self._tasks.append(asyncio.create_task(tlsreload.watch(self._tls), name="tls-files"))

    async def _serve(self, sock: socket.socket) -> None:
        assert self._server is not None
        await self._server.serve(sockets=[sock])

    async def _ensure_topics(self) -> None:
        config = self.config
        async with AdminClient(config.namesrv_addr) as admin:
            route = await admin.route(config.config_store_topic)
            if route is None:
                broker = config.config_store_broker_name or await _first_group(admin)
                log.info(
                    "creating the config log %s (fenced, one queue) on %s",
                    config.config_store_topic,
                    broker,
                )
                await admin.create_topic(
                    config.config_store_topic, queues=1, broker_name=broker, fenced=True
                )
            else:
                groups = list(route.queue_datas)
                if len(groups) != 1 or groups[0].read_queue_nums != 1:
                    raise WorkerStartError(
                        f"configStoreTopic {config.config_store_topic} must have one queue on one "
                        f"broker group; it has {sum(q.read_queue_nums for q in groups)} queues on "
                        f"{len(groups)} group(s)"
                    )
                holder = None
                async with FencedTopicWriter(config.namesrv_addr, config.config_store_topic) as w:
                    try:
                        holder = await w.holder()
                    except FerryError as exc:
                        if isinstance(exc, RemoteError) and exc.code == ResponseCode.NO_PERMISSION:
                            raise WorkerStartError(
                                f"the broker refused this worker's account ({exc}): check "
                                "accessKey and secretKey in the worker config"
                            ) from None
                        raise WorkerStartError(
                            f"configStoreTopic {config.config_store_topic} is not a fenced topic "
                            f"({exc}); create it with `ferry admin topic create --fenced` or let "
                            "the worker create it"
                        ) from None
                log.info(
                    "config log %s: epoch %d held by %s",
                    config.config_store_topic,
                    holder.epoch,
                    holder.writer or "nobody",
                )
            for topic in (config.connect_status_topic, config.position_store_topic):
                if await admin.route(topic) is None:
                    broker = config.config_store_broker_name or await _first_group(admin)
                    await admin.create_topic(topic, queues=1, broker_name=broker)

    async def _self_check(self) -> None:
        """The advertised URL must reach this process (else forwarded writes go astray)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _SELF_CHECK_S
        problem = ""
        while loop.time() < deadline:
            try:
                answer = await self.http.get(self.url + "/", timeout=1.0)
                if answer.headers.get("X-Ferry-Instance") == self.instance:
                    return
                other = answer.headers.get("X-Ferry-Worker")
                problem = f"it answered as another process (worker {other})"
                break
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.05)
        raise WorkerStartError(
            f"advertisedUrl {self.url} does not reach this worker ({problem}); set advertisedUrl "
            "to an address other workers and clients can reach this worker at"
        )

    # ------------------------------------------------------------------ raw log

    async def raw_log(self, start: int, limit: int) -> list[LoggedRecord]:
        """The config log's records from queue offset `start`, as stored (`ferry connect log`)."""
        assert self._consumer is not None
        queue: MessageQueue = await self.herder.log.queue()
        end = await self._consumer.max_offset(queue)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _RAW_LOG_WAIT_S
        found: list[LoggedRecord] = []
        offset = start
        while offset < end and len(found) < limit:
            result = await self._consumer.pull(
                queue, offset, max_messages=min(256, limit - len(found))
            )
            if result.status is PullStatus.FOUND:
                found += [decode_logged(m) for m in result.messages]
                offset = result.next_offset
                continue
            if result.next_offset > offset:  # below the first stored record: retention
                offset = result.next_offset
                continue
            if loop.time() >= deadline:  # never a short answer that looks like the whole log
                raise UnavailableError(
                    f"the config log's broker answered {result.status.name} at offset {offset} "
                    f"(the log ends at {end}) for {_RAW_LOG_WAIT_S:g} s; retry"
                )
            await asyncio.sleep(0.1)  # a replica catching up after a failover
        return found[:limit]

    # ------------------------------------------------------------------ stop

    async def serve_forever(self) -> None:
        """Wait until a part of the worker fails (it raises) or the worker is closed."""
        if self._tasks:
            done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()

    async def close(self) -> None:
        """Stop the herder and the tasks, leave the group, stop serving, close connections."""
        rest = self._tasks[0] if self._tasks else None
        herder_tasks = self._tasks[1:]  # the herder: no more claims, writes or task changes
        for task in herder_tasks:
            task.cancel()
        if herder_tasks:  # bounded: a step that ignores its cancellation cannot hold the close
            done, _ = await asyncio.wait(herder_tasks, timeout=_SHUTDOWN_S)
            for task in done:  # retrieved, as the awaits did: closing goes on regardless
                if not task.cancelled():
                    task.exception()
        if self._herder is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._herder.tasks.stop_all(), _STOP_TASKS_S)
        if self._membership is not None and self.worker_id:
            with contextlib.suppress(FerryError, OSError, TimeoutError):
                await asyncio.wait_for(self._membership.leave(self.worker_id), 2.0)
        if rest is not None and self._server is not None:
            # uvicorn closes its listener (and the socket it took over) on the way out
            self._server.should_exit = True
            try:
                await asyncio.wait_for(asyncio.shield(rest), _SHUTDOWN_S)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing goes on regardless
                rest.cancel()
                await asyncio.wait({rest}, timeout=_SHUTDOWN_S)
        elif self._socket is not None:  # never served: the socket is still ours
            self._socket.close()
        self._socket = None
        self._tasks.clear()
        for closer in (self._writer, self._membership, self._producer, self._consumer):
            if closer is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(closer.close(), _SHUTDOWN_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.http.aclose(), _SHUTDOWN_S)


class _RestServer(uvicorn.Server):
    """uvicorn's server without its signal handlers: the process's own loop owns SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        yield


async def _first_group(admin: AdminClient) -> str:
    info = await admin.cluster_info()
    names = sorted(info.broker_addr_table)
    if not names:
        raise WorkerStartError("no broker group is registered with the NameServer")
    return names[0]


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000
