"""mqadmin's command names and flags run the same `ferry admin` commands (in-process cluster)."""

import json

from ferrymq.client.consumer import PullConsumer
from ferrymq.testing import LocalCluster

from .test_admin_cli import Ferry


async def test_mqadmin_names_and_flags_run_the_ferry_commands(cluster: LocalCluster) -> None:
    ns = cluster.namesrv_addr
    addr = cluster.broker.address
    ferry = Ferry("127.0.0.1:1")  # -n must win over `ferry admin --namesrv`
    created = await ferry("updateTopic", "-n", ns, "-t", "Mq", "-c", "DefaultCluster", "-w", "4")
    same = await Ferry(ns)("topic", "create", "Mq", "--cluster", "DefaultCluster", "--queues", "4")
    assert created == same == f"topic Mq: 4 queues on {addr}\n"
    route = await ferry("topicRoute", "-n", ns, "-t", "Mq")  # mqadmin prints the route as JSON
    assert json.loads(route) == await Ferry(ns)("topic", "route", "Mq", "--json")
    await ferry("updateTopic", "-n", ns, "-t", "MqB", "-b", addr, "-w", "2", "-o", "true")
    assert cluster.broker.state.topics.configs["MqB"].order
    await ferry(
        "updateSubGroup", "-n", ns, "-g", "MqG", "-c", "DefaultCluster", "-r", "5", "-d", "false"
    )
    group = cluster.broker.state.groups.configs["MqG"]
    assert (group.retry_max_times, group.consume_broadcast_enable) == (5, False)
    await ferry("updateBrokerConfig", "-n", ns, "-b", addr, "-k", "maxMessageSize", "-v", "2000000")
    assert cluster.broker.state.config.max_message_size == 2_000_000
    await ferry("updateKvConfig", "-n", ns, "-s", "ORDER_TOPIC_CONFIG", "-k", "Mq", "-v", "b:4")
    assert cluster.namesrv.admin.kv == {"ORDER_TOPIC_CONFIG": {"Mq": "b:4"}}
    await ferry("deleteKvConfig", "-n", ns, "-s", "ORDER_TOPIC_CONFIG", "-k", "Mq")
    assert cluster.namesrv.admin.kv == {}
    moved = await ferry("resetOffsetByTime", "-n", ns, "-g", "MqG", "-t", "Mq", "-s", "now")
    assert "broker-a" in moved
    async with PullConsumer(ns, "MqG") as consumer:
        assert await consumer.committed((await consumer.queues("Mq"))[0]) == 0
    progress = await ferry("consumerProgress", "-n", ns, "-g", "MqG", "-t", "Mq", "--json")
    same = await Ferry(ns)("consumer", "progress", "MqG", "--topic", "Mq", "--json")
    assert progress["offsetTable"] == same["offsetTable"]
    assert {(e["queueId"], e["consumerOffset"]) for e in progress["offsetTable"]} == {
        (q, 0) for q in range(4)
    }
    clusters = await ferry("clusterList", "-n", ns, "--json")
    assert clusters == await Ferry(ns)("cluster", "list", "--json")
    assert clusters["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {"0": addr}
    listed = await ferry("aliases", "--json")
    assert {"updateTopic", "updateSubGroup", "haStatus", "printMsg"} <= {
        a["mqadmin"] for a in listed
    }

    # bad arguments: one line, exit 2
    unknown = await ferry("updateTopic", "-n", ns, "-t", "Mq", "-r", "4", code=2)
    assert "-r" in unknown  # readQueueNums: ferry topics have one queue count
    await ferry("updateSubGroup", "-n", ns, "-c", "DefaultCluster", code=2)  # no -g
    await ferry("updateTopicPerm", "-n", ns, "-t", "Mq", "-p", "5", code=2)
    await ferry("updateSubGroup", "-n", ns, "-g", "G", "-d", "maybe", code=2)
    await ferry("resetOffsetByTime", "-n", ns, "-g", "G", "-t", "Mq", "-s", "yesterday", code=2)
    nowhere = await ferry("updateTopic", "-n", ns, "-t", "Mq", "-b", "127.0.0.1:1", code=1)
    assert nowhere == "ferry: error: no broker at 127.0.0.1:1 in the cluster"
