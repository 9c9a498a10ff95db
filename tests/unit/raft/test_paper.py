"""One test per rule of the Raft paper and thesis, on the pure node (etcd's raft_paper_test style).

References: "In Search of an Understandable Consensus Algorithm" (extended, 2014), figure 2 and
sections 5-7; Ongaro's thesis (2014) sections 3.10, 4.1-4.3, 6.4, 9.6.
"""

from __future__ import annotations

import dataclasses
import random

import msgspec
import pytest

from ferrymq.errors import NotLeaderError, ProposalDroppedError
from ferrymq.raft.log import HardState, Snapshot
from ferrymq.raft.node import RaftNode, Role
from ferrymq.raft.progress import ProgressState
from ferrymq.wire.raft import (
    AppendRequest,
    AppendResponse,
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    Heartbeat,
    InstallSnapshot,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)

from .harness import CONFIG, Net, drain, members, node


def vote_request(
    to: str, sender: str = "b", *, term: int, last_index: int = 0, last_term: int = 0, **kw: bool
) -> VoteRequest:
    return VoteRequest(
        term=term,
        sender=sender,
        receiver=to,
        last_log_index=last_index,
        last_log_term=last_term,
        **kw,
    )


def role(n: RaftNode) -> Role:
    """The node's role, read through a call so that mypy does not narrow it across steps."""
    return n.role


def responses(messages: list[Message], kind: type[Message]) -> list[Message]:
    return [m for m in messages if isinstance(m, kind)]


# ---------------------------------------------------------------------- elections (5.1, 5.2)


def test_a_higher_term_turns_any_role_into_a_follower_of_that_term() -> None:
    """Figure 2, all servers: if a message's term > currentTerm, adopt it and become follower."""
    net = Net(node("a"), node("b"), node("c"))
    leader = net.elect("a")
    leader.step(
        AppendRequest(
            term=leader.term + 5, sender="b", receiver="a", prev_log_index=0, prev_log_term=0
        )
    )
    assert leader.role is Role.FOLLOWER
    assert leader.term == 6
    assert leader.leader_id == "b"
    assert leader.vote is None


def test_a_message_of_a_stale_term_is_refused_and_tells_the_sender_the_term() -> None:
    """Figure 2, AppendEntries rule 1: reply false if term < currentTerm (5.1)."""
    follower = node("a", term=5)
    follower.step(
        AppendRequest(
            term=3,
            sender="b",
            receiver="a",
            prev_log_index=0,
            prev_log_term=0,
            entries=(Entry(3, 1, EntryKind.COMMAND, b"x"),),
        )
    )
    [reply] = drain(follower)
    assert isinstance(reply, AppendResponse)
    assert (reply.term, reply.success) == (5, False)
    assert follower.log.last_index == 0


def test_a_node_grants_at_most_one_vote_per_term_and_persists_it_first() -> None:
    """Figure 2, RequestVote rule 2 and 5.2: first come first served, vote stored before reply."""
    voter = node("a")
    voter.step(vote_request("a", "b", term=1))
    ready = voter.ready()
    assert ready.hard_state == HardState(1, "b", 0)  # persisted with the grant, before sending
    [granted] = ready.messages
    assert isinstance(granted, VoteResponse)
    assert granted.granted
    voter.advance(ready)
    voter.step(vote_request("a", "c", term=1))
    [refused] = drain(voter)
    assert isinstance(refused, VoteResponse)
    assert not refused.granted
    voter.step(vote_request("a", "b", term=1))  # the same candidate again (a retry)
    [again] = drain(voter)
    assert isinstance(again, VoteResponse)
    assert again.granted


@pytest.mark.parametrize(
    ("last_index", "last_term", "granted"),
    [(2, 2, False), (3, 1, False), (1, 3, True), (3, 2, True), (2, 3, True)],
)
def test_votes_go_only_to_candidates_whose_log_is_at_least_as_up_to_date(
    last_index: int, last_term: int, granted: bool
) -> None:
    """5.4.1 election restriction: compare last terms, then lengths."""
    voter = node("a", term=2, log_terms=(1, 2, 2))
    voter.step(vote_request("a", term=3, last_index=last_index, last_term=last_term))
    [reply] = drain(voter)
    assert isinstance(reply, VoteResponse)
    assert reply.granted is granted


