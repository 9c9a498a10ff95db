"""The gRPC endpoint's ACL 1.0 core: the MQv2-HMAC-SHA1 header and the decision (pure)."""

from __future__ import annotations

from ferrymq.security.acl import Perm, parse_acl
from ferrymq.security.acl2 import AuthState, User
from ferrymq.security.grpcacl import (
    DEFAULT_MAX_CLOCK_SKEW,
    decide_grpc,
    decide_grpc2,
    grpc_signature,
    parse_authorization,
    parse_date_time,
)

ACL = parse_acl(
    """
globalWhiteRemoteAddresses: [127.0.9.*]
accounts:
- {accessKey: client-v5, secretKey: client-secret, topicPerms: [T=PUB], groupPerms: [G=DENY]}
"""
)
DATE = "20261126T071500Z"
NOW = 1795677300.0
"""DATE's epoch seconds: the endpoint's clock in these decisions."""


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
        found = decide_grpc(ACL, metadata=meta, host=host, resources=lambda: need, now=NOW)
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


def test_a_signed_date_outside_the_window_is_refused_for_acl1_and_acl2() -> None:
    """Replays: the same rightly signed headers pass now, are UNAUTHORIZED 16 min later."""
    assert parse_date_time(DATE) == NOW
    for bad in ("", "2026-11-26T07:15:00Z", "20261326T071500Z", "20261126T071500", "\uff12" * 16):
        assert parse_date_time(bad) is None, bad
    state = AuthState({"client-v5": User("client-v5", "client-secret")}, {})

    def decide(
        date: str, now: float, *, acl2: bool, max_skew: float = 900.0
    ) -> tuple[str, str] | None:
        sig = grpc_signature("client-secret", "" if date == "-" else date)  # "-": no date
        meta = {"authorization": f"MQv2-HMAC-SHA1 Credential=client-v5, Signature={sig}"}
        if date != "-":
            meta["x-mq-date-time"] = date
        found = (
            decide_grpc2(
                state, metadata=meta, host="127.0.0.1", resources=list, now=now, max_skew=max_skew
            )
            if acl2
            else decide_grpc(
                ACL, metadata=meta, host="127.0.0.1", resources=list, now=now, max_skew=max_skew
            )
        )
        return None if found is None else (found.status, found.message)

    for acl2 in (False, True):
        assert decide(DATE, NOW, acl2=acl2) is None
        assert decide(DATE, NOW + 14 * 60, acl2=acl2) is None  # inside the 15 min window
        outside = (
            "UNAUTHORIZED",
            "x-mq-date-time 20261126T071500Z is outside the window of 900 s around the "
            "endpoint's clock (UTC): replayed or skewed request refused",
        )
        assert decide(DATE, NOW + 16 * 60, acl2=acl2) == outside  # replayed 16 min later
        assert decide(DATE, NOW - 16 * 60, acl2=acl2) == outside  # dated 16 min ahead
        # the default window: a client in any time zone stamping local time with a Z passes
        # (UTC+14 is 14 h ahead, UTC-12 12 h behind), a replay 15 h later does not
        default = DEFAULT_MAX_CLOCK_SKEW
        assert decide(DATE, NOW - 14 * 3600, acl2=acl2, max_skew=default) is None
        assert decide(DATE, NOW + 12 * 3600, acl2=acl2, max_skew=default) is None
        late = decide(DATE, NOW + 15 * 3600, acl2=acl2, max_skew=default)
        assert late is not None
        assert "window of 51300 s" in late[1]
        for malformed in ("-", "2026-11-26 07:15", "20261126T071560Z"):
            assert decide(malformed, NOW, acl2=acl2) == (
                "UNAUTHORIZED",
                "x-mq-date-time is missing or not yyyyMMddTHHmmssZ: request refused",
            ), malformed
    narrow = decide_grpc(
        ACL,
        metadata={
            "authorization": "MQv2-HMAC-SHA1 Credential=client-v5, Signature="
            + grpc_signature("client-secret", DATE),
            "x-mq-date-time": DATE,
        },
        host="127.0.0.1",
        resources=list,
        now=NOW + 61,
        max_skew=60,
    )
    assert narrow is not None
    assert "window of 60 s" in narrow.message
