"""The NameServer route table, driven with an explicit clock."""

from ferrymq.namesrv.routes import MASTER_ID, RouteTable
from ferrymq.wire.bodies import DataVersion, TopicConfig


def _register(
    table: RouteTable,
    addr: str,
    name: str = "b1",
    broker_id: int = MASTER_ID,
    *,
    topics: dict[str, TopicConfig] | None = None,
    state: int = 0,
    now: float = 0.0,
    cluster: str = "c1",
) -> bool:
    return table.register(
        cluster=cluster,
        broker_addr=addr,
        broker_name=name,
        broker_id=broker_id,
        ha_server_addr=addr.replace(":1", ":2"),
        data_version=DataVersion(state_version=state),
        topics=topics,
        now=now,
        timeout=30.0,
    ).accepted


def _topic(name: str, queues: int = 4) -> dict[str, TopicConfig]:
    return {name: TopicConfig(topic_name=name, read_queue_nums=queues, write_queue_nums=queues)}


def test_a_master_registration_publishes_its_topics() -> None:
    table = RouteTable()
    assert _register(table, "127.0.0.2:1", topics=_topic("T"))
    route = table.route_of("T")
    assert route is not None
    assert [(q.broker_name, q.write_queue_nums) for q in route.queue_datas] == [("b1", 4)]
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.2:1"}
    assert table.route_of("missing") is None


def test_slaves_join_their_group_and_learn_the_master() -> None:
    table = RouteTable()
    _register(table, "127.0.0.2:1", topics=_topic("T"))
    result = table.register(
        cluster="c1",
        broker_addr="127.0.0.3:1",
        broker_name="b1",
        broker_id=2,
        ha_server_addr="127.0.0.3:2",
        data_version=DataVersion(),
        topics=_topic("Other"),
        now=0.0,
        timeout=30.0,
    )
    assert (result.master_addr, result.ha_server_addr) == ("127.0.0.2:1", "127.0.0.2:2")
    route = table.route_of("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.2:1", 2: "127.0.0.3:1"}
    assert table.route_of("Other") is None  # only the master states the group's topics


def test_a_stale_master_cannot_overwrite_a_newer_one() -> None:
    table = RouteTable()
    assert _register(table, "127.0.0.2:1", state=5, topics=_topic("T"))
    assert not _register(table, "127.0.0.3:1", state=4, topics=_topic("T"))
    route = table.route_of("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.2:1"}
    assert _register(table, "127.0.0.3:1", state=6, topics=_topic("T"))
    route = table.route_of("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs[0] == "127.0.0.3:1"


def test_a_master_that_becomes_a_slave_leaves_id_zero() -> None:
    table = RouteTable()
    _register(table, "127.0.0.2:1", state=1, topics=_topic("T"))
    _register(table, "127.0.0.3:1", broker_id=2, state=1)
    _register(table, "127.0.0.3:1", state=2, topics=_topic("T"))  # elected
    _register(table, "127.0.0.2:1", broker_id=1, state=2)  # the old master, now a slave
    route = table.route_of("T")
    assert route is not None
    assert route.broker_datas[0].broker_addrs == {0: "127.0.0.3:1", 1: "127.0.0.2:1"}


def test_silent_brokers_expire_and_take_their_topics_along() -> None:
    table = RouteTable()
    _register(table, "127.0.0.2:1", topics=_topic("T"), now=0.0)
    _register(table, "127.0.0.4:1", name="b2", topics=_topic("T", 2), now=20.0)
    assert table.expire(now=31.0) == ["127.0.0.2:1"]
    route = table.route_of("T")
    assert route is not None
    assert [q.broker_name for q in route.queue_datas] == ["b2"]
    assert table.heartbeat("127.0.0.4:1", now=45.0)
    assert table.expire(now=60.0) == []
    assert not table.heartbeat("127.0.0.2:1", now=60.0)


def test_a_master_stating_fewer_topics_drops_the_rest() -> None:
    table = RouteTable()
    _register(table, "127.0.0.2:1", topics={**_topic("A"), **_topic("B")})
    _register(table, "127.0.0.2:1", topics=_topic("A"))
    assert table.topics() == ["A"]


def test_cluster_info_and_topic_deletion() -> None:
    table = RouteTable()
    _register(table, "127.0.0.2:1", topics=_topic("T"))
    _register(table, "127.0.0.5:1", name="x1", cluster="c2", topics=_topic("T"))
    info = table.cluster_info()
    assert info.cluster_addr_table == {"c1": ["b1"], "c2": ["x1"]}
    assert table.topics_of_cluster("c2") == ["T"]
    assert table.delete_topic("T", cluster="c1")
    route = table.route_of("T")
    assert route is not None
    assert [q.broker_name for q in route.queue_datas] == ["x1"]
    assert table.unregister_address("127.0.0.5:1")
    assert table.route_of("T") is None
    assert table.cluster_info().cluster_addr_table == {"c1": ["b1"]}


def test_a_broker_name_cannot_move_to_another_cluster() -> None:
    table = RouteTable()
    _register(table, "127.0.0.2:1")
    assert not _register(table, "127.0.0.3:1", cluster="other", broker_id=1)


def test_after_the_clock_steps_back_a_silent_broker_expires_within_its_timeout() -> None:
    table = RouteTable()
    _register(table, "127.0.0.2:1", topics=_topic("T"), now=1000.0)
    assert table.expire(now=760.0) == []  # the clock went back four minutes
    assert table.expire(now=790.0) == []
    assert table.expire(now=790.5) == ["127.0.0.2:1"]


def test_a_wiped_group_is_read_only_in_every_route_until_added_back() -> None:
    table = RouteTable()
    _register(table, "127.0.0.2:1", "b1", topics={**_topic("T"), **_topic("U")})
    _register(table, "127.0.0.3:1", "b2", topics=_topic("T"))
    version = table.version
    assert table.wipe_write_perm("b1") == 2
    assert table.version > version

    def perms(topic: str) -> dict[str, int]:
        route = table.route_of(topic)
        assert route is not None
        return {q.broker_name: q.perm for q in route.queue_datas}

    assert perms("T") == {"b1": 4, "b2": 6}
    assert perms("U") == {"b1": 4}
    # the group's master registers again, even with changed topics: still read-only
    _register(table, "127.0.0.2:1", "b1", topics={**_topic("T", 8), **_topic("U")}, now=1.0)
    assert perms("T") == {"b1": 4, "b2": 6}
    assert table.wipe_write_perm("b1") == 2, "wiping twice changes nothing"
    assert table.add_write_perm("b1") == 2
    assert perms("T") == {"b1": 6, "b2": 6}
    assert table.wipe_write_perm("nobody") == 0
    assert perms("T") == {"b1": 6, "b2": 6}
