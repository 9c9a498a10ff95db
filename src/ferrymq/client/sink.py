"""The client of exactly-once sink batches (SINK_PREPARE / SINK_DECIDE / SINK_COMMIT).

Used by the Spark sink: tasks `prepare` rows under (sink id, batch id, transaction id); the
driver `decide`s the batch's winner on the sink's `coordinator` broker and `commit`s it on every
broker that holds rows of the batch. All three are idempotent on the broker (a row prepared again
under its transaction counts once, by its unique key; the first decision wins; a commit applies
once), so every call is retried, with back-off and a fresh master address, for up to
`retry_for` seconds: on connection errors, on no answer, while the group has no master, and on
the refusals of a failover (NO_PERMISSION from a slave, SERVICE_NOT_AVAILABLE from a master
without a lease, a replication or flush timeout, SYSTEM_BUSY). Then the last error is raised.

A writer with a fencing generation sends it with its decides (and a new owner `fence`s first);
a refusal because a newer generation owns the sink is `SinkFencedError`, never retried.
`query_fence` reads a fence id's state (positions, generation) without recording anything; a
fence id the coordinator does not know is `SinkFenceNotFoundError`, never retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from types import TracebackType
from typing import Final, Self

from ferrymq.client.credentials import Credentials, with_credentials
from ferrymq.client.routing import Routes
from ferrymq.errors import ConnectError, FerryError, RemoteError, RpcError
from ferrymq.model import MessageQueue
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import ClusterInfo, decode_body, encode_body
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.headers import from_ext_fields, to_ext_fields
from ferrymq.wire.records import BatchItem, encode_batch
from ferrymq.wire.sink import (
    Positions,
    SinkBatchHeader,
    SinkCommit,
    SinkCommitResponseHeader,
    SinkFence,
    SinkFenceQueryHeader,
    SinkFenceRequestHeader,
    SinkFenceState,
    SinkPrepareRequestHeader,
    SinkWinner,
)

__all__ = ["RETRY_CODES", "SinkClient", "SinkFenceNotFoundError", "SinkFencedError"]

log = logging.getLogger(__name__)

RETRY_CODES: Final = frozenset(
    {
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.FLUSH_SLAVE_TIMEOUT,
        ResponseCode.FLUSH_DISK_TIMEOUT,
        ResponseCode.SLAVE_NOT_AVAILABLE,
        ResponseCode.NO_PERMISSION,
        ResponseCode.SERVICE_NOT_AVAILABLE,
    }
)
"""Answers of a broker group in the middle of a failover (or busy): ask its master again."""


class SinkFencedError(RemoteError):
    """A newer generation owns the sink: this writer is a zombie and must stop (never retried)."""


class SinkFenceNotFoundError(RemoteError):
    """The coordinator has no record of the fence id (no owner ever fenced or decided under it)."""


class SinkClient:
    """Prepare, decide and commit sink batches; use as an async context manager."""

    def __init__(
        self,
        namesrv_addr: str,
        *,
        group: str = "ferrymq-spark-sink",
        timeout: float = 10.0,
        retry_for: float = 30.0,
        rpc: RpcClient | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """`credentials`: sign every request (ACL 1.0, issue 23)."""
        self._namesrvs = [a.strip() for a in namesrv_addr.split(";") if a.strip()]
        self._rpc = with_credentials(rpc, None, None, credentials)
        self._owns_rpc = rpc is None
        self.routes = Routes(self._rpc, self._namesrvs)
        self.group = group
        self._timeout = timeout
        self._retry_for = retry_for

    async def close(self) -> None:
        """Close connections (when this client owns them)."""
        if self._owns_rpc:
            await self._rpc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues, ordered by broker name, then queue id (route order).

        A topic with moved queues (issue 20 section 4): the physical queues that take writes
        now, so rows are prepared, decided and committed on the group that holds them.
        """
        route = await self.routes.get(topic)
        return [q for q in map(route.send_target, route.write_queues) if q is not None]

    async def _cluster(self) -> ClusterInfo:
        last: FerryError = FerryError("no NameServer address given")
        for address in self._namesrvs:
            request = RemotingCommand(code=RequestCode.GET_BROKER_CLUSTER_INFO)
            try:
                response = await self._rpc.call(address, request, self._timeout)
            except FerryError as exc:
                last = exc
                continue
            if response.code == ResponseCode.SUCCESS:
                return decode_body(response.body, ClusterInfo)
            last = RemoteError(response.code, response.remark)
        raise last

    async def coordinator(self, topic: str | None) -> str:
        """The broker group that decides a sink's batches.

        The first broker name (sorted) of the topic's route when every row goes to one topic,
        else the first of the cluster: the same across restarts while the groups stay.
        """
        if topic is not None:
            route = await self.routes.get(topic)
            names = sorted({q.broker_name for q in route.write_queues})
        else:
            names = sorted((await self._cluster()).broker_addr_table)
        if not names:
            raise FerryError("no broker group to coordinate the sink")
        return names[0]

    async def _master(self, broker_name: str, *, refresh: bool) -> str:
        address = None if refresh else self.routes.master_of(broker_name)
        if address is None:
            data = (await self._cluster()).broker_addr_table.get(broker_name)
            address = data.broker_addrs.get(0) if data else None
        if address is None:
            raise ConnectError(broker_name, "the broker group has no master")
        return address

    async def _call(self, broker_name: str, request: RemotingCommand) -> RemotingCommand:
        """Send to the group's master until it succeeds or `retry_for` runs out.

        Raises:
            RemoteError: a refusal that is not a failover's, or the last one.
            RpcError: the last connection error or timeout (its outcome may be unknown).
        """
        deadline = time.monotonic() + self._retry_for
        delay = 0.05
        refresh = False
        while True:
            try:
                address = await self._master(broker_name, refresh=refresh)
                fresh = RemotingCommand(
                    code=request.code, ext_fields=dict(request.ext_fields), body=request.body
                )
                response = await self._rpc.call(address, fresh, self._timeout)
            except RpcError as exc:
                error: FerryError = exc
            else:
                if response.code == ResponseCode.SUCCESS:
                    return response
                if response.code == ResponseCode.SINK_GENERATION_FENCED:
                    raise SinkFencedError(
                        response.code, response.remark, code_name="SINK_GENERATION_FENCED"
                    )
                if response.code == ResponseCode.SINK_FENCE_NOT_FOUND:
                    raise SinkFenceNotFoundError(
                        response.code, response.remark, code_name="SINK_FENCE_NOT_FOUND"
                    )
                error = RemoteError(response.code, response.remark)
                if response.code not in RETRY_CODES:
                    raise error
            if time.monotonic() + delay > deadline:
                raise error
            log.info("broker group %s: %s; asking its master again", broker_name, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            refresh = True

    async def prepare(
        self,
        queue: MessageQueue,
        sink_id: str,
        batch_id: int,
        transaction_id: str,
        items: list[BatchItem],
    ) -> None:
        """Store rows for `queue`, invisible until their batch is committed.

        Every row needs its own unique key (the UNIQ_KEY property): the broker counts a
        transaction's rows by it, so a row sent again is stored once.

        Raises:
            RemoteError: the broker refused them.
            RpcError: no answer within `retry_for`: some may be stored (preparing them again
                under the same transaction is safe; committing the transaction is not).
        """
        header = SinkPrepareRequestHeader(
            sink_id=sink_id,
            batch_id=batch_id,
            transaction_id=transaction_id,
            topic=queue.topic,
            queue_id=queue.queue_id,
            producer_group=self.group,
        )
        request = RemotingCommand(
            code=RequestCode.SINK_PREPARE,
            ext_fields=to_ext_fields(header),
            body=encode_batch(items),
        )
        await self._call(queue.broker_name, request)

    async def decide(
        self,
        coordinator: str,
        sink_id: str,
        batch_id: int,
        proposal: dict[str, dict[str, int]],
        *,
        generation: int | None = None,
        fence_id: str | None = None,
        positions: Positions | None = None,
    ) -> dict[str, dict[str, int]]:
        """Record `proposal` as the batch's winner unless one is recorded; returns the winner.

        `generation`: the writer's fencing generation, recorded under `fence_id` (default the
        sink id); `positions`: the batch's source positions, recorded with a winning proposal.

        Raises:
            SinkFencedError: a newer generation owns the fence id (nothing was recorded).
        """
        header = SinkBatchHeader(
            sink_id=sink_id, batch_id=batch_id, generation=generation, fence_id=fence_id
        )
        request = RemotingCommand(
            code=RequestCode.SINK_DECIDE,
            ext_fields=to_ext_fields(header),
            body=encode_body(SinkWinner(proposal, positions)),
        )
        response = await self._call(coordinator, request)
        return decode_body(response.body, SinkWinner).transactions

    async def fence(
        self,
        coordinator: str,
        fence_id: str,
        generation: int,
        *,
        change: str | None = None,
        start: Positions | None = None,
        replace: bool = False,
    ) -> SinkFenceState:
        """Record a new owner's generation; returns what the fence id's decisions say.

        `start`: the positions of a very first start, or (with a `change` not applied yet)
        those the change sets (`replace`) or alters.

        Raises:
            SinkFencedError: a newer generation owns the fence id.
        """
        header = SinkFenceRequestHeader(fence_id=fence_id, generation=generation, change=change)
        request = RemotingCommand(
            code=RequestCode.SINK_FENCE,
            ext_fields=to_ext_fields(header),
            body=encode_body(SinkFence(start, replace)),
        )
        response = await self._call(coordinator, request)
        return decode_body(response.body, SinkFenceState)

    async def query_fence(self, coordinator: str, fence_id: str) -> SinkFenceState:
        """What the coordinator has recorded for `fence_id` (read-only: records nothing).

        Raises:
            SinkFenceNotFoundError: the coordinator has no record of the fence id.
        """
        header = SinkFenceQueryHeader(fence_id=fence_id)
        request = RemotingCommand(
            code=RequestCode.SINK_QUERY_FENCE, ext_fields=to_ext_fields(header)
        )
        response = await self._call(coordinator, request)
        return decode_body(response.body, SinkFenceState)

    async def commit(
        self,
        broker_name: str,
        sink_id: str,
        batch_id: int,
        transactions: dict[str, int],
        *,
        generation: int | None = None,
        fence_id: str | None = None,
    ) -> tuple[int, bool]:
        """Make the transactions' rows on one broker visible; returns (rows, was a duplicate)."""
        header = SinkBatchHeader(
            sink_id=sink_id, batch_id=batch_id, generation=generation, fence_id=fence_id
        )
        request = RemotingCommand(
            code=RequestCode.SINK_COMMIT,
            ext_fields=to_ext_fields(header),
            body=encode_body(SinkCommit(transactions)),
        )
        response = await self._call(broker_name, request)
        result = from_ext_fields(SinkCommitResponseHeader, response.ext_fields)
        return result.rows, result.duplicate