def test_a_candidate_with_a_majority_leads_and_appends_a_noop_of_its_term() -> None:
    """5.2: votes from a majority win; 5.4.2/8: the new leader appends an entry of its term."""
    net = Net(node("a"), node("b"), node("c"))
    net.cut = {"c"}
    leader = net.elect("a")
    assert leader.term == 1
    assert leader.log.entry(1).kind is EntryKind.NOOP
    assert leader.log.entry(1).term == 1
    assert leader.commit_index == 1  # a and b hold it: a majority of three


def test_a_candidate_becomes_follower_on_an_append_from_a_leader_of_its_term() -> None:
    """5.2: a candidate that hears from a legitimate leader of its term returns to follower."""
    cfg = dataclasses.replace(CONFIG, pre_vote=False)
    candidate = node("a", config=cfg)
    for _ in range(2 * cfg.election_ticks):
        candidate.tick()
    assert role(candidate) is Role.CANDIDATE
    candidate.step(Heartbeat(term=candidate.term, sender="b", receiver="a", commit_index=0))
    assert role(candidate) is Role.FOLLOWER
    assert candidate.leader_id == "b"


def test_a_candidate_that_a_majority_refuses_gives_up() -> None:
    """5.2: a split or lost election ends; the candidate waits for the next timeout."""
    cfg = dataclasses.replace(CONFIG, pre_vote=False)
    candidate = node("a", config=cfg)
    for _ in range(2 * cfg.election_ticks):
        candidate.tick()
    term = candidate.term
    for voter in ("b", "c"):
        candidate.step(VoteResponse(term=term, sender=voter, receiver="a", granted=False))
    assert candidate.role is Role.FOLLOWER
    assert candidate.term == term


def test_election_timeouts_are_randomized_by_the_injected_rng() -> None:
    """5.2: each node waits a random time in [T, 2T); the same seed gives the same times."""

    def timeout_ticks(seed: int) -> int:
        n = node("a", config=dataclasses.replace(CONFIG, pre_vote=False), seed=seed)
        for ticks in range(1, 3 * CONFIG.election_ticks):
            n.tick()
            if n.role is Role.CANDIDATE:
                return ticks
        raise AssertionError("never campaigned")

    observed = [timeout_ticks(seed) for seed in range(40)]
    assert all(CONFIG.election_ticks <= t < 2 * CONFIG.election_ticks for t in observed)
    assert len(set(observed)) > 3
    assert observed == [timeout_ticks(seed) for seed in range(40)]


# ---------------------------------------------------------------------- replication (5.3)


def test_an_append_whose_previous_entry_does_not_match_is_refused_with_a_hint() -> None:
    """Figure 2, AppendEntries rule 2, with the conflict hint of fast back-off."""
    follower = node("a", log_terms=(1, 1, 2, 2, 2))
    follower.step(
        AppendRequest(term=4, sender="b", receiver="a", prev_log_index=7, prev_log_term=4)
    )
    [reply] = drain(follower)
    assert isinstance(reply, AppendResponse)
    assert not reply.success
    assert reply.match_index == 7
    # The last entry whose term is <= 4: index 5 (term 2). The leader can skip from there.
    assert (reply.conflict_index, reply.conflict_term) == (5, 2)


def test_a_conflicting_suffix_is_cut_only_where_the_terms_differ() -> None:
    """Figure 2, AppendEntries rules 3-4: delete from the first conflict, append new entries."""
    follower = node("a", term=3, log_terms=(1, 2, 2, 2))
    follower.step(
        AppendRequest(
            term=3,
            sender="b",
            receiver="a",
            prev_log_index=1,
            prev_log_term=1,
            entries=(Entry(2, 2, EntryKind.COMMAND, b"e2"), Entry(3, 3, EntryKind.COMMAND, b"new")),
        )
    )
    assert [e.term for e in follower.log.entries] == [1, 2, 3]
    ready = follower.ready()
    assert [e.index for e in ready.entries] == [3]  # only the replaced part is rewritten
    follower.advance(ready)
    # An older, shorter append that matches must not cut what follows (out-of-order delivery).
    follower.step(
        AppendRequest(
            term=3,
            sender="b",
            receiver="a",
            prev_log_index=1,
            prev_log_term=1,
            entries=(Entry(2, 2, EntryKind.COMMAND, b"e2"),),
        )
    )
    assert [e.term for e in follower.log.entries] == [1, 2, 3]
    [reply] = drain(follower)
    assert isinstance(reply, AppendResponse)
    assert reply.match_index == 2


