"""`LocalCluster`: a NameServer and brokers in this process, on free ports, for tests and users.

```python
async with LocalCluster(tmp_path) as cluster:
    cluster.namesrv_addr   # give it to producers and consumers
    cluster.brokers[0]     # the Broker objects, to inspect their stores
```

Everything listens on 127.0.0.1 port 0 and stores under `root`. The cluster is ready when every
broker has registered with the NameServer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerConfig
from ferrymq.namesrv.server import NameServer, NamesrvConfig

__all__ = ["LocalCluster"]


class LocalCluster:
    """An in-process NameServer and `brokers` master brokers (groups broker-a, broker-b, ...)."""

    def __init__(self, root: Path, *, brokers: int = 1, **broker_config: Any) -> None:
        self.root = root
        self.namesrv = NameServer(NamesrvConfig(listen_port=0, scan_interval=0.2))
        self.brokers: list[Broker] = []
        self._broker_count = brokers
        self._broker_config = {
            "listen_port": 0,
            "mapped_file_size_commit_log": 64 * 1024 * 1024,
            "register_name_server_period": 2000,
            # every server here shares the caller's loop: polling it would only spend its CPU
            "busy_poll_micros": 0,
            **broker_config,
        }

    @property
    def namesrv_addr(self) -> str:
        """The NameServer's address."""
        return self.namesrv.address

    @property
    def broker(self) -> Broker:
        """The first broker."""
        return self.brokers[0]

    def broker_config(self, index: int) -> BrokerConfig:
        """The config broker `index` runs (or would run) with."""
        name = f"broker-{chr(ord('a') + index)}"
        return BrokerConfig(
            broker_name=name,
            namesrv_addr=self.namesrv.address,
            store_path_root_dir=self.root / name,
            **self._broker_config,
        )

    async def start(self) -> None:
        """Start the NameServer, then every broker, and wait for their registrations."""
        await self.namesrv.start()
        for index in range(self._broker_count):
            broker = Broker(self.broker_config(index))
            await broker.start()
            self.brokers.append(broker)
            await broker.register()

    async def restart_broker(self, index: int = 0, **changes: Any) -> Broker:
        """Close broker `index` cleanly and start it again on its store, maybe reconfigured."""
        old = self.brokers[index]
        await old.close()
        config = dataclasses.replace(old.config, **changes)
        broker = Broker(config)
        await broker.start()
        await broker.register()
        self.brokers[index] = broker
        return broker

    async def close(self) -> None:
        """Stop every broker, then the NameServer."""
        for broker in self.brokers:
            await broker.close()
        self.brokers.clear()
        await self.namesrv.close()

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
