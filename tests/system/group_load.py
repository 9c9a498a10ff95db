"""What the failover scenarios share: a producer running in the background that records every
acknowledged send, reading a whole topic back, and the check that a deposed master rejoined."""

import asyncio
import time
from types import TracebackType

from ferrymq.client.consumer import PullConsumer, PullStatus
from ferrymq.client.producer import Producer
from ferrymq.errors import FerryError
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.bodies import KVTable, decode_body
from ferrymq.wire.codes import RequestCode
from ferrymq.wire.frame import RemotingCommand


async def runtime(rpc: RpcClient, address: str) -> dict[str, str]:
    """A broker's GET_BROKER_RUNTIME_INFO table."""
    response = await rpc.call(address, RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO), 3)
    return decode_body(response.body, KVTable).table


async def rejoined_as_slave(rpc: RpcClient, old: str, new: str) -> bool:
    """The old master follows the new one and holds the same log end."""
    mine, theirs = await runtime(rpc, old), await runtime(rpc, new)
    return mine.get("brokerRole") == "SLAVE" and mine.get("commitLogMaxOffset") == theirs.get(
        "commitLogMaxOffset"
    )


class BackgroundSends:
    """Sends `<prefix>-<n>` one after another until the block ends; `acked` holds every body a
    broker acknowledged (failed and unknown sends are left out and the next one goes on)."""

    def __init__(self, producer: Producer, topic: str, prefix: bytes = b"m") -> None:
        self.producer = producer
        self.topic = topic
        self.prefix = prefix
        self.acked: set[bytes] = set()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            body = b"%s-%06d" % (self.prefix, i)
            i += 1
            try:
                await self.producer.send(self.topic, body)
            except FerryError:
                await asyncio.sleep(0.02)
                continue
            self.acked.add(body)

    async def until_more(self, what: str, limit_s: float = 60) -> None:
        """Wait until at least one more send is acknowledged than now."""
        before = len(self.acked)
        deadline = time.monotonic() + limit_s
        while len(self.acked) <= before:
            assert time.monotonic() < deadline, f"{what}: not within {limit_s:g} s"
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> "BackgroundSends":
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


async def read_topic(namesrv: str, group: str, topic: str) -> set[bytes]:
    """Every body stored in the topic's queues, read from offset 0 to the end."""
    consumed: set[bytes] = set()
    async with PullConsumer(namesrv, group) as consumer:
        for queue in await consumer.queues(topic):
            offset = 0
            while True:
                pulled = await consumer.pull(queue, offset, max_messages=256)
                if pulled.status is not PullStatus.FOUND:
                    break
                consumed |= {m.body for m in pulled.messages}
                offset = pulled.next_offset
    return consumed