def test_a_follower_commits_up_to_the_leader_commit_but_not_past_what_it_verified() -> None:
    """Figure 2, AppendEntries rule 5: commitIndex = min(leaderCommit, index of last new entry)."""
    follower = node("a", term=2, log_terms=(1, 1, 1, 1))
    follower.step(
        AppendRequest(
            term=2,
            sender="b",
            receiver="a",
            prev_log_index=1,
            prev_log_term=1,
            entries=(Entry(1, 2, EntryKind.COMMAND, b"e2"),),
            commit_index=4,
        )
    )
    assert follower.commit_index == 2  # entries 3-4 were not verified by this append


def test_fast_back_off_skips_a_whole_term_per_round_trip() -> None:
    """5.3 (end): with the conflict term and index, one rejection per term, not per entry."""
    leader = node("a", log_terms=(1, 1, 4, 4, 4, 4), term=5)
    follower = node("b", log_terms=(1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3), term=5)
    net = Net(leader, follower, node("c", term=5))
    net.cut = {"c"}
    net.elect("a")
    rejections = [m for m in net.delivered if isinstance(m, AppendResponse) and not m.success]
    assert len(rejections) <= 2
    assert [e.term for e in follower.log.entries] == [e.term for e in leader.log.entries]


def test_a_leader_commits_an_old_term_entry_only_through_an_entry_of_its_term() -> None:
    """5.4.2 (figure 8): never commit a previous term's entry by counting replicas."""
    cfg = dataclasses.replace(CONFIG, max_entries_per_append=1)
    leader = node("a", config=cfg, term=3, log_terms=(1, 2))
    follower = node("b", config=cfg, term=3, log_terms=(1,))
    net = Net(leader, follower, node("c", config=cfg, term=3, log_terms=(1,)))
    net.cut = {"c"}
    net.transform = lambda m: (  # b gets entry 2 but never the no-op at 3
        msgspec.structs.replace(m, entries=tuple(e for e in m.entries if e.index < 3))
        if isinstance(m, AppendRequest)
        else m
    )
    net.elect("a")
    net.tick(2)
    assert leader.term == 4
    assert leader.progress["b"].match_index == 2  # the term-2 entry is on a majority...
    assert leader.commit_index == 0  # ...and still not committed
    net.transform = lambda m: m
    net.tick(2)
    assert leader.progress["b"].match_index == 3
    assert leader.commit_index == 3  # the no-op of term 4 commits both


def test_a_leader_counts_its_own_entries_only_once_they_are_persisted() -> None:
    """Figure 2 / driver contract: a single-node leader commits after `advance`, not before."""
    solo = node("a", ids=("a",))
    for _ in range(2 * CONFIG.election_ticks):
        solo.tick()
    assert solo.is_leader
    drain(solo)
    index = solo.propose(b"x")
    assert solo.commit_index == index - 1
    ready = solo.ready()
    assert [e.index for e in ready.entries] == [index]
    assert not ready.committed
    solo.advance(ready)
    assert solo.commit_index == index
    assert [e.index for e in solo.ready().committed] == [index]


def test_a_restarted_node_keeps_its_term_vote_and_log() -> None:
    """Figure 2: currentTerm, votedFor and log[] are persistent state."""
    restarted = node("a", term=7, vote="c", log_terms=(1, 7))
    restarted.step(vote_request("a", "b", term=7, last_index=9, last_term=7))
    [reply] = drain(restarted)
    assert isinstance(reply, VoteResponse)  # already voted for c
    assert not reply.granted
    assert restarted.log.last_term == 7


