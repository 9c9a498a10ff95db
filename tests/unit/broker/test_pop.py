"""The POP state machine (`broker/pop.py`) under random pops, acks, changes, expiries, restarts.

The machine drives `PopState` the way `broker/popservice.py` does (pop from the retry queue,
then the topic's queue; revive expired unordered messages into the retry queue with reconsume
times + 1, or dead-letter them past the limit; orderly queues redeliver in place) over a model
of the queues, and checks after every step:

- nothing acknowledged is delivered again;
- the delivery attempt a consumer sees is one more than the deliveries before it;
- an ack or change answers exactly the message's latest delivery (stale handles are refused);
- orderly: a queue is held while a message of it is invisible, and a message is delivered only
  when every earlier message of its queue is done or delivered before it in the same pop;
- a restart (replaying the event log, or a snapshot and the events after it) gives the same state;
- an admin reset of the topic's queue (either way) makes its in-flight handles stale, and what
  lies at or after the reset offset is delivered anew (attempt 1; the model gives those offsets
  new message ids, and counts the messages a reset skipped as done);
- once every invisible time has passed, every message neither acknowledged nor dead-lettered is
  delivered again (`drain`).
"""

from collections import Counter

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ferrymq.broker.pop import Acked, PopEvent, Popped, PopState, QueueKey, Reset

GROUP = "G"
TOPIC = "T"
RETRY = "%RETRY%G_T"
LIMIT = 2
"""maxReconsumeTimes of the machine's group."""

Handle = tuple[int, QueueKey, int, int]
"""(message id, key, queue offset, pop time)."""


class PopMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = PopState()
        self.log: list[PopEvent] = []
        self.state.listener = self.log.append
        self.snap: tuple[list[tuple[str, str, int, object]], int] | None = None
        self.now = 1_000_000
        self.queues: dict[str, list[tuple[int, int]]] = {TOPIC: [], RETRY: []}
        """Per topic, (message id, reconsume times) by queue offset."""
        self.next_id = 0
        self.acked: set[int] = set()
        self.dead: set[int] = set()
        self.skipped: set[int] = set()
        """Messages an admin reset skipped or took out of flight (never to be delivered)."""
        self.deliveries: Counter[int] = Counter()
        self.current: dict[int, Handle] = {}
        self.handles: list[Handle] = []
        self.replaced: list[Handle] = []
        """Handles a later delivery or change made stale."""
        self.orderly = False

    @initialize(orderly=st.booleans())
    def choose_mode(self, orderly: bool) -> None:
        self.orderly = orderly

    @property
    def sent(self) -> set[int]:
        return set(range(self.next_id))

    # ------------------------------------------------------------------ steps

    @rule(n=st.integers(1, 4))
    def send(self, n: int) -> None:
        for _ in range(n):
            self.queues[TOPIC].append((self.next_id, 0))
            self.next_id += 1

    @rule(ms=st.integers(0, 80))
    def tick(self, ms: int) -> None:
        self.now += ms

    @rule(max_count=st.integers(1, 5), invisible=st.integers(1, 60))
    def pop(self, max_count: int, invisible: int) -> None:
        self._pop(max_count, invisible)

    def _pop(self, max_count: int, invisible: int) -> list[Handle]:
        state, now = self.state, self.now
        topics = [TOPIC] if self.orderly else [RETRY, TOPIC]
        got: list[Handle] = []
        for topic in topics:
            key = (GROUP, topic, 0)
            wanted = max_count - len(got)
            if wanted <= 0 or (self.orderly and state.is_blocked(key, now)):
                continue
            redo = state.redeliveries(key, now)[:wanted] if self.orderly else []
            known = state.position(key)
            position = 0 if known is None else known
            log = self.queues[topic]
            new = list(range(position, min(len(log), position + wanted - len(redo))))
            offsets = redo + new
            next_offset = position + len(new)
            if not offsets and next_offset == known:
                continue
            attempts = [state.attempt(key, o) for o in offsets]
            pop_time = state.pop_time([key], now)
            state.apply(
                Popped(
                    GROUP,
                    topic,
                    0,
                    offsets,
                    pop_time,
                    pop_time + invisible,
                    next_offset,
                    self.orderly,
                )
            )
            for queue_offset, before in zip(offsets, attempts, strict=True):
                message, reconsume = log[queue_offset]
                assert message not in self.acked, f"acked message {message} delivered again"
                assert message not in self.dead, f"dead-lettered message {message} delivered"
                attempt = before + 1 if self.orderly else reconsume + 1
                assert attempt == self.deliveries[message] + 1
                if self.orderly:  # FIFO: everything earlier is done, or came before it now
                    earlier = {m for m, _ in log[:queue_offset]}
                    batch = {h[0] for h in got}
                    assert earlier <= self.acked | self.dead | self.skipped | batch
                self.deliveries[message] += 1
                handle = (message, key, queue_offset, pop_time)
                if message in self.current:
                    assert self.current[message] != handle, "a new delivery reuses a handle"
                    self.replaced.append(self.current[message])
                self.current[message] = handle
                self.handles.append(handle)
                got.append(handle)
        return got

    @rule(data=st.data(), live=st.booleans())
    def ack(self, data: st.DataObject, live: bool) -> None:
        handles = sorted(self.current.values()) if live else self.handles
        if handles:
            self._ack(data.draw(st.sampled_from(handles)))

    @rule()
    def ack_last_stale(self) -> None:
        if self.replaced:
            self._ack(self.replaced[-1])

    def _ack(self, handle: Handle) -> None:
        message, key, queue_offset, pop_time = handle
        event = self.state.decide_ack(key, [(queue_offset, pop_time)])
        assert (event is not None) == (self.current.get(message) == handle)
        if event is not None:
            self.state.apply(event)
            self.acked.add(message)
            del self.current[message]

    @rule(data=st.data(), invisible=st.integers(0, 60), live=st.booleans())
    def change(self, data: st.DataObject, invisible: int, live: bool) -> None:
        handles = sorted(self.current.values()) if live else self.handles
        if not handles:
            return
        handle = data.draw(st.sampled_from(handles))
        message, key, queue_offset, pop_time = handle
        event = self.state.decide_change(key, queue_offset, pop_time, self.now, invisible)
        assert (event is not None) == (self.current.get(message) == handle)
        if event is not None:
            self.state.apply(event)
            new = (message, key, queue_offset, event.pop_time_ms)
            assert new != handle
            self.replaced.append(handle)
            self.current[message] = new
            self.handles.append(new)

    @rule()
    def revive(self) -> None:
        """What `PopReviver.revive_due` does."""
        for key, queue_offset, inflight, orderly in list(self.state.expired(self.now)):
            _, topic, _ = key
            if orderly and inflight.attempt <= LIMIT:
                continue
            message, reconsume = self.queues[topic][queue_offset]
            assert message not in self.acked
            if orderly or reconsume + 1 > LIMIT:
                self.dead.add(message)
            else:
                self.queues[RETRY].append((message, reconsume + 1))
            self.state.apply(Acked(GROUP, topic, 0, [queue_offset]))
            self.current.pop(message, None)

    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        """An admin reset of the topic's queue to any offset (`Reset`; rule 6)."""
        key = (GROUP, TOPIC, 0)
        log = self.queues[TOPIC]
        known = self.state.position(key)
        if known is None:
            return  # the service resets only queues the group popped
        target = data.draw(st.integers(0, len(log)))
        self.state.apply(Reset(GROUP, TOPIC, 0, target))
        assert (self.state.position(key), self.state.in_flight_count(key)) == (target, 0)
        for message, handle in list(self.current.items()):
            if handle[1] == key:  # dropped: its handles are stale now
                self.replaced.append(handle)
                del self.current[message]
                self.skipped.add(message)
        for queue_offset in range(min(target, known), len(log)):
            message, _ = log[queue_offset]
            if message not in self.acked | self.dead:
                self.skipped.add(message)  # skipped forwards, or replaced below
            if queue_offset >= target:  # delivered again: a new message to the model
                log[queue_offset] = (self.next_id, 0)
                self.next_id += 1

    @rule()
    def snapshot(self) -> None:
        self.snap = (self.state.snapshot(), len(self.log))  # type: ignore[assignment]

    @rule(from_snapshot=st.booleans())
    def restart(self, from_snapshot: bool) -> None:
        """A new process: the state again from the replicated log (snapshot and tail, or all)."""
        fresh = PopState()
        tail = self.log
        if from_snapshot and self.snap is not None:
            entries, length = self.snap
            fresh.replace_all(entries)  # type: ignore[arg-type]
            tail = self.log[length:]
        for event in tail:
            fresh.apply(event)
        assert fresh.snapshot() == self.state.snapshot()
        fresh.listener = self.log.append
        self.state = fresh

    @rule()
    def drain(self) -> None:
        """Every invisible time passes: each message not acked or dead comes again."""
        self.now += 1_000
        self.revive()
        waiting = self.sent - self.acked - self.dead - self.skipped
        seen: set[int] = set()
        for _ in range(3 * len(waiting) + 3):
            got = self._pop(1_000, 10**9)
            for handle in got:
                seen.add(handle[0])
                self._ack(handle)
            if not got:
                break
        assert waiting <= seen, f"never delivered again: {sorted(waiting - seen)}"
        assert self.sent == self.acked | self.dead | self.skipped

    # ------------------------------------------------------------------ invariants

    @invariant()
    def committed_offset_is_below_every_unacked_message(self) -> None:
        for (_, topic, _), queue in self.state.queues.items():
            committed = self.state.committed_offset((GROUP, topic, 0))
            assert committed is not None
            assert all(committed <= o for o in queue.inflight)
            assert committed <= queue.next_offset


PopMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_pop_state_machine = PopMachine.TestCase


def test_an_orderly_message_is_not_delivered_again_within_the_millisecond_of_its_handle() -> None:
    """A change to invisible time 0 makes it visible at once; a pop in that same millisecond
    would hand out a handle equal to the one just given (same pop time), so it waits 1 ms."""
    state = PopState()
    key = (GROUP, TOPIC, 0)
    state.apply(Popped(GROUP, TOPIC, 0, [0], 10, 20, 1, orderly=True))
    change = state.decide_change(key, 0, 10, 15, 0)
    assert change is not None
    state.apply(change)
    assert (change.pop_time_ms, change.invisible_until_ms) == (15, 15)
    assert state.redeliveries(key, 15) == []
    assert state.redeliveries(key, 16) == [0]


def test_a_reset_moves_the_position_back_and_makes_in_flight_handles_stale() -> None:
    """Rule 6: an admin reset; replaying the log after a snapshot gives the same state."""
    state = PopState()
    log: list[PopEvent] = []
    state.listener = log.append
    key = (GROUP, TOPIC, 0)
    state.apply(Popped(GROUP, TOPIC, 0, [0, 1, 2], 10, 100, 3))
    state.apply(Acked(GROUP, TOPIC, 0, [0]))
    snapshot, length = state.snapshot(), len(log)
    state.apply(Reset(GROUP, TOPIC, 0, 1))
    assert (state.position(key), state.in_flight_count(key)) == (1, 0)
    assert state.committed_offset(key) == 1
    assert state.decide_ack(key, [(1, 10)]) is None  # popped before the reset: stale
    state.apply(Popped(GROUP, TOPIC, 0, [1], 20, 120, 2))
    assert state.attempt(key, 1) == 1  # a delivery anew
    fresh = PopState()
    fresh.replace_all(snapshot)
    for event in log[length:]:
        fresh.apply(event)
    assert fresh.snapshot() == state.snapshot()
