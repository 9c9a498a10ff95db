"""The asyncio driver of one Raft node: clock, storage, transport and the state machine.

One task (`_run`) owns the node. Everything else (peer messages, proposals, reads, transfers,
membership changes, ticks) is queued for it and taken between Ready cycles, so all that arrives
while one fsync runs goes into the next: group commit without a timer. A cycle is etcd raft's:

1. persist the Ready (snapshot, entries, hard state) in a worker thread, fsynced;
2. send its messages (one oneway `RAFT_MESSAGE` remoting request each, through a bounded queue
   and a sender task per peer, so a slow or dead peer never stalls the loop);
3. restore the snapshot / apply the committed entries to the state machine, resolve the
   proposals waiting for them, and the reads whose index is now applied;
4. `advance`, then take an automatic snapshot every `snapshot_interval` applied entries.

Rules:
1. A message leaves only after what it depends on is durable (step 1 before step 2).
2. A proposal resolves with the state machine's result only when its own entry (same index and
   term) is applied here; an entry of another term at its index means it was dropped; a timeout,
   a stop or a snapshot covering it means its outcome is unknown.
3. Nothing a peer sends stops the node: bytes that do not decode close that connection with a
   logged reason; messages beyond the inbox bound are dropped (Raft tolerates loss).
4. `is_leader` turns true once this node leads and has applied its term's first entry, so a
   state machine on a new leader has seen every earlier committed entry when told.
5. The state machine's `snapshot()` runs in the loop: it must be quick (controller state is
   small); `apply` must be deterministic.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ferrymq.errors import (
    NotLeaderError,
    ProposalDroppedError,
    ProposalOutcomeUnknownError,
    ProtocolError,
    RaftTimeoutError,
    RpcError,
)
from ferrymq.raft.config import RaftConfig
from ferrymq.raft.node import RaftNode, Ready, Role
from ferrymq.raft.storage import RaftStorage
from ferrymq.rpc.client import RpcClient
from ferrymq.rpc.connection import Connection
from ferrymq.rpc.deadline import wait_future
from ferrymq.rpc.server import Router
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand
from ferrymq.wire.raft import (
    ConfChange,
    ConfChangeOp,
    EntryKind,
    Message,
    decode_message,
    encode_message,
)

__all__ = ["RaftDriver", "StateMachine"]

log = logging.getLogger(__name__)


class StateMachine(Protocol):
    """What the driver replicates: deterministic `apply`, and whole-state snapshots."""

    def apply(self, index: int, command: bytes) -> object:
        """Apply the committed command at log `index`; the result goes to its proposer."""
        ...

    def snapshot(self) -> bytes:
        """The whole state as bytes (after the last applied command)."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the whole state by a snapshot's bytes."""
        ...


