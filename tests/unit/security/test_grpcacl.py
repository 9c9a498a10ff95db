"""The gRPC endpoint's ACL 1.0 core: the MQv2-HMAC-SHA1 header and the decision (pure)."""

from __future__ import annotations

from ferrymq.security.acl import Perm, parse_acl
from ferrymq.security.grpcacl import decide_grpc, grpc_signature, parse_authorization

ACL = parse_acl(
    """
globalWhiteRemoteAddresses: [127.0.9.*]
accounts:
- {accessKey: client-v5, secretKey: client-secret, topicPerms: [T=PUB], groupPerms: [G=DENY]}
"""
)
DATE = "20261126T071500Z"


def _meta(header: str) -> dict[str, str]:
    return {"authorization": header, "x-mq-date-time": DATE}


def test_the_header_of_the_python_and_java_clients_parses_and_malformed_ones_do_not() -> None:
    sig = grpc_signature("client-secret", DATE)
    assert len(sig) == 40  # hex of HMAC-SHA1
    python = f"MQv2-HMAC-SHA1 Credential=client-v5, SignedHeaders=x-mq-date-time, Signature={sig}"
    java = f"MQv2-HMAC-SHA1 Credential=client-v5/us/rocketmq, SignedHeaders=x, Signature={sig}"
    assert parse_authorization(python) == ("client-v5", sig)
    assert parse_authorization(java) == ("client-v5", sig)
    huge = "MQv2-HMAC-SHA1 Credential=a, Signature=" + "f" * 5000
    for bad in (
        "",
        "Basic abc",
        "MQv2-HMAC-SHA1 Credential=, Signature=x",
        "MQv2-HMAC-SHA1 ,=",
        huge,
    ):
        assert parse_authorization(bad) is None, bad


def test_decisions_unauthorized_then_forbidden_and_the_white_address() -> None:
    sig = grpc_signature("client-secret", DATE)
    good = _meta(f"MQv2-HMAC-SHA1 Credential=client-v5, Signature={sig}")

    def decide(meta: dict[str, str], host: str = "127.0.0.1", *need: tuple[str, Perm]) -> object:
        found = decide_grpc(ACL, metadata=meta, host=host, resources=lambda: need)
        return None if found is None else (found.status, found.message)

    assert decide(good, "127.0.0.1", ("T", Perm.PUB)) is None
    assert decide({}) == (
        "UNAUTHORIZED",
        "No accessKey is configured (no MQv2-HMAC-SHA1 header)",
    )
    replayed = {**good, "x-mq-date-time": "20261126T071501Z"}  # the date is what is signed
    assert decide(replayed)[0] == "UNAUTHORIZED"  # type: ignore[index]
    other = _meta(f"MQv2-HMAC-SHA1 Credential=nobody, Signature={sig}")
    assert decide(other) == ("UNAUTHORIZED", "No acl config for nobody")
    assert decide(good, "127.0.0.1", ("T", Perm.SUB))[0] == "FORBIDDEN"  # type: ignore[index]
    refused = decide(good, "127.0.0.1", ("%RETRY%G", Perm.SUB))
    assert refused == ("FORBIDDEN", "No permission for group G: accessKey=client-v5 needs SUB")
    assert decide({}, "127.0.9.4") is None  # a global white address needs no signature
    assert "client-secret" not in repr(ACL)
