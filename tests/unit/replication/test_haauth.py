"""HA authentication: the proof and the AUTH packets (pure)."""

import struct

import pytest

from ferrymq.errors import ProtocolError
from ferrymq.replication.haauth import check_proof, proof
from ferrymq.wire.ha import (
    AuthChallenge,
    MasterPacketDecoder,
    SlaveAuth,
    SlaveHandshake,
    SlavePacketDecoder,
    encode_auth_challenge,
    encode_slave_auth,
    encode_slave_handshake,
)

NONCE = bytes(range(32))
ADMINS = {"ak": "sk"}.get


def test_a_proof_holds_for_its_nonce_and_broker_only() -> None:
    good = SlaveAuth("ak", proof("sk", NONCE, 2))
    assert check_proof(ADMINS, good, NONCE, 2) is None
    assert check_proof(ADMINS, good, NONCE, 3) == "wrong proof for access key 'ak'"
    assert check_proof(ADMINS, good, bytes(32), 2) == "wrong proof for access key 'ak'"
    assert check_proof(ADMINS, SlaveAuth("x", good.proof), NONCE, 2) is not None
    assert check_proof(ADMINS, SlaveAuth("ak", b"short"), NONCE, 2) == "malformed nonce or proof"


def test_auth_packets_round_trip_split_anywhere() -> None:
    wire = encode_slave_handshake(SlaveHandshake(2)) + encode_slave_auth(SlaveAuth("ak", NONCE))
    decoder = SlavePacketDecoder()
    packets = [p for i in range(len(wire)) for p in decoder.feed(wire[i : i + 1])]
    assert packets == [SlaveHandshake(2), SlaveAuth("ak", NONCE)]
    assert MasterPacketDecoder().feed(encode_auth_challenge(NONCE)) == [AuthChallenge(NONCE)]


@pytest.mark.parametrize(
    ("wire", "error"),
    [
        (struct.pack(">ih", 64, 0), "accessKeyLen 0"),
        (struct.pack(">ih", 64, 30000), "accessKeyLen 30000"),
        (struct.pack(">ih", 64, 2) + b"\xff\xfe" + bytes(32), "not UTF-8"),
    ],
)
def test_bad_auth_answers_are_typed_errors(wire: bytes, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        SlavePacketDecoder().feed(wire)