@dataclass(slots=True)
class _PeerLink:
    queue: collections.deque[RemotingCommand] = field(default_factory=collections.deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class RaftDriver:
    """One Raft node on asyncio; start it, register its route, propose."""

    def __init__(
        self,
        node_id: str,
        peers: Mapping[str, str],
        data_dir: Path,
        state_machine: StateMachine,
        config: RaftConfig,
        client: RpcClient | None = None,
    ) -> None:
        """Create a driver (nothing runs until `start`).

        Args:
            node_id: this node's id.
            peers: id -> `host:port` of the members to start with, used until the log or a
                snapshot says otherwise (membership lives in the log). A new cluster: every
                initial member, this node included, the same on every node. A node joining a
                running cluster: the current members without itself, so that it cannot
                campaign before the leader's `add_member` entry reaches it.
            data_dir: where the node's files live (created if missing).
            state_machine: what the log drives.
            config: timings and sizes.
            client: the RPC client to reach peers with (one is made and owned if None).
        """
        self.node_id = node_id
        self._peers = dict(peers)
        self._state_machine = state_machine
        self._config = config
        self._storage = RaftStorage(data_dir)
        self._client = client
        self._owns_client = client is None
        self._node: RaftNode | None = None
        self._inbox: collections.deque[Message] = collections.deque()
        self._commands: collections.deque[Callable[[RaftNode], None]] = collections.deque()
        self._pending_ticks = 0
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._run_task: asyncio.Task[None] | None = None
        self._tick_task: asyncio.Task[None] | None = None
        self._links: dict[str, _PeerLink] = {}
        self._proposals: dict[int, tuple[int, asyncio.Future[object]]] = {}
        self._reads: dict[bytes, asyncio.Future[None]] = {}
        self._read_waits: list[tuple[int, asyncio.Future[None]]] = []
        self._transfers: list[tuple[str, asyncio.Future[None]]] = []
        self._read_contexts = itertools.count(1)
        self._role_callbacks: list[Callable[[bool], None]] = []
        self._leader_ready = False
        self._leader_first_index = 0
        self._last_role = Role.FOLLOWER
        self._warned_receivers: set[str] = set()
        self.is_leader = False
        """Whether this node leads and has applied its term's first entry."""
        self.leader_changes = 0
        """How many times the leader this node knows of changed (its first one included)."""
        self._last_leader: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def register(self, router: Router) -> None:
        """Route `RAFT_MESSAGE` requests on `router` (the controller port's) to this node."""
        router.add(RequestCode.RAFT_MESSAGE, self._handle)

    async def start(self) -> None:
        """Recover from the data directory and start ticking."""
        stored = await asyncio.to_thread(self._storage.open)
        self._node = RaftNode(
            self.node_id,
            self._config,
            random.Random(),
            members=self._peers,
            hard_state=stored.hard_state,
            snapshot=stored.snapshot,
            entries=stored.entries,
        )
        if stored.snapshot is not None:
            self._state_machine.restore(stored.snapshot.data)
        if self._client is None:
            self._client = RpcClient()
        log.info(
            "raft %s: starting at term %d, snapshot %d, log %d..%d, commit %d, members %s",
            self.node_id,
            self._node.term,
            self._node.log.snapshot.index,
            self._node.log.first_index,
            self._node.log.last_index,
            self._node.commit_index,
            sorted(self._node.members),
        )
        self._run_task = asyncio.get_running_loop().create_task(self._run())
        self._tick_task = asyncio.get_running_loop().create_task(self._tick())
        self._wakeup.set()

    async def stop(self) -> None:
        """Stop ticking, finish the Ready cycle in progress, close the files and connections."""
        if self._node is None or self._stopping:
            return
        self._stopping = True
        self._wakeup.set()
        if self._tick_task is not None:
            self._tick_task.cancel()
            await asyncio.gather(self._tick_task, return_exceptions=True)
        if self._run_task is not None:
            await asyncio.gather(self._run_task, return_exceptions=True)
        links = [link.task for link in self._links.values() if link.task is not None]
        for task in links:
            task.cancel()
        await asyncio.gather(*links, return_exceptions=True)
        self._fail_waiters("the Raft driver stopped")
        await asyncio.to_thread(self._storage.close)
        if self._owns_client and self._client is not None:
            await self._client.close()
        if self.is_leader:
            self.is_leader = False
            self._notify_role(False)

    # ------------------------------------------------------------------ API

    @property
    def node(self) -> RaftNode:
        """The pure node (for status and tests; mutate it only through the driver)."""
        if self._node is None:
            raise RuntimeError("the Raft driver is not started")
        return self._node

    @property
    def leader_id(self) -> str | None:
        """The leader this node knows of."""
        return self._node.leader_id if self._node else None

    @property
    def leader_addr(self) -> str | None:
        """The leader's `host:port`."""
        leader = self.leader_id
        return None if leader is None else self._address_of(leader)

    @property
    def term(self) -> int:
        """The current term."""
        return self._node.term if self._node else 0

    @property
    def commit_index(self) -> int:
        """The highest index known committed."""
        return self._node.commit_index if self._node else 0

    @property
    def applied_index(self) -> int:
        """The highest index applied to the state machine."""
        return self._node.applied_index if self._node else 0

    @property
    def members(self) -> dict[str, str]:
        """Member id -> address, as the log says now."""
        return dict(self._node.members) if self._node else dict(self._peers)

    def on_role_change(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(True)` when this node becomes a ready leader, `(False)` when it stops."""
        self._role_callbacks.append(callback)

    async def propose(self, command: bytes, timeout: float) -> object:
        """Replicate `command`; returns what the state machine's `apply` returned for it.

        Raises:
            NotLeaderError: this node is not the leader (says who is).
            ProposalDroppedError: surely not applied; proposing again is safe.
            ProposalOutcomeUnknownError: not applied here within `timeout` (or the driver
                stopped); it may still be applied.
            Exception: whatever the state machine's `apply` raised for it.
        """
        return await self._propose(lambda node: node.propose(command), timeout)

    async def read_index(self, timeout: float) -> None:
        """Return once this node has applied everything committed before the call (thesis 6.4).

        Raises:
            NotLeaderError: this node is not (or stopped being) the leader.
            RaftTimeoutError: leadership was not confirmed within `timeout`.
        """
        self._check_leader()
        context = next(self._read_contexts).to_bytes(8, "big")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def run(node: RaftNode) -> None:
            try:
                node.read_index(context)
            except NotLeaderError as exc:
                _fail(future, exc)
                return
            self._reads[context] = future

        self._submit(run)
        try:
            await wait_future(future, timeout)
        except TimeoutError:
            raise RaftTimeoutError("read index", timeout) from None
        finally:
            self._reads.pop(context, None)

    async def transfer_leadership(self, target_id: str, timeout: float) -> None:
        """Hand leadership to `target_id` and return once it leads (as this node knows).

        Raises:
            NotLeaderError: this node is not the leader.
            ProposalDroppedError: `target_id` is not a member.
            RaftTimeoutError: the target did not take over within `timeout`.
        """
        if target_id == self.node_id and self.node.is_leader:
            return
        self._check_leader()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def run(node: RaftNode) -> None:
            try:
                node.transfer_leader(target_id)
            except (NotLeaderError, ProposalDroppedError) as exc:
                _fail(future, exc)
                return
            self._transfers.append((target_id, future))

        self._submit(run)
        try:
            await wait_future(future, timeout)
        except TimeoutError:
            raise RaftTimeoutError(f"leadership transfer to {target_id}", timeout) from None

    async def add_member(self, node_id: str, addr: str, timeout: float) -> None:
        """Add a voting member (or change its address); returns once the change is applied here.

        Raises:
            NotLeaderError, ProposalDroppedError, ProposalOutcomeUnknownError: as `propose`
                (dropped also while another membership change is in progress).
        """
        if self.node.members.get(node_id) == addr:
            return
        change = ConfChange(ConfChangeOp.ADD, node_id, addr)
        await self._propose(lambda node: node.propose_conf_change(change), timeout)

    async def remove_member(self, node_id: str, timeout: float) -> None:
        """Remove a voting member; returns once the change is applied here.

        Raises:
            NotLeaderError, ProposalDroppedError, ProposalOutcomeUnknownError: as `propose`.
        """
        if node_id not in self.node.members:
            return
        change = ConfChange(ConfChangeOp.REMOVE, node_id)
        await self._propose(lambda node: node.propose_conf_change(change), timeout)

    def status(self) -> dict[str, object]:
        """What an operator wants to see about this node (JSON-friendly)."""
        node = self.node
        status: dict[str, object] = {
            "id": self.node_id,
            "role": node.role.value,
            "term": node.term,
            "leader": node.leader_id,
            "leaderAddr": self.leader_addr,
            "isLeaderReady": self.is_leader,
            "commitIndex": node.commit_index,
            "appliedIndex": node.applied_index,
            "firstIndex": node.log.first_index,
            "lastIndex": node.log.last_index,
            "snapshotIndex": node.log.snapshot.index,
            "members": dict(node.members),
        }
        if node.is_leader:
            status["followers"] = {
                member: {
                    "match": progress.match_index,
                    "next": progress.next_index,
                    "state": progress.state.value,
                    "active": progress.recent_active,
                }
                for member, progress in node.progress.items()
                if member != self.node_id
            }
            status["transferringTo"] = node.lead_transferee
        return status

    # ------------------------------------------------------------------ internals: API

    def _check_leader(self) -> None:
        node = self.node
        if self._stopping:
            raise NotLeaderError(None, None, "the Raft driver is stopping")
        if not node.is_leader:
            raise NotLeaderError(node.leader_id, self.leader_addr)

    def _submit(self, command: Callable[[RaftNode], None]) -> None:
        self._commands.append(command)
        self._wakeup.set()

    async def _propose(self, append: Callable[[RaftNode], int], timeout: float) -> object:
        self._check_leader()
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        def run(node: RaftNode) -> None:
            try:
                index = append(node)
            except (NotLeaderError, ProposalDroppedError) as exc:
                _fail(future, exc)
                return
            self._proposals[index] = (node.term, future)

        self._submit(run)
        try:
            return await wait_future(future, timeout)
        except TimeoutError:
            raise ProposalOutcomeUnknownError(f"not applied within {timeout:g} s") from None

    def _fail_waiters(self, reason: str) -> None:
        for _, future in self._proposals.values():
            _fail(future, ProposalOutcomeUnknownError(reason))
        self._proposals.clear()
        barriers = [
            *self._reads.values(),
            *(future for _, future in self._read_waits),
            *(future for _, future in self._transfers),
        ]
        for barrier in barriers:
            _fail(barrier, NotLeaderError(None, None, reason))
        self._reads.clear()
        self._read_waits.clear()
        self._transfers.clear()
        while self._commands:
            self._commands.popleft()

    # ------------------------------------------------------------------ internals: the loop

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._config.tick_interval)
            self._pending_ticks += 1
            self._wakeup.set()

    async def _run(self) -> None:
        node = self.node
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self._stopping:
                break
            self._drain(node)
            while node.has_ready() and not self._stopping:
                ready = node.ready()
                if ready.must_persist:
                    await asyncio.to_thread(
                        self._storage.persist, ready.hard_state, ready.entries, ready.snapshot
                    )
                self._send(ready)
                self._apply(ready)
                node.advance(ready)
                await self._maybe_snapshot(node)
                self._drain(node)
            self._publish_state(node)

    def _drain(self, node: RaftNode) -> None:
        ticks, self._pending_ticks = self._pending_ticks, 0
        for _ in range(ticks):
            node.tick()
        while self._inbox:
            message = self._inbox.popleft()
            try:
                node.step(message)
            except AssertionError as exc:
                # Only a peer that broke Raft's rules (a wiped data directory rejoining under its
                # old id, another cluster on the same port) gets here; the node checks before it
                # changes anything, so dropping the message keeps this node safe.
                log.error(
                    "raft %s: dropped %s from %s: %s",
                    self.node_id,
                    type(message).__name__,
                    message.sender,
                    exc,
                )
        while self._commands:
            self._commands.popleft()(node)
        self._publish_state(node)

    def _apply(self, ready: Ready) -> None:
        if ready.snapshot is not None:
            self._state_machine.restore(ready.snapshot.data)
            for index in [i for i in self._proposals if i <= ready.snapshot.index]:
                _, future = self._proposals.pop(index)
                _fail(future, ProposalOutcomeUnknownError("a snapshot replaced the log"))
        for entry in ready.committed:
            result: object = None
            error: Exception | None = None
            if entry.kind is EntryKind.COMMAND:
                try:
                    result = self._state_machine.apply(entry.index, entry.data)
                except Exception as exc:
                    log.exception("raft %s: applying entry %d failed", self.node_id, entry.index)
                    error = exc
            waiter = self._proposals.pop(entry.index, None)
            if waiter is None or waiter[1].done():
                continue
            term, future = waiter
            if term != entry.term:
                future.set_exception(
                    ProposalDroppedError(
                        f"entry {entry.index} was replaced by one of term {entry.term}"
                    )
                )
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        for read in ready.read_states:
            confirmed = self._reads.pop(read.context, None)
            if confirmed is not None and not confirmed.done():
                self._read_waits.append((read.index, confirmed))
        if self._read_waits:
            applied = max(
                self.node.applied_index,
                ready.committed[-1].index if ready.committed else 0,
                ready.snapshot.index if ready.snapshot else 0,
            )
            waiting: list[tuple[int, asyncio.Future[None]]] = []
            for index, barrier in self._read_waits:
                if index > applied:
                    waiting.append((index, barrier))
                elif not barrier.done():
                    barrier.set_result(None)
            self._read_waits = waiting

    async def _maybe_snapshot(self, node: RaftNode) -> None:
        interval = self._config.snapshot_interval
        if not interval or node.applied_index - node.log.snapshot.index < interval:
            return
        snapshot = node.compact(node.applied_index, self._state_machine.snapshot())
        await asyncio.to_thread(self._storage.compact, snapshot)
        log.info("raft %s: snapshot at index %d", self.node_id, snapshot.index)

    def _publish_state(self, node: RaftNode) -> None:
        role = node.role
        if node.leader_id is not None and node.leader_id != self._last_leader:
            self._last_leader = node.leader_id
            self.leader_changes += 1
        if role is not self._last_role:
            if role is Role.LEADER:
                self._leader_first_index = node.log.last_index
                log.info("raft %s: leader of term %d", self.node_id, node.term)
            elif self._last_role is Role.LEADER:
                log.info("raft %s: no longer leader (term %d)", self.node_id, node.term)
                for future in self._reads.values():
                    _fail(future, NotLeaderError(node.leader_id, self.leader_addr))
                self._reads.clear()
            self._last_role = role
        ready = role is Role.LEADER and node.applied_index >= self._leader_first_index
        if ready != self.is_leader:
            self.is_leader = ready
            self._notify_role(ready)
        if self._transfers and node.leader_id is not None:
            remaining = []
            for target, future in self._transfers:
                if future.done():
                    continue
                if node.leader_id == target:
                    future.set_result(None)
                else:
                    remaining.append((target, future))
            self._transfers = remaining

    def _notify_role(self, is_leader: bool) -> None:
        for callback in self._role_callbacks:
            try:
                callback(is_leader)
            except Exception:
                log.exception("raft %s: role change callback failed", self.node_id)

    # ------------------------------------------------------------------ internals: transport

    def _address_of(self, node_id: str) -> str | None:
        if self._node is not None:
            address = self._node.members.get(node_id)
            if address:
                return address
        return self._peers.get(node_id)

    def _send(self, ready: Ready) -> None:
        for message in ready.messages:
            link = self._links.get(message.receiver)
            if link is None:
                link = self._links[message.receiver] = _PeerLink()
                link.task = asyncio.get_running_loop().create_task(
                    self._sender(message.receiver, link)
                )
            if len(link.queue) >= self._config.max_outbox_per_peer:
                continue  # dropped: the peer is not keeping up, Raft will resend
            link.queue.append(
                RemotingCommand(code=RequestCode.RAFT_MESSAGE, body=encode_message(message))
            )
            link.ready.set()

    async def _sender(self, peer_id: str, link: _PeerLink) -> None:
        assert self._client is not None
        while True:
            await link.ready.wait()
            link.ready.clear()
            while link.queue:
                command = link.queue.popleft()
                address = self._address_of(peer_id)
                if address is None:
                    continue
                try:
                    async with asyncio.timeout(self._config.send_timeout):
                        await self._client.oneway(address, command)
                except (RpcError, TimeoutError) as exc:
                    log.debug("raft %s: cannot send to %s: %s", self.node_id, peer_id, exc)
                    link.queue.clear()

    async def _handle(self, conn: Connection, request: RemotingCommand) -> RemotingCommand | None:
        """RAFT_MESSAGE: one Raft message from a peer, queued for the node (oneway)."""
        try:
            message = decode_message(request.body)
        except ProtocolError as exc:
            log.warning("raft %s: closing connection from %s: %s", self.node_id, conn.peer, exc)
            conn.close()
            return None
        if message.receiver != self.node_id:
            if message.sender not in self._warned_receivers:
                self._warned_receivers.add(message.sender)
                log.warning(
                    "raft %s: %s (%s) sends messages for %s; dropped",
                    self.node_id,
                    message.sender,
                    conn.peer,
                    message.receiver,
                )
            return None
        if self._node is None or self._stopping or len(self._inbox) >= self._config.max_inbox:
            return None
        if self._client is not None:
            address = self._address_of(message.sender)
            if address is not None:
                self._client.forget_backoff(address)
        self._inbox.append(message)
        self._wakeup.set()
        return None


def _fail(future: asyncio.Future[object] | asyncio.Future[None], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