# ---------------------------------------------------------------------- pre-vote, check-quorum


def test_a_partitioned_node_does_not_raise_its_term_and_cannot_disrupt_on_return() -> None:
    """Thesis 9.6: with pre-vote, a node cut off keeps its term; rejoining deposes nobody."""
    net = Net(node("a"), node("b"), node("c"))
    leader = net.elect("a")
    net.cut = {"c"}
    net.tick(10 * CONFIG.election_ticks)
    isolated = net.nodes["c"]
    assert isolated.term == leader.term
    assert role(isolated) is Role.PRE_CANDIDATE
    net.cut = set()
    net.tick(3)
    assert leader.is_leader
    assert role(isolated) is Role.FOLLOWER
    assert isolated.leader_id == "a"


def test_a_leader_that_cannot_reach_a_majority_steps_down() -> None:
    """Thesis 6.2 / 9.6 check-quorum: no majority heard within an election timeout -> follower."""
    net = Net(node("a"), node("b"), node("c"))
    leader = net.elect("a")
    net.cut = {"b", "c"}
    net.tick(2 * CONFIG.election_ticks + 1, only=["a"])
    assert leader.role is Role.FOLLOWER
    with pytest.raises(NotLeaderError):
        leader.propose(b"x")


def test_a_follower_that_hears_a_leader_ignores_vote_requests() -> None:
    """Thesis 9.6 (leader stickiness): no vote, no term change while the leader is alive."""
    net = Net(node("a"), node("b"), node("c"))
    leader = net.elect("a")
    follower = net.nodes["b"]
    follower.step(vote_request("b", "c", term=leader.term + 1, last_index=99, last_term=99))
    assert follower.term == leader.term
    assert not drain(follower)
    # A transfer campaign (TimeoutNow) is the exception.
    follower.step(
        vote_request("b", "c", term=leader.term + 1, last_index=99, last_term=99, transfer=True)
    )
    assert follower.term == leader.term + 1


# ---------------------------------------------------------------------- snapshots (7)


def test_a_lagging_follower_gets_the_snapshot_in_chunks() -> None:
    """Paper 7: InstallSnapshot when the entries it needs are compacted; chunked (offset, done)."""
    cfg = dataclasses.replace(CONFIG, max_snapshot_chunk_bytes=4)
    net = Net(node("a", config=cfg), node("b", config=cfg), node("c", config=cfg))
    leader = net.elect("a")
    net.cut = {"c"}
    for i in range(5):
        leader.propose(b"v%d" % i)
        net.settle()
    leader.compact(leader.applied_index, b"0123456789abc")  # 13 bytes: 4 chunks
    net.cut = set()
    net.tick(2)
    chunks = [m for m in net.delivered if isinstance(m, InstallSnapshot) and m.receiver == "c"]
    assert [m.chunk_offset for m in chunks] == [0, 4, 8, 12]
    assert chunks[-1].done
    lagging = net.nodes["c"]
    assert lagging.log.snapshot.index == leader.log.snapshot.index
    assert lagging.log.snapshot.data == b"0123456789abc"
    assert lagging.commit_index == leader.commit_index
    assert leader.progress["c"].state is ProgressState.REPLICATE


def test_a_snapshot_for_an_entry_the_follower_holds_keeps_the_entries_after_it() -> None:
    """Paper 7, InstallSnapshot rule 6: retain the log after a matching last included entry."""
    follower = node("a", term=2, log_terms=(1, 1, 2, 2))
    follower.step(
        InstallSnapshot(
            term=2,
            sender="b",
            receiver="a",
            snapshot_index=2,
            snapshot_term=1,
            members=members("a", "b", "c"),
            total_bytes=1,
            chunk_offset=0,
            chunk=b"s",
            done=True,
        )
    )
    assert follower.log.last_index == 4
    assert follower.commit_index == 2
    assert follower.ready().snapshot is None


