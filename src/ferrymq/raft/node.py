"""One Raft node as a pure state machine, shaped like etcd raft's RawNode.

Inputs: `tick()` (the only clock), `step(message)`, `propose(data)`, `propose_conf_change(...)`,
`read_index(context)`, `transfer_leader(to)`, `compact(index, data)`. Output: `ready()`, a `Ready`
the caller processes in this order, then acknowledges with `advance(ready)`:

1. persist `snapshot`, then `entries` (an entry whose index is already stored replaces that
   entry and everything after it), then `hard_state`, all durably (fsync);
2. send `messages` (never before step 1: a vote or an acknowledgement must survive a crash);
3. restore the state machine from `snapshot`, apply `committed` in order;
4. serve `read_states` once the applied index reaches their index.

Implements the Raft paper (Ongaro and Ousterhout 2014) figure 2 and the thesis (Ongaro 2014):
- elections with pre-vote (thesis 9.6) and check-quorum with leader stickiness (thesis 9.6,
  etcd): a node that heard from a leader within an election timeout ignores vote requests, and a
  leader that did not hear from a majority for an election timeout steps down;
- a randomized election timeout in [election_ticks, 2 * election_ticks) drawn from an injected RNG;
- replication with a conflict hint per rejection (fast back-off, thesis 5.4.1 end), pipelining in
  REPLICATE state (`progress`);
- commit only of entries of the leader's own term, counted on a majority (paper 5.4.2); a new
  leader appends a NOOP entry so it can commit at once;
- snapshots and compaction (paper 7), InstallSnapshot in chunks for followers behind the log;
- ReadIndex reads (thesis 6.4): the commit index, confirmed by a heartbeat round to a majority,
  only after the leader committed an entry of its term;
- leadership transfer with TimeoutNow (thesis 3.10);
- single-server membership changes (thesis 4.1-4.3): a change is in effect as soon as it is
  appended (committed or not) and undone if its entry is truncated; the leader accepts one only
  when the previous one is committed and it has committed an entry of its own term (the fix of
  Ongaro's 2015 raft-dev note); a removed leader keeps leading until the change commits, then
  hands over with TimeoutNow and steps down.

Rules:
1. No I/O, no clock, no randomness but the injected `random.Random`.
2. A node never counts its own unpersisted entries: its own match index is the stable index,
   moved in `advance`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from ferrymq.errors import NotLeaderError, ProposalDroppedError
from ferrymq.raft.config import RaftConfig
from ferrymq.raft.log import HardState, RaftLog, Snapshot
from ferrymq.raft.progress import Progress, ProgressState
from ferrymq.wire.raft import (
    AppendRequest,
    AppendResponse,
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    InstallSnapshotResponse,
    Message,
    ReadIndexRequest,
    ReadIndexResponse,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
    encode_conf_change,
)

__all__ = ["RaftNode", "ReadState", "Ready", "Role"]


class Role(StrEnum):
    """A node's role (paper figure 4, plus the pre-vote round)."""

    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read named `context` may be served once `index` is applied."""

    index: int
    context: bytes


@dataclass(frozen=True, slots=True)
class Ready:
    """Work for the caller: persist, send, apply (in that order), then `advance`."""

    hard_state: HardState | None = None
    entries: tuple[Entry, ...] = ()
    snapshot: Snapshot | None = None
    committed: tuple[Entry, ...] = ()
    messages: tuple[Message, ...] = ()
    read_states: tuple[ReadState, ...] = ()

    @property
    def must_persist(self) -> bool:
        """Whether anything must be made durable before the messages are sent."""
        return self.hard_state is not None or bool(self.entries) or self.snapshot is not None


class _Head(TypedDict):
    term: int
    sender: str
    receiver: str


@dataclass(slots=True)
class _PendingRead:
    context: bytes
    index: int
    seq: int
    requester: str


@dataclass(slots=True)
class _IncomingSnapshot:
    key: tuple[int, str, int]
    data: bytearray = field(default_factory=bytearray)


class RaftNode:
    """A Raft node: feed it ticks, messages and proposals; take its `Ready` output."""

    def __init__(
        self,
        node_id: str,
        config: RaftConfig,
        rng: random.Random,
        *,
        members: Mapping[str, str],
        hard_state: HardState | None = None,
        snapshot: Snapshot | None = None,
        entries: Sequence[Entry] = (),
    ) -> None:
        """Create a node from what its storage holds (nothing on a first start).

        Args:
            node_id: this node's id.
            config: tick counts and sizes.
            rng: the only source of randomness (election timeouts).
            members: id -> address of the initial members; used only when there is no snapshot
                (afterwards membership comes from the snapshot and the log).
            hard_state: term, vote and commit index as persisted.
            snapshot: the latest persisted snapshot.
            entries: the persisted entries after the snapshot.
        """
        self.node_id = node_id
        self._config = config
        self._rng = rng
        hard_state = hard_state or HardState()
        base = snapshot or Snapshot(0, 0, dict(members), b"")
        self.log = RaftLog(base, entries)
        self.log.commit_index = min(max(hard_state.commit_index, base.index), self.log.last_index)
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.leader_id: str | None = None
        self.role = Role.FOLLOWER
        self._step_role: Callable[[Message], None] = self._step_follower
        self._prev_hard_state = HardState(self.term, self.vote, self.log.commit_index)
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = config.election_ticks
        self._votes: dict[str, bool] = {}
        self.progress: dict[str, Progress] = {}
        self.lead_transferee: str | None = None
        self._messages: list[Message] = []
        self._read_states: list[ReadState] = []
        self._pending_reads: list[_PendingRead] = []
        self._reads_awaiting_commit: list[tuple[bytes, str]] = []
        self._read_seq = 0
        self._pending_snapshot: Snapshot | None = None
        self._incoming_snapshot: _IncomingSnapshot | None = None
        self._reset_randomized_timeout()

    # ------------------------------------------------------------------ read-only views

    @property
    def members(self) -> dict[str, str]:
        """Member id -> address, as of the latest membership entry in the log."""
        return self.log.members

    @property
    def is_leader(self) -> bool:
        """Whether this node is the leader."""
        return self.role is Role.LEADER

    @property
    def leader_address(self) -> str | None:
        """The address of the leader this node knows of."""
        if self.leader_id is None:
            return None
        return self.members.get(self.leader_id)

    @property
    def commit_index(self) -> int:
        """The highest index known to be committed."""
        return self.log.commit_index

    @property
    def applied_index(self) -> int:
        """The highest index handed out for applying and acknowledged by `advance`."""
        return self.log.applied_index

    @property
    def is_promotable(self) -> bool:
        """Whether this node may campaign: it is a member and has no snapshot to apply."""
        return self.node_id in self.members and self._pending_snapshot is None

    @property
    def hard_state(self) -> HardState:
        """The current term, vote and commit index."""
        return HardState(self.term, self.vote, self.log.commit_index)

    def has_committed_in_term(self) -> bool:
        """Whether the commit index is at an entry of the current term (leader's first commit)."""
        return self.log.term_at(self.log.commit_index) == self.term

    # ------------------------------------------------------------------ inputs

    def tick(self) -> None:
        """Advance the node's clock by one tick."""
        if self.role is Role.LEADER:
            self._tick_leader()
        else:
            self._tick_election()

    def propose(self, data: bytes) -> int:
        """Append a command; returns its index (in the current `term`).

        Raises:
            NotLeaderError: this node is not the leader.
            ProposalDroppedError: a leadership transfer is in progress, or this leader is being
                removed.
        """
        return self._propose(EntryKind.COMMAND, data)

    def propose_conf_change(self, change: ConfChange) -> int:
        """Append a change adding or removing one member; returns its index.

        Raises:
            NotLeaderError: this node is not the leader.
            ProposalDroppedError: another change is not committed yet, the leader has not
                committed an entry of its term, or the change would do nothing or leave no member.
        """
        self._check_can_propose()
        if self.log.last_conf_index > self.log.commit_index:
            raise ProposalDroppedError("the previous membership change is not committed yet")
        if not self.has_committed_in_term():
            raise ProposalDroppedError("the leader has not committed an entry of its term yet")
        members = self.members
        if change.op is ConfChangeOp.REMOVE:
            if change.node_id not in members:
                raise ProposalDroppedError(f"{change.node_id} is not a member")
            if len(members) == 1:
                raise ProposalDroppedError("cannot remove the last member")
        elif members.get(change.node_id) == change.address:
            raise ProposalDroppedError(f"{change.node_id} is already a member at {change.address}")
        return self._propose(EntryKind.CONF_CHANGE, encode_conf_change(change))

    def read_index(self, context: bytes) -> None:
        """Ask for a linearizable read index; a `ReadState` with `context` comes in a Ready.

        On a follower the request goes to the leader. A read that cannot be confirmed (the
        leader changes) produces no ReadState: the caller times out.

        Raises:
            NotLeaderError: no leader is known.
        """
        if self.role is Role.LEADER:
            self._leader_read(context, self.node_id)
        elif self.leader_id is not None:
            self._send(ReadIndexRequest(**self._head(self.leader_id), context=context))
        else:
            raise NotLeaderError(None, None)

    def transfer_leader(self, target_id: str) -> None:
        """Hand leadership to `target_id` (thesis 3.10); proposals are refused until it ends.

        The transfer ends when the target wins, or is abandoned after an election timeout.

        Raises:
            NotLeaderError: this node is not the leader.
            ProposalDroppedError: the target is not a member.
        """
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.leader_id, self.leader_address)
        if target_id == self.node_id:
            return
        if target_id not in self.members or target_id not in self.progress:
            raise ProposalDroppedError(f"{target_id} is not a member")
        self.lead_transferee = target_id
        self._election_elapsed = 0
        progress = self.progress[target_id]
        if progress.match_index == self.log.last_index:
            self._send(TimeoutNow(**self._head(target_id)))
        else:
            self._send_append(target_id)

    def compact(self, index: int, data: bytes) -> Snapshot:
        """Take a snapshot at the applied `index` with the state machine's bytes; compact the log.

        Returns:
            The snapshot, for the caller to persist (then drop stored entries up to `index`).
        """
        return self.log.compact(index, data)

    def step(self, message: Message) -> None:
        """Process one message from a peer."""
        if message.receiver != self.node_id:
            return
        if message.term > self.term:
            if isinstance(message, VoteRequest):
                in_lease = (
                    self._config.check_quorum
                    and self.leader_id is not None
                    and self._election_elapsed < self._config.election_ticks
                )
                if in_lease and not message.transfer:
                    return  # leader stickiness: a live leader is not deposed (thesis 9.6)
            if isinstance(message, VoteRequest) and message.pre_vote:
                pass  # a pre-vote never changes our term
            elif isinstance(message, VoteResponse) and message.pre_vote and message.granted:
                pass  # granted pre-votes carry the term we would campaign in
            else:
                leader = (
                    message.sender
                    if isinstance(message, AppendRequest | Heartbeat | InstallSnapshot)
                    else None
                )
                self._become_follower(message.term, leader)
        elif message.term < self.term:
            if (self._config.check_quorum or self._config.pre_vote) and isinstance(
                message, AppendRequest | Heartbeat
            ):
                # A leader cut off (and at a lower term) learns the new term and steps down.
                self._send(
                    AppendResponse(**self._head(message.sender), success=False, match_index=0)
                )
            elif isinstance(message, VoteRequest) and message.pre_vote:
                self._send(VoteResponse(**self._head(message.sender), granted=False, pre_vote=True))
            return
        if isinstance(message, VoteRequest):
            self._handle_vote_request(message)
        else:
            self._step_role(message)

    # ------------------------------------------------------------------ output

    def has_ready(self) -> bool:
        """Whether `ready()` has anything to do."""
        return bool(
            self._messages
            or self._read_states
            or self._pending_snapshot is not None
            or self.log.stable_index < self.log.last_index
            or self.hard_state != self._prev_hard_state
            or self.log.applied_index < self.log.commit_index
        )

    def ready(self) -> Ready:
        """Take the work to do now; call `advance` with it when done."""
        hard_state = self.hard_state
        snapshot = self._pending_snapshot
        ready = Ready(
            hard_state=hard_state if hard_state != self._prev_hard_state else None,
            entries=tuple(self.log.unstable_entries()),
            snapshot=snapshot,
            committed=(
                tuple(self.log.committed_to_apply(self._config.max_committed_per_ready))
                if snapshot is None
                else ()
            ),
            messages=tuple(self._messages),
            read_states=tuple(self._read_states),
        )
        self._messages = []
        self._read_states = []
        return ready

    def advance(self, ready: Ready) -> None:
        """Acknowledge that `ready` was persisted, sent and applied."""
        if ready.hard_state is not None:
            self._prev_hard_state = ready.hard_state
        if ready.snapshot is not None and ready.snapshot is self._pending_snapshot:
            self._pending_snapshot = None
            self.log.applied_index = max(self.log.applied_index, ready.snapshot.index)
        if ready.entries:
            last = ready.entries[-1]
            self.log.stable_to(last.index, last.term)
        if ready.committed:
            self.log.applied_to(ready.committed[-1].index)
        if self.role is Role.LEADER:
            own = self.progress.get(self.node_id)
            if own is not None and own.maybe_update(self.log.stable_index) and self._maybe_commit():
                self._broadcast_append()

    # ------------------------------------------------------------------ roles

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
        self.leader_id = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._reset_randomized_timeout()
        self._votes = {}
        self.progress = {}
        self.lead_transferee = None
        self._pending_reads = []
        self._reads_awaiting_commit = []

    def _reset_randomized_timeout(self) -> None:
        ticks = self._config.election_ticks
        self._randomized_timeout = ticks + self._rng.randrange(ticks)

    def _become_follower(self, term: int, leader_id: str | None) -> None:
        self._reset(term)
        self.leader_id = leader_id
        self.role = Role.FOLLOWER
        self._step_role = self._step_follower

    def _become_pre_candidate(self) -> None:
        # Term and vote stay: a pre-vote changes nothing a real election would (thesis 9.6).
        self._votes = {}
        self.leader_id = None
        self.progress = {}
        self.lead_transferee = None
        self._pending_reads = []
        self._reads_awaiting_commit = []
        self.role = Role.PRE_CANDIDATE
        self._step_role = self._step_candidate

    def _become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.vote = self.node_id
        self.role = Role.CANDIDATE
        self._step_role = self._step_candidate

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.leader_id = self.node_id
        self.role = Role.LEADER
        self._step_role = self._step_leader
        last = self.log.last_index
        for member in self.members:
            self.progress[member] = Progress(next_index=last + 1)
        own = self.progress.get(self.node_id)
        if own is not None:
            own.maybe_update(self.log.stable_index)
            own.become_replicate()
        # Paper 5.4.2 / 8: an entry of the new term lets earlier entries commit at once.
        self.log.append([Entry(self.term, last + 1, EntryKind.NOOP)])
        self._broadcast_append()

    def _campaign(self, *, pre_vote: bool, transfer: bool = False) -> None:
        if pre_vote:
            self._become_pre_candidate()
            vote_term = self.term + 1
        else:
            self._become_candidate()
            vote_term = self.term
        self._votes[self.node_id] = True
        if self._tally() == "won":
            if pre_vote:
                self._campaign(pre_vote=False)
            else:
                self._become_leader()
            return
        for member in self.members:
            if member == self.node_id:
                continue
            self._send(
                VoteRequest(
                    term=vote_term,
                    sender=self.node_id,
                    receiver=member,
                    last_log_index=self.log.last_index,
                    last_log_term=self.log.last_term,
                    pre_vote=pre_vote,
                    transfer=transfer,
                )
            )

    def _tally(self) -> str:
        members = self.members
        granted = sum(1 for member, yes in self._votes.items() if yes and member in members)
        refused = sum(1 for member, yes in self._votes.items() if not yes and member in members)
        quorum = len(members) // 2 + 1
        if granted >= quorum:
            return "won"
        if refused >= quorum:
            return "lost"
        return "pending"

    # ------------------------------------------------------------------ ticks

    def _tick_election(self) -> None:
        self._election_elapsed += 1
        if self.is_promotable and self._election_elapsed >= self._randomized_timeout:
            self._election_elapsed = 0
            self._campaign(pre_vote=self._config.pre_vote)

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self._config.election_ticks:
            self._election_elapsed = 0
            if self._config.check_quorum:
                if not self._quorum_active():
                    self._become_follower(self.term, None)  # thesis 6.2: step down
                    return
                for member, progress in self.progress.items():
                    if member != self.node_id:
                        progress.recent_active = False
            self.lead_transferee = None  # a transfer that took an election timeout is abandoned
        if self._heartbeat_elapsed >= self._config.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            self._broadcast_heartbeat()

    def _quorum_active(self) -> bool:
        members = self.members
        active = sum(
            1
            for member in members
            if member == self.node_id
            or (member in self.progress and self.progress[member].recent_active)
        )
        return active >= len(members) // 2 + 1

    # ------------------------------------------------------------------ step per role

    def _handle_vote_request(self, message: VoteRequest) -> None:
        can_vote = (
            self.vote == message.sender
            or (self.vote is None and self.leader_id is None)
            or (message.pre_vote and message.term > self.term)
        )
        if can_vote and self.log.is_up_to_date(message.last_log_index, message.last_log_term):
            self._send(
                VoteResponse(
                    term=message.term,
                    sender=self.node_id,
                    receiver=message.sender,
                    granted=True,
                    pre_vote=message.pre_vote,
                )
            )
            if not message.pre_vote:
                self._election_elapsed = 0
                self.vote = message.sender
        else:
            self._send(
                VoteResponse(**self._head(message.sender), granted=False, pre_vote=message.pre_vote)
            )

    def _step_follower(self, message: Message) -> None:
        if isinstance(message, AppendRequest | Heartbeat | InstallSnapshot):
            self._election_elapsed = 0
            self.leader_id = message.sender
            self._handle_from_leader(message)
        elif isinstance(message, TimeoutNow):
            if self.is_promotable:
                self._campaign(pre_vote=False, transfer=True)
        elif isinstance(message, ReadIndexResponse):
            self._read_states.append(ReadState(message.read_index, message.context))

    def _step_candidate(self, message: Message) -> None:
        if isinstance(message, AppendRequest | Heartbeat | InstallSnapshot):
            self._become_follower(message.term, message.sender)
            self._handle_from_leader(message)
        elif isinstance(message, VoteResponse):
            if message.pre_vote != (self.role is Role.PRE_CANDIDATE):
                return
            self._votes.setdefault(message.sender, message.granted)
            outcome = self._tally()
            if outcome == "won":
                if self.role is Role.PRE_CANDIDATE:
                    self._campaign(pre_vote=False)
                else:
                    self._become_leader()
            elif outcome == "lost":
                self._become_follower(self.term, None)

    def _step_leader(self, message: Message) -> None:
        if isinstance(message, ReadIndexRequest):
            self._leader_read(message.context, message.sender)
            return
        progress = self.progress.get(message.sender)
        if progress is None:
            return
        if isinstance(message, AppendResponse):
            progress.recent_active = True
            self._handle_append_response(message, progress)
        elif isinstance(message, HeartbeatResponse):
            progress.recent_active = True
            progress.probe_sent = False
            progress.snapshot_sent = False
            if (
                progress.state is ProgressState.REPLICATE
                and len(progress.inflight) >= self._config.max_inflight_appends
            ):
                # The window may be full of appends that were lost: let one more through, whose
                # rejection (if the gap is real) sends the follower back to probing.
                progress.inflight.popleft()
            if (
                progress.match_index < self.log.last_index
                or progress.state is ProgressState.SNAPSHOT
            ):
                self._send_append(message.sender)
            if message.read_seq > progress.read_seq:
                progress.read_seq = message.read_seq
                self._release_confirmed_reads()
        elif isinstance(message, InstallSnapshotResponse):
            progress.recent_active = True
            self._handle_snapshot_response(message, progress)

    # ------------------------------------------------------------------ follower side

    def _handle_from_leader(self, message: AppendRequest | Heartbeat | InstallSnapshot) -> None:
        if isinstance(message, AppendRequest):
            self._handle_append(message)
        elif isinstance(message, Heartbeat):
            self.log.commit_to(min(message.commit_index, self.log.last_index))
            self._send(HeartbeatResponse(**self._head(message.sender), read_seq=message.read_seq))
        else:
            self._handle_snapshot_chunk(message)

    def _handle_append(self, message: AppendRequest) -> None:
        log = self.log
        if message.prev_log_index < log.commit_index:
            # Everything up to our commit index matches any leader's log (paper 5.4.3).
            self._send(
                AppendResponse(
                    **self._head(message.sender), success=True, match_index=log.commit_index
                )
            )
            return
        last_new = log.maybe_append(message.prev_log_index, message.prev_log_term, message.entries)
        if last_new is not None:
            log.commit_to(min(message.commit_index, last_new))
            self._send(
                AppendResponse(**self._head(message.sender), success=True, match_index=last_new)
            )
            return
        hint_index = log.find_conflict_by_term(
            min(message.prev_log_index, log.last_index), message.prev_log_term
        )
        self._send(
            AppendResponse(
                **self._head(message.sender),
                success=False,
                match_index=message.prev_log_index,
                conflict_index=hint_index,
                conflict_term=log.term_at(hint_index) or 0,
            )
        )

    def _handle_snapshot_chunk(self, message: InstallSnapshot) -> None:
        log = self.log
        if message.snapshot_index <= log.commit_index:
            self._send(
                AppendResponse(
                    **self._head(message.sender), success=True, match_index=log.commit_index
                )
            )
            return
        key = (message.term, message.sender, message.snapshot_index)
        incoming = self._incoming_snapshot
        if incoming is None or incoming.key != key:
            if message.chunk_offset != 0:
                self._send_snapshot_progress(message, 0)
                return
            incoming = self._incoming_snapshot = _IncomingSnapshot(key)
        held = len(incoming.data)
        if message.chunk_offset > held:
            self._send_snapshot_progress(message, held)
            return
        end = message.chunk_offset + len(message.chunk)
        if end > held:
            incoming.data += message.chunk[held - message.chunk_offset :]
        if len(incoming.data) < message.total_bytes:
            self._send_snapshot_progress(message, len(incoming.data))
            return
        self._incoming_snapshot = None
        if log.matches(message.snapshot_index, message.snapshot_term):
            # Our log already holds the snapshot's last entry: keep what follows (paper 7).
            log.commit_to(message.snapshot_index)
            self._send(
                AppendResponse(
                    **self._head(message.sender),
                    success=True,
                    match_index=message.snapshot_index,
                )
            )
            return
        snapshot = Snapshot(
            message.snapshot_index,
            message.snapshot_term,
            dict(message.members),
            bytes(incoming.data),
        )
        log.restore(snapshot)
        self._pending_snapshot = snapshot
        self._send(
            InstallSnapshotResponse(
                **self._head(message.sender),
                snapshot_index=message.snapshot_index,
                next_offset=message.total_bytes,
                done=True,
            )
        )

    def _send_snapshot_progress(self, message: InstallSnapshot, next_offset: int) -> None:
        self._send(
            InstallSnapshotResponse(
                **self._head(message.sender),
                snapshot_index=message.snapshot_index,
                next_offset=next_offset,
            )
        )

    # ------------------------------------------------------------------ leader side

    def _check_can_propose(self) -> None:
        if self.role is not Role.LEADER:
            raise NotLeaderError(self.leader_id, self.leader_address)
        if self.lead_transferee is not None:
            raise ProposalDroppedError(f"leadership is being transferred to {self.lead_transferee}")
        if self.node_id not in self.members:
            raise ProposalDroppedError("this leader is being removed from the cluster")

    def _propose(self, kind: EntryKind, data: bytes) -> int:
        self._check_can_propose()
        entry = Entry(self.term, self.log.last_index + 1, kind, data)
        self.log.append([entry])
        if kind is EntryKind.CONF_CHANGE:
            self._members_changed()
        self._broadcast_append(send_if_empty=False)
        return entry.index

    def _members_changed(self) -> None:
        members = self.members
        for member in members:
            if member not in self.progress:
                self.progress[member] = Progress(next_index=self.log.last_index + 1)
        for member in list(self.progress):
            if member not in members and member != self.node_id:
                del self.progress[member]

    def _maybe_commit(self) -> bool:
        members = self.members
        matches = sorted(
            (self.progress[m].match_index if m in self.progress else 0 for m in members),
            reverse=True,
        )
        quorum_index = matches[len(members) // 2]
        # Paper 5.4.2: only an entry of the current term is committed by counting replicas.
        if self.log.term_at(quorum_index) != self.term or not self.log.commit_to(quorum_index):
            return False
        self._committed_advanced()
        return True

    def _committed_advanced(self) -> None:
        if self._reads_awaiting_commit and self.has_committed_in_term():
            waiting, self._reads_awaiting_commit = self._reads_awaiting_commit, []
            for context, requester in waiting:
                self._leader_read(context, requester)
        if self.node_id not in self.members and self.log.last_conf_index <= self.log.commit_index:
            # Thesis 4.2.2: a removed leader steps down once its removal is committed, handing
            # over to the most up-to-date member so the cluster need not wait for a timeout.
            successor = max(
                (m for m in self.members if m in self.progress),
                key=lambda m: self.progress[m].match_index,
                default=None,
            )
            if (
                successor is not None
                and self.progress[successor].match_index == self.log.last_index
            ):
                self._send(TimeoutNow(**self._head(successor)))
            self._become_follower(self.term, None)

    def _broadcast_append(self, *, send_if_empty: bool = True) -> None:
        for member in self.progress:
            if member != self.node_id:
                self._send_append(member, send_if_empty=send_if_empty)

    def _broadcast_heartbeat(self) -> None:
        for member, progress in self.progress.items():
            if member == self.node_id:
                continue
            self._send(
                Heartbeat(
                    **self._head(member),
                    commit_index=min(progress.match_index, self.log.commit_index),
                    read_seq=self._read_seq,
                )
            )

    def _send_append(self, to: str, *, send_if_empty: bool = True) -> bool:
        progress = self.progress[to]
        if progress.is_paused(self._config.max_inflight_appends):
            return False
        if progress.state is ProgressState.SNAPSHOT:
            return self._send_snapshot_chunk(to, progress)
        log = self.log
        progress.next_index = min(progress.next_index, log.last_index + 1)
        prev_index = progress.next_index - 1
        prev_term = log.term_at(prev_index)
        if prev_term is None:  # compacted away: only the snapshot can bring it up to date
            progress.become_snapshot(log.snapshot.index)
            return self._send_snapshot_chunk(to, progress)
        entries = log.slice(
            progress.next_index, log.last_index + 1, self._config.max_entries_per_append
        )
        if not entries and not send_if_empty:
            return False
        self._send(
            AppendRequest(
                **self._head(to),
                prev_log_index=prev_index,
                prev_log_term=prev_term,
                entries=tuple(entries),
                commit_index=log.commit_index,
            )
        )
        if progress.state is ProgressState.REPLICATE and entries:
            progress.next_index = entries[-1].index + 1
            progress.inflight.append(entries[-1].index)
        elif progress.state is ProgressState.PROBE:
            progress.probe_sent = True
        return True

    def _send_snapshot_chunk(self, to: str, progress: Progress) -> bool:
        snapshot = self.log.snapshot
        if progress.pending_snapshot_index != snapshot.index:
            progress.become_snapshot(snapshot.index)  # compacted again since: send the newer
        offset = min(progress.snapshot_offset, len(snapshot.data))
        chunk = snapshot.data[offset : offset + self._config.max_snapshot_chunk_bytes]
        self._send(
            InstallSnapshot(
                **self._head(to),
                snapshot_index=snapshot.index,
                snapshot_term=snapshot.term,
                members=dict(snapshot.members),
                total_bytes=len(snapshot.data),
                chunk_offset=offset,
                chunk=chunk,
                done=offset + len(chunk) == len(snapshot.data),
            )
        )
        progress.snapshot_sent = True
        return True

    def _handle_append_response(self, message: AppendResponse, progress: Progress) -> None:
        if not message.success:
            probe_hint = message.conflict_index
            if message.conflict_term > 0:
                probe_hint = self.log.find_conflict_by_term(
                    message.conflict_index, message.conflict_term
                )
            if progress.maybe_decrease_to(message.match_index, probe_hint):
                if progress.state is ProgressState.REPLICATE:
                    progress.become_probe()
                self._send_append(message.sender)
            return
        updated = progress.maybe_update(message.match_index)
        if not updated and not (
            progress.state is ProgressState.PROBE and progress.match_index == message.match_index
        ):
            return
        if progress.state is ProgressState.PROBE or (
            progress.state is ProgressState.SNAPSHOT
            and progress.match_index >= progress.pending_snapshot_index
        ):
            progress.become_replicate()
        if self._maybe_commit():
            if self.role is Role.LEADER:
                self._broadcast_append()
        else:
            while self._send_append(message.sender, send_if_empty=False):
                pass
        if (
            self.role is Role.LEADER
            and message.sender == self.lead_transferee
            and progress.match_index == self.log.last_index
        ):
            self._send(TimeoutNow(**self._head(message.sender)))

    def _handle_snapshot_response(
        self, message: InstallSnapshotResponse, progress: Progress
    ) -> None:
        if message.done:
            progress.maybe_update(message.snapshot_index)
            if (
                progress.state is ProgressState.SNAPSHOT
                and progress.match_index >= progress.pending_snapshot_index
            ):
                progress.become_probe()
            self._send_append(message.sender)
            return
        if (
            progress.state is not ProgressState.SNAPSHOT
            or message.snapshot_index != progress.pending_snapshot_index
        ):
            return
        progress.snapshot_offset = message.next_offset
        progress.snapshot_sent = False
        self._send_append(message.sender)

    def _leader_read(self, context: bytes, requester: str) -> None:
        if not self.has_committed_in_term():
            # Thesis 6.4 step 1: the commit index is only known once an entry of this term is.
            self._reads_awaiting_commit.append((context, requester))
            return
        members = self.members
        if set(members) == {self.node_id}:
            self._answer_read(context, self.log.commit_index, requester)
            return
        self._read_seq += 1
        self._pending_reads.append(
            _PendingRead(context, self.log.commit_index, self._read_seq, requester)
        )
        self._broadcast_heartbeat()

    def _release_confirmed_reads(self) -> None:
        if not self._pending_reads:
            return
        members = self.members
        acked = sorted(
            (
                self._read_seq
                if member == self.node_id
                else (self.progress[member].read_seq if member in self.progress else 0)
            )
            for member in members
        )
        confirmed_seq = acked[len(acked) - (len(members) // 2 + 1)]
        released = [read for read in self._pending_reads if read.seq <= confirmed_seq]
        if not released:
            return
        self._pending_reads = [read for read in self._pending_reads if read.seq > confirmed_seq]
        for read in released:
            self._answer_read(read.context, read.index, read.requester)

    def _answer_read(self, context: bytes, index: int, requester: str) -> None:
        if requester == self.node_id:
            self._read_states.append(ReadState(index, context))
        else:
            self._send(
                ReadIndexResponse(**self._head(requester), context=context, read_index=index)
            )

    # ------------------------------------------------------------------ messages

    def _head(self, to: str) -> _Head:
        return {"term": self.term, "sender": self.node_id, "receiver": to}

    def _send(self, message: Message) -> None:
        self._messages.append(message)
