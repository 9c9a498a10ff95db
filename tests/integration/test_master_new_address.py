"""A master that comes back on another address under its epoch (restarted before any election):
its slave follows it there when the controller's view names that address, so what the master
takes is replicated and acknowledged again. Found by tests/system/test_queue_moves.py (a slave
asked the old address for ever and SEAL_QUEUE never answered).

As test_role_change.py, no controller runs: the test calls what the controller's answers call.
"""

from pathlib import Path

from ferrymq.broker.broker import Broker
from ferrymq.namesrv.server import NameServer
from ferrymq.rpc.client import RpcClient
from ferrymq.wire.codes import ResponseCode

from .remoting import create_topic, send
from .test_role_change import TOPIC, _bodies, _config, _until, namesrv  # noqa: F401 - fixture


async def test_a_slave_follows_its_master_back_at_a_new_address_under_the_same_epoch(
    tmp_path: Path,
    namesrv: NameServer,  # noqa: F811 - the fixture
) -> None:
    brokers = {i: Broker(_config(tmp_path, namesrv, i)) for i in (1, 2)}
    for broker in brokers.values():
        await broker.start()
    try:
        async with RpcClient() as client:
            assert await brokers[1].change_to_master(1, frozenset({1, 2}))
            brokers[1].state.lease = None
            assert await brokers[2].change_to_slave(brokers[1].address, 1)
            await create_topic(client, brokers[1].address, TOPIC, queues=1)
            response = await send(client, brokers[1].address, TOPIC, b"before")
            assert response.code == ResponseCode.SUCCESS, response.remark

            # the master restarts on another port and is named master again at epoch 1
            await brokers[1].close()
            brokers[1] = Broker(_config(tmp_path, namesrv, 1))
            await brokers[1].start()
            assert await brokers[1].change_to_master(1, frozenset({1, 2}))
            brokers[1].state.lease = None
            replicas = brokers[2].replicas
            assert replicas is not None
            await replicas.apply(1, brokers[1].address, 1, None)

            response = await send(client, brokers[1].address, TOPIC, b"after")
            assert response.code == ResponseCode.SUCCESS, response.remark  # the slave acked it
            await _until(lambda: _bodies(brokers[2]) == [b"before", b"after"])
    finally:
        for broker in brokers.values():
            await broker.close()
