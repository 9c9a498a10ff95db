"""A deleted topic's records are never indexed again (issue 20 section 3).

Recovery re-reads the commit log from a checkpoint; before `Store.deleted_topics`, a deleted
topic's queues came back at the next open, mixed with those of a topic created again under the
same name (its first queue offsets taken by the old records).
"""

from ferrymq.store.store import Store

from .conftest import OpenStore
from .test_store import bodies, put


def _reopen(store: Store, open_store: OpenStore) -> Store:
    store.close()
    return open_store()


def test_a_deleted_topic_stays_deleted_across_a_reopen_and_a_new_one_keeps_its_offsets(
    open_store: OpenStore,
) -> None:
    store = open_store()
    put(store, "T", 0, b"old-1", b"old-2")
    put(store, "Other", 0, b"o")
    assert store.delete_topic("T") == 1
    cutoff = store.deleted_topics["T"]
    put(store, "T", 0, b"new-1")
    assert bodies(store, "T", 0) == [b"new-1"]
    store = _reopen(store, open_store)
    assert store.deleted_topics == {"T": cutoff}
    assert bodies(store, "T", 0) == [b"new-1"]
    assert bodies(store, "Other", 0) == [b"o"]
    store.delete_topic("T")
    store = _reopen(store, open_store)
    assert store.queues.queues_of("T") == []


def test_a_replica_deletes_below_the_delete_records_offset(open_store: OpenStore) -> None:
    store = open_store()
    put(store, "T", 0, b"old")
    (at,) = put(store, "Meta", 0, b"delete T")  # where the master's delete record lies
    store.delete_topic("T", at)  # as a slave applies it
    assert store.deleted_topics == {"T": at}
    put(store, "T", 0, b"new")  # the topic created again: queue offset 0 again
    store = _reopen(store, open_store)
    assert bodies(store, "T", 0) == [b"new"]


def test_cutoffs_below_the_logs_start_are_forgotten(open_store: OpenStore) -> None:
    store = open_store()
    put(store, "T", 0, b"x")
    store.delete_topic("T")
    for _ in range(20):  # 10 KB over 4 KiB segments
        put(store, "Other", 0, b"y" * 500)
    assert len(store.commitlog.chain.segments) >= 3
    store.flush()
    assert store.delete_expired(force=True) >= 1
    store.delete_topic("Unrelated")  # a save prunes what the log no longer holds
    assert "T" not in store.deleted_topics
    store = _reopen(store, open_store)
    assert "T" not in store.deleted_topics
