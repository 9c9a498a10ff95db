"""Controller headers and bodies: RocketMQ's wire names, strict body decoding."""

import pytest

from ferrymq.errors import ProtocolError
from ferrymq.wire.bodies import decode_body, encode_body
from ferrymq.wire.controller import (
    BrokerMemberGroup,
    BrokerReplicasInfo,
    CleanControllerBrokerDataRequestHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    GetMetaDataResponseHeader,
    ReplicaIdentity,
    ReplicasInfo,
    SyncStateSet,
    decode_broker_names,
    decode_sync_state_set,
    parse_broker_id_list,
)
from ferrymq.wire.headers import from_ext_fields, to_ext_fields


def test_elect_master_header_uses_rocketmq_names_and_defaults() -> None:
    header = ElectMasterRequestHeader(
        cluster_name="C", broker_name="b", broker_id=2, designate_elect=True
    )
    assert to_ext_fields(header) == {
        "clusterName": "C",
        "brokerName": "b",
        "brokerId": "2",
        "designateElect": "true",
    }
    controller_trigger = from_ext_fields(ElectMasterRequestHeader, {"brokerName": "b"})
    assert controller_trigger.broker_id == -1
    assert not controller_trigger.designate_elect


def test_boolean_fields_keep_java_is_prefix() -> None:
    clean = CleanControllerBrokerDataRequestHeader(
        broker_name="b", broker_controller_ids_to_clean="1;2", is_clean_living_broker=True
    )
    assert to_ext_fields(clean) == {
        "brokerName": "b",
        "brokerControllerIdsToClean": "1;2",
        "isCleanLivingBroker": "true",
    }
    meta = GetMetaDataResponseHeader(group="g", is_leader=True, peers="n1:h:1;")
    assert to_ext_fields(meta)["isLeader"] == "true"


def test_sync_state_set_body_is_rocketmq_json() -> None:
    body = SyncStateSet(sync_state_set=[1, 2], sync_state_set_epoch=3)
    assert encode_body(body) == b'{"syncStateSet":[1,2],"syncStateSetEpoch":3}'
    assert decode_sync_state_set(b'{"syncStateSet":["1",2],"syncStateSetEpoch":"3"}') == body


@pytest.mark.parametrize(
    "data",
    [b"", b"[]", b'{"syncStateSet":"x"}', b'{"syncStateSet":[0]}', b'{"syncStateSet":[-4]}'],
)
def test_bad_sync_state_set_bodies_raise_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_sync_state_set(data)


def test_elect_master_body_keeps_broker_ids_as_map_keys() -> None:
    body = ElectMasterResponseBody(
        broker_member_group=BrokerMemberGroup(
            cluster="C", broker_name="b", broker_addrs={1: "h:1", 2: "h:2"}
        ),
        sync_state_set=[1],
    )
    data = encode_body(body)
    assert b'"brokerAddrs":{"1":"h:1","2":"h:2"}' in data
    assert decode_body(data, ElectMasterResponseBody) == body


def test_broker_replicas_info_round_trips() -> None:
    replica = ReplicaIdentity(broker_name="b", broker_id=1, broker_address="h:1", alive=True)
    info = BrokerReplicasInfo(
        {
            "b": ReplicasInfo(
                master_broker_id=1,
                master_address="h:1",
                master_epoch=2,
                sync_state_set_epoch=3,
                in_sync_replicas=[replica],
            )
        }
    )
    data = encode_body(info)
    assert b'"replicasInfoTable"' in data
    assert b'"inSyncReplicas"' in data
    assert decode_body(data, BrokerReplicasInfo) == info


def test_broker_names_body() -> None:
    assert decode_broker_names(b'["a","b"]') == ["a", "b"]
    with pytest.raises(ProtocolError):
        decode_broker_names(b'{"a":1}')


def test_broker_id_list() -> None:
    assert parse_broker_id_list("1;2;3") == {1, 2, 3}
    assert parse_broker_id_list("4;") == {4}
    with pytest.raises(ValueError, match="invalid literal"):
        parse_broker_id_list("1;x")
