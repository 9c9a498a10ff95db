"""The blocking SDK for scripts and Spark workers: the asyncio clients behind plain calls.

```python
from ferrymq.sync import Producer

with Producer("127.0.0.1:9876") as producer:
    result = producer.send("Orders", b"hello", keys="order-1")
```

Rules:
1. Each facade object owns one asyncio loop (uvloop where available) running in a daemon thread
   of its own, and the async client lives on that loop. A blocking method submits the async one
   to the loop and waits for its result in the calling thread; many threads may call one facade.
2. Errors are the async SDK's typed errors (`ferrymq.errors`), raised unchanged in the caller.
3. `close()` (or leaving the `with` block) closes the async client on its loop, cancels whatever
   is left there, and stops and joins the thread. Methods of a closed facade raise
   `RuntimeError`, as do calls made from the facade's own loop thread (they would deadlock).
4. User callbacks (push listeners, local transactions, check listeners) are plain functions. They
   run in a thread pool the facade owns (`concurrency` threads for a push consumer), never on the
   loop, so a slow callback does not stall pulls, heartbeats or other callbacks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from ferrymq.client import admin as async_admin
from ferrymq.client import consumer as async_consumer
from ferrymq.client import producer as async_producer
from ferrymq.client import push as async_push
from ferrymq.client import simple as async_simple
from ferrymq.client import transaction as async_transaction
from ferrymq.client.consumer import PullResult
from ferrymq.client.message import Message, SendResult
from ferrymq.client.push import ConsumeFrom, MessageModel
from ferrymq.client.simple import ReceivedMessage
from ferrymq.client.transaction import TransactionSendResult, TransactionState
from ferrymq.model import MessageQueue
from ferrymq.rpc.loop import new_event_loop
from ferrymq.wire.bodies import ClusterInfo, ConsumeStatsEntry, TopicOffsetEntry, TopicRouteData

__all__ = [
    "AdminClient",
    "Producer",
    "PullConsumer",
    "PushConsumer",
    "SimpleConsumer",
    "TransactionProducer",
]

T = TypeVar("T")


class _LoopThread:
    """An event loop running in a daemon thread, and a way to run coroutines on it and wait."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the loop and return its result (or raise its error) here."""
        if self._closed:
            work.close()
            raise RuntimeError("this ferrymq client is closed")
        if threading.current_thread() is self._thread:
            work.close()
            raise RuntimeError("a blocking ferrymq call was made from its own loop thread")
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt while waiting: stop the work too
            raise

    def close(self, final: Coroutine[Any, Any, None]) -> None:
        """Run `final` (the client's close), cancel what is left, stop the loop and the thread."""
        if self._closed:
            final.close()
            return
        try:
            self.run(final)
        finally:
            self._closed = True
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(_cancel_rest(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            if not self._thread.is_alive():
                self.loop.close()


async def _cancel_rest() -> None:
    current = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not current]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


class _Facade:
    """A blocking client: owns a loop thread; a context manager."""

    _runner: _LoopThread

    def _close_client(self) -> Coroutine[Any, Any, None]:
        raise NotImplementedError

    def close(self) -> None:
        """Close the client and stop its loop thread."""
        self._runner.close(self._close_client())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Producer(_Facade):
    """Blocking `ferrymq.Producer`: sends messages and waits for the broker's answer."""

    def __init__(
        self,
        namesrv_addr: str,
        group: str = "DEFAULT_PRODUCER",
        *,
        send_timeout: float = 3.0,
        retries: int = 2,
    ) -> None:
        self._runner = _LoopThread("ferrymq-producer")
        self._producer = async_producer.Producer(
            namesrv_addr, group, send_timeout=send_timeout, retries=retries
        )
        self._runner.run(self._producer.start())

    def _close_client(self) -> Coroutine[Any, Any, None]:
        return self._producer.close()

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues, in a stable order (to pick one by a key's hash)."""
        return self._runner.run(self._producer.queues(topic))

    def send(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: list[str] | str | None = None,
        properties: dict[str, str] | None = None,
        queue: MessageQueue | None = None,
        delay_level: int = 0,
        delay_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> SendResult:
        """Send one message; see `ferrymq.Producer.send` for the arguments and errors."""
        return self._runner.run(
            self._producer.send(
                topic,
                body,
                tags=tags,
                keys=keys,
                properties=properties,
                queue=queue,
                delay_level=delay_level,
                delay_ms=delay_ms,
                deliver_at_ms=deliver_at_ms,
            )
        )

    def send_oneway(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: list[str] | str | None = None,
        properties: dict[str, str] | None = None,
        queue: MessageQueue | None = None,
    ) -> str:
        """Send without waiting for an answer; see `ferrymq.Producer.send_oneway`."""
        return self._runner.run(
            self._producer.send_oneway(
                topic, body, tags=tags, keys=keys, properties=properties, queue=queue
            )
        )

    def send_batch(
        self,
        topic: str,
        bodies: list[bytes],
        *,
        tags: str | None = None,
        queue: MessageQueue | None = None,
    ) -> SendResult:
        """Send several messages to one queue in one request."""
        return self._runner.run(self._producer.send_batch(topic, bodies, tags=tags, queue=queue))


class TransactionProducer(_Facade):
    """Blocking `ferrymq.TransactionProducer`: local transactions and checks are plain functions."""

    def __init__(
        self,
        namesrv_addr: str,
        group: str,
        check_listener: Callable[[Message], TransactionState],
        *,
        send_timeout: float = 3.0,
        heartbeat_interval: float = 10.0,
        callback_threads: int = 4,
    ) -> None:
        self._runner = _LoopThread("ferrymq-transactions")
        self._pool = concurrent.futures.ThreadPoolExecutor(
            callback_threads, thread_name_prefix="ferrymq-transaction-callback"
        )

        async def check(message: Message) -> TransactionState:
            return await self._in_pool(check_listener, message)

        self._producer = async_transaction.TransactionProducer(
            namesrv_addr,
            group,
            check,
            send_timeout=send_timeout,
            heartbeat_interval=heartbeat_interval,
        )
        self._runner.run(self._producer.start())

    async def _in_pool(
        self, function: Callable[[Message], TransactionState], message: Message
    ) -> TransactionState:
        return await asyncio.get_running_loop().run_in_executor(self._pool, function, message)

    async def _close_and_drain(self) -> None:
        await self._producer.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _close_client(self) -> Coroutine[Any, Any, None]:
        return self._close_and_drain()

    def send_in_transaction(
        self,
        topic: str,
        body: bytes,
        execute: Callable[[Message], TransactionState],
        *,
        tags: str | None = None,
        keys: list[str] | str | None = None,
        properties: dict[str, str] | None = None,
    ) -> TransactionSendResult:
        """Send a half message, run `execute(message)`, and commit or roll back as it returns."""

        async def run_local(message: Message) -> TransactionState:
            return await self._in_pool(execute, message)

        return self._runner.run(
            self._producer.send_in_transaction(
                topic, body, run_local, tags=tags, keys=keys, properties=properties
            )
        )


class PullConsumer(_Facade):
    """Blocking `ferrymq.PullConsumer`: read queues by offset, commit offsets."""

    def __init__(
        self, namesrv_addr: str, group: str = "DEFAULT_CONSUMER", *, request_timeout: float = 5.0
    ) -> None:
        self._runner = _LoopThread("ferrymq-pull-consumer")
        self._consumer = async_consumer.PullConsumer(
            namesrv_addr, group, request_timeout=request_timeout
        )

    def _close_client(self) -> Coroutine[Any, Any, None]:
        return self._consumer.close()

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues."""
        return self._runner.run(self._consumer.queues(topic))

    def pull(
        self,
        queue: MessageQueue,
        offset: int,
        *,
        max_messages: int = 32,
        max_bytes: int | None = None,
        expression: str = "*",
        wait: float = 0.0,
    ) -> PullResult:
        """Up to `max_messages` messages from `offset`; with `wait` seconds, long-poll."""
        return self._runner.run(
            self._consumer.pull(
                queue,
                offset,
                max_messages=max_messages,
                max_bytes=max_bytes,
                expression=expression,
                wait=wait,
            )
        )

    def fetch_range(
        self, queue: MessageQueue, start: int, end: int, *, max_bytes: int | None = None
    ) -> list[Message]:
        """Exactly the messages at queue offsets `[start, end)`."""
        return self._runner.run(self._consumer.fetch_range(queue, start, end, max_bytes=max_bytes))

    def max_offset(self, queue: MessageQueue) -> int:
        """The offset the queue's next message will get."""
        return self._runner.run(self._consumer.max_offset(queue))

    def min_offset(self, queue: MessageQueue) -> int:
        """The first offset still stored."""
        return self._runner.run(self._consumer.min_offset(queue))

    def offset_for_time(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after `timestamp_ms`."""
        return self._runner.run(self._consumer.offset_for_time(queue, timestamp_ms))

    def committed(self, queue: MessageQueue) -> int | None:
        """The group's committed offset in the queue, or None."""
        return self._runner.run(self._consumer.committed(queue))

    def commit(self, queue: MessageQueue, offset: int) -> None:
        """Commit the group's position in the queue (the next offset to read)."""
        self._runner.run(self._consumer.commit(queue, offset))


class SimpleConsumer(_Facade):
    """Blocking `ferrymq.SimpleConsumer`: receive by POP, ack, change invisible durations."""

    def __init__(
        self,
        namesrv_addr: str,
        group: str,
        *,
        fifo: bool = False,
        from_first: bool = True,
        request_timeout: float = 5.0,
    ) -> None:
        self._runner = _LoopThread("ferrymq-simple-consumer")
        self._consumer = async_simple.SimpleConsumer(
            namesrv_addr,
            group,
            fifo=fifo,
            from_first=from_first,
            request_timeout=request_timeout,
        )

    def _close_client(self) -> Coroutine[Any, Any, None]:
        return self._consumer.close()

    def receive(
        self,
        topic: str,
        *,
        max_messages: int = 16,
        invisible_duration: float = 30.0,
        wait: float = 0.0,
        expression: str = "*",
    ) -> list[ReceivedMessage]:
        """Up to `max_messages` messages, each invisible to the group for `invisible_duration`."""
        return self._runner.run(
            self._consumer.receive(
                topic,
                max_messages=max_messages,
                invisible_duration=invisible_duration,
                wait=wait,
                expression=expression,
            )
        )

    def ack(self, received: ReceivedMessage) -> None:
        """Acknowledge a received message: it is never delivered again."""
        self._runner.run(self._consumer.ack(received))

    def ack_batch(self, messages: Sequence[ReceivedMessage]) -> None:
        """Acknowledge several received messages, one request per broker group."""
        self._runner.run(self._consumer.ack_batch(messages))

    def change_invisible_duration(self, received: ReceivedMessage, duration: float) -> None:
        """Make a message invisible for `duration` seconds from now (its handle is replaced)."""
        self._runner.run(self._consumer.change_invisible_duration(received, duration))


class PushConsumer(_Facade):
    """Blocking `ferrymq.PushConsumer`: `callback(message)` runs in a thread pool of its own.

    A callback that raises asks for the message again (later, from the group's retry topic; in
    order and in place for an orderly consumer), as the async consumer's listener does.
    """

    def __init__(
        self,
        namesrv_addr: str,
        group: str,
        callback: Callable[[Message], None],
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        consume_from: ConsumeFrom = ConsumeFrom.LAST_OFFSET,
        consume_timestamp_ms: int = 0,
        orderly: bool = False,
        concurrency: int = 8,
        max_cached_messages: int = 1000,
        pull_batch: int = 32,
        commit_interval: float = 5.0,
        max_reconsume_times: int = 16,
        client_id: str | None = None,
    ) -> None:
        self._runner = _LoopThread("ferrymq-push-consumer")
        self._pool = concurrent.futures.ThreadPoolExecutor(
            concurrency, thread_name_prefix="ferrymq-consume"
        )
        self._callback = callback
        self._consumer = async_push.PushConsumer(
            namesrv_addr,
            group,
            self._listen,
            message_model=message_model,
            consume_from=consume_from,
            consume_timestamp_ms=consume_timestamp_ms,
            orderly=orderly,
            concurrency=concurrency,
            max_cached_messages=max_cached_messages,
            pull_batch=pull_batch,
            commit_interval=commit_interval,
            max_reconsume_times=max_reconsume_times,
            client_id=client_id,
        )
        self._started = False

    async def _listen(self, message: Message) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._callback, message)

    @property
    def consumed(self) -> int:
        """Messages the callback handled without raising."""
        return self._consumer.consumed

    @property
    def assigned(self) -> list[MessageQueue]:
        """Queues this client consumes now."""
        return self._consumer.assigned

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume `topic`, filtered by a tag expression (`TagA || TagB`, or `*`)."""
        self._consumer.subscribe(topic, expression)

    def start(self) -> None:
        """Join the group and start consuming (in the background; this returns at once)."""
        self._runner.run(self._consumer.start())
        self._started = True

    def commit_now(self) -> None:
        """Commit every queue's offset now."""
        self._runner.run(self._consumer.commit_now())

    async def _close_and_drain(self) -> None:
        if self._started:
            await self._consumer.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _close_client(self) -> Coroutine[Any, Any, None]:
        return self._close_and_drain()

    def __enter__(self) -> Self:
        """Start consuming (subscribe first)."""
        self.start()
        return self


class AdminClient(_Facade):
    """Blocking `ferrymq.AdminClient`: topics, clusters, routes, progress, offsets, messages."""

    def __init__(self, namesrv_addr: str, *, timeout: float = 5.0) -> None:
        self._runner = _LoopThread("ferrymq-admin")
        self._admin = async_admin.AdminClient(namesrv_addr, timeout=timeout)

    def _close_client(self) -> Coroutine[Any, Any, None]:
        return self._admin.close()

    def cluster_info(self) -> ClusterInfo:
        """Every broker group and cluster the NameServer knows."""
        return self._runner.run(self._admin.cluster_info())

    def route(self, topic: str) -> TopicRouteData | None:
        """A topic's route, or None when no NameServer knows it."""
        return self._runner.run(self._admin.route(topic))

    def topics(self) -> list[str]:
        """Every routed topic."""
        return self._runner.run(self._admin.topics())

    def create_topic(
        self,
        topic: str,
        queues: int = 8,
        *,
        cluster: str | None = None,
        broker_name: str | None = None,
        perm: int = 6,
        order: bool = False,
    ) -> list[str]:
        """Create (or change) a topic on every master of a cluster or one broker group."""
        return self._runner.run(
            self._admin.create_topic(
                topic, queues, cluster=cluster, broker_name=broker_name, perm=perm, order=order
            )
        )

    def delete_topic(self, topic: str, *, cluster: str | None = None) -> None:
        """Delete a topic from the masters and the NameServers."""
        self._runner.run(self._admin.delete_topic(topic, cluster=cluster))

    def topic_status(self, topic: str) -> list[TopicOffsetEntry]:
        """Every queue's min and max offsets and last store time."""
        return self._runner.run(self._admin.topic_status(topic))

    def consumer_progress(self, group: str, topic: str | None = None) -> list[ConsumeStatsEntry]:
        """A group's committed offsets against each queue's end."""
        return self._runner.run(self._admin.consumer_progress(group, topic))

    def reset_offsets(
        self, group: str, topic: str, *, timestamp_ms: int | None = None, to_latest: bool = False
    ) -> dict[tuple[str, int], int]:
        """Move a group's committed offsets in a topic to the earliest, latest, or a time."""
        return self._runner.run(
            self._admin.reset_offsets(group, topic, timestamp_ms=timestamp_ms, to_latest=to_latest)
        )

    def messages_by_key(
        self, topic: str, key: str, *, max_count: int = 32, begin_ms: int = 0, end_ms: int = 2**62
    ) -> list[Message]:
        """Messages of a topic whose keys (or unique key) include `key`."""
        return self._runner.run(
            self._admin.messages_by_key(
                topic, key, max_count=max_count, begin_ms=begin_ms, end_ms=end_ms
            )
        )

    def message_by_id(self, offset_msg_id: str) -> Message:
        """The message with an offset message id."""
        return self._runner.run(self._admin.message_by_id(offset_msg_id))