def test_a_snapshot_replaces_a_log_that_does_not_hold_its_last_entry() -> None:
    """Paper 7, InstallSnapshot rule 7: otherwise discard the entire log, restore the snapshot."""
    follower = node("a", term=3, log_terms=(1, 1, 2, 2))
    follower.step(
        InstallSnapshot(
            term=3,
            sender="b",
            receiver="a",
            snapshot_index=3,
            snapshot_term=3,
            members=members("a", "b", "c"),
            total_bytes=2,
            chunk_offset=0,
            chunk=b"st",
            done=True,
        )
    )
    ready = follower.ready()
    assert ready.snapshot is not None
    assert ready.snapshot.data == b"st"
    assert follower.log.last_index == 3
    assert follower.log.entries == []
    follower.advance(ready)
    assert follower.applied_index == 3


# ---------------------------------------------------------------------- ReadIndex (thesis 6.4)


def test_read_index_waits_for_the_first_commit_of_the_term_and_a_heartbeat_round() -> None:
    """Thesis 6.4: record the commit index (after a commit of this term), confirm leadership."""
    net = Net(node("a"), node("b"), node("c"))
    net.cut = {"b", "c"}
    a = net.nodes["a"]
    for _ in range(3 * CONFIG.election_ticks):
        a.tick()
    # Not yet leader or not yet committed: no read state.
    net.cut = set()
    leader = net.elect("a")
    leader.propose(b"x")
    net.settle()
    net.cut = {"b", "c"}
    leader.read_index(b"r1")
    net.settle()
    assert net.read_states["a"] == []  # no heartbeat round came back
    net.cut = set()
    net.tick(1, only=["a"])
    [read] = net.read_states["a"]
    assert read.context == b"r1"
    assert read.index == leader.commit_index


def test_a_new_leader_defers_reads_until_it_commits_an_entry_of_its_term() -> None:
    """Thesis 6.4 step 1: until then its commit index may be behind the real one."""
    leader = node("a", ids=("a", "b", "c"))
    net = Net(leader, node("b"), node("c"))
    net.filter = lambda m: not isinstance(m, AppendResponse)  # the no-op cannot commit
    net.elect("a")
    leader.read_index(b"early")
    net.tick(2, only=["a"])
    assert net.read_states["a"] == []
    net.filter = lambda m: True
    net.tick(2, only=["a"])
    assert [r.context for r in net.read_states["a"]] == [b"early"]


def test_a_follower_read_goes_through_the_leader() -> None:
    """Thesis 6.4.1: followers ask the leader for a read index."""
    net = Net(node("a"), node("b"), node("c"))
    leader = net.elect("a")
    leader.propose(b"x")
    net.settle()
    net.nodes["b"].read_index(b"f1")
    net.settle()
    net.tick(1, only=["a"])
    [read] = net.read_states["b"]
    assert (read.context, read.index) == (b"f1", leader.commit_index)


# ---------------------------------------------------------------------- transfer (thesis 3.10)


def test_leadership_transfer_catches_the_target_up_then_sends_timeout_now() -> None:
    """Thesis 3.10: stop proposals, bring the target up to date, TimeoutNow, it wins at once."""
    net = Net(node("a"), node("b"), node("c"))
    leader = net.elect("a")
    net.cut = {"c"}
    leader.propose(b"x")
    net.settle()
    net.cut = set()
    leader.transfer_leader("c")
    with pytest.raises(ProposalDroppedError):
        leader.propose(b"refused during transfer")
    net.settle()
    timeouts = [m for m in net.delivered if isinstance(m, TimeoutNow)]
    assert [m.receiver for m in timeouts] == ["c"]
    assert net.nodes["c"].is_leader
    assert leader.role is Role.FOLLOWER
    assert leader.leader_id == "c"


def test_a_transfer_that_does_not_finish_in_an_election_timeout_is_abandoned() -> None:
    """Thesis 3.10: the leader resumes accepting proposals."""
    net = Net(node("a"), node("b"), node("c"))
    leader = net.elect("a")
    net.cut = {"c"}
    leader.transfer_leader("c")
    net.tick(CONFIG.election_ticks + 1, only=["a", "b"])
    assert leader.is_leader
    assert leader.lead_transferee is None
    leader.propose(b"accepted again")


# ---------------------------------------------------------------------- membership (thesis 4)


