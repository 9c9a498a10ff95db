"""The table of consume queues of a store: `consumequeue/<topic>/<queue_id>/`.

Topic names become directory names here, so a queue is only ever created for a name that passes
`validate_topic`; directories on disk with other names are skipped with a warning at load.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from ferrymq.errors import InvalidNameError
from ferrymq.model import validate_topic
from ferrymq.store.consumequeue import ConsumeQueue

__all__ = ["QueueTable"]

log = logging.getLogger(__name__)

_MAX_QUEUE_ID = 65535


class QueueTable:
    """Every consume queue of a store, created on first use."""

    def __init__(self, directory: Path, entries_per_segment: int) -> None:
        self.directory = directory
        self.entries_per_segment = entries_per_segment
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def load(self) -> None:
        """Open every consume queue on disk."""
        if not self.directory.exists():
            return
        for topic_dir in sorted(self.directory.iterdir()):
            try:
                validate_topic(topic_dir.name, max_length=32767)
            except InvalidNameError as exc:
                log.warning("skipping %s: %s", topic_dir, exc)
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if not queue_dir.name.isdigit() or int(queue_dir.name) > _MAX_QUEUE_ID:
                    log.warning("skipping %s: not a queue id", queue_dir)
                    continue
                queue = self._new(topic_dir.name, int(queue_dir.name))
                queue.load()

    def _new(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = ConsumeQueue(
            self.directory / topic / str(queue_id), topic, queue_id, self.entries_per_segment
        )
        self._queues[topic, queue_id] = queue
        return queue

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue, if it exists."""
        return self._queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue, created (after validating the topic name) if needed."""
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            validate_topic(topic, max_length=32767)
            if not 0 <= queue_id <= _MAX_QUEUE_ID:
                raise ValueError(f"queue id {queue_id} is outside 0..{_MAX_QUEUE_ID}")
            queue = self._new(topic, queue_id)
        return queue

    def topics(self) -> set[str]:
        """Names of topics that have at least one queue."""
        return {topic for topic, _ in self._queues}

    def queues_of(self, topic: str) -> list[ConsumeQueue]:
        """The queues of one topic, by queue id."""
        return sorted(
            (q for (t, _), q in self._queues.items() if t == topic), key=lambda q: q.queue_id
        )

    def delete_topic(self, topic: str) -> int:
        """Close and delete every queue of `topic`; return how many there were."""
        doomed = self.queues_of(topic)
        for queue in doomed:
            queue.close()
            del self._queues[topic, queue.queue_id]
        shutil.rmtree(self.directory / topic, ignore_errors=True)
        return len(doomed)

    def close(self) -> None:
        """Close every queue."""
        for queue in self._queues.values():
            queue.close()