def test_a_membership_change_is_in_effect_when_appended_and_undone_by_truncation() -> None:
    """Thesis 4.1: servers use the latest configuration in their log, committed or not."""
    follower = node("a", term=2, log_terms=(1,))
    add = Entry(2, 2, EntryKind.CONF_CHANGE, _conf(ConfChangeOp.ADD, "d", "h:4"))
    follower.step(
        AppendRequest(
            term=2, sender="b", receiver="a", prev_log_index=1, prev_log_term=1, entries=(add,)
        )
    )
    assert "d" in follower.members
    follower.step(
        AppendRequest(
            term=3,
            sender="c",
            receiver="a",
            prev_log_index=1,
            prev_log_term=1,
            entries=(Entry(3, 2, EntryKind.COMMAND, b"other"),),
        )
    )
    assert "d" not in follower.members


def test_one_membership_change_at_a_time_and_only_after_a_commit_in_the_term() -> None:
    """Thesis 4.1 and the 2015 fix: refuse a change while one is uncommitted or before the
    leader committed an entry of its own term."""
    net = Net(node("a"), node("b"), node("c"))
    net.filter = lambda m: not isinstance(m, AppendResponse)
    leader = net.elect("a")
    with pytest.raises(ProposalDroppedError, match="not committed an entry"):
        leader.propose_conf_change(ConfChange(ConfChangeOp.ADD, "d", "h:4"))
    net.filter = lambda m: True
    net.tick(1, only=["a"])
    net.filter = lambda m: not isinstance(m, AppendResponse)
    leader.propose_conf_change(ConfChange(ConfChangeOp.ADD, "d", "h:4"))
    assert set(leader.members) == {"a", "b", "c", "d"}
    assert "d" in leader.progress
    with pytest.raises(ProposalDroppedError, match="previous membership change"):
        leader.propose_conf_change(ConfChange(ConfChangeOp.REMOVE, "b"))


def test_a_removed_leader_steps_down_once_its_removal_commits_and_hands_over() -> None:
    """Thesis 4.2.2: it manages the cluster until the change commits, not counting itself."""
    net = Net(node("a"), node("b"), node("c"))
    leader = net.elect("a")
    leader.propose_conf_change(ConfChange(ConfChangeOp.REMOVE, "a"))
    net.settle()
    assert leader.role is Role.FOLLOWER
    assert not leader.is_promotable
    assert any(isinstance(m, TimeoutNow) for m in net.delivered)
    successor = net.leader()
    assert successor.node_id in ("b", "c")
    assert set(successor.members) == {"b", "c"}


def test_a_node_outside_the_membership_never_campaigns() -> None:
    """Thesis 4.2.3: a server not in its latest configuration does not start elections."""
    outsider = node("d", ids=("a", "b", "c"))
    for _ in range(5 * CONFIG.election_ticks):
        outsider.tick()
    assert outsider.role is Role.FOLLOWER
    assert not drain(outsider)


def _conf(op: ConfChangeOp, node_id: str, address: str = "") -> bytes:
    from ferrymq.wire.raft import encode_conf_change

    return encode_conf_change(ConfChange(op, node_id, address))


def test_nodes_are_deterministic_given_their_inputs() -> None:
    """Rule 1 of the node: the same inputs and seed give the same outputs."""

    def trace(seed: int) -> list[Message]:
        nodes = [
            RaftNode(n, CONFIG, random.Random(seed + i), members=members("a", "b", "c"))
            for i, n in enumerate(("a", "b", "c"))
        ]
        net = Net(*nodes)
        net.tick(3 * CONFIG.election_ticks)
        net.leader().propose(b"x")
        net.settle()
        return net.delivered

    assert trace(3) == trace(3)


def test_a_snapshot_carries_the_membership_at_its_index() -> None:
    """Thesis 5.1/4: membership lives in the log and snapshots, not in files."""
    snapshot = Snapshot(5, 2, members("a", "b"), b"s")
    restored = node("a", ids=("a", "b", "c", "x"), snapshot=snapshot, term=2)
    assert set(restored.members) == {"a", "b"}
