"""ACL 1.0 core (issue 23): plain_acl.yml, signatures, the decision and the code table."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from pathlib import Path

import msgspec
import pytest

from ferrymq.broker.broker import Broker
from ferrymq.broker.config import BrokerConfig
from ferrymq.cmd.controller import ControllerParts
from ferrymq.controller.config import ControllerConfig
from ferrymq.errors import ProtocolError
from ferrymq.namesrv.server import NameServer, NamesrvConfig
from ferrymq.rpc.server import Router
from ferrymq.security import aclcodes
from ferrymq.security.acl import (
    ACCESS_KEY,
    SIGNATURE,
    AclConfig,
    AclConfigError,
    Credentials,
    Perm,
    address_matches,
    decide,
    parse_acl,
    sign,
    signature,
)
from ferrymq.security.aclcodes import KINDS, Kind, kind_of, resources
from ferrymq.wire.codes import RequestCode

SAMPLE = """
globalWhiteRemoteAddresses:
- 127.10.103.*
accounts:
- accessKey: RocketMQ
  secretKey: 12345678
  whiteRemoteAddress: 127.168.0.*
  admin: false
  defaultTopicPerm: DENY
  defaultGroupPerm: SUB
  topicPerms:
  - topicA=DENY
  - topicB=PUB|SUB
  - topicC=SUB
  groupPerms:
  - groupA=DENY
  - groupB=SUB
- accessKey: rocketmq2
  secretKey: 87654321
  admin: true
"""


def test_signature_is_rocketmqs_hmac_sha1_of_sorted_values_then_body() -> None:
    # RocketMQ's AclSignerTest: calSignature("RocketMQ", "12345678")
    assert signature({"k": "RocketMQ"}, b"", "12345678") == "IUc8rrO/0gDch8CjObLQsW2rsiA="
    assert signature({"b": "MQ", "a": "Rocket"}, b"", "12345678") == "IUc8rrO/0gDch8CjObLQsW2rsiA="
    assert signature({"a": "Rocket", SIGNATURE: "x"}, b"MQ", "12345678") == (
        "IUc8rrO/0gDch8CjObLQsW2rsiA="
    )


def test_rocketmqs_sample_file_parses_into_the_typed_model() -> None:
    acl = parse_acl(SAMPLE)
    assert acl.global_white_remote_addresses == ("127.10.103.*",)
    account = acl.accounts["RocketMQ"]
    assert account.secret_key == "12345678"
    assert account.topic_perms == {"topicA": Perm.DENY, "topicB": Perm.PUB | Perm.SUB,
                                   "topicC": Perm.SUB}  # fmt: skip
    assert account.perm_of("%RETRY%groupB") is Perm.SUB
    assert account.perm_of("%RETRY%other") is Perm.SUB  # defaultGroupPerm
    assert account.perm_of("other") is Perm.DENY  # defaultTopicPerm
    assert acl.accounts["rocketmq2"].admin
    assert "12345678" not in repr(acl)
    assert "secret" not in repr(Credentials("ak-1234567", "secret-123"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("accounts: [", "not YAML at line"),
        ("- a\n- b\n", "top level must be a mapping"),
        ("accounts: {a: 1}", "accounts must be a list"),
        ("accounts:\n- secretKey: 12345678", "accounts[0].accessKey is missing"),
        ("accounts:\n- {accessKey: abc, secretKey: topsecret1}", "longer than 6"),
        ("accounts:\n- {accessKey: abcdefg, secretKey: topsecret1, topicPerms: [t=ALL]}",
         "topicPerms[0]: 'ALL' is not DENY, PUB, SUB or PUB|SUB"),
        ("accounts:\n- {accessKey: abcdefg, secretKey: topsecret1, groupPerms: [g]}",
         "groupPerms[0]: 'g' is not 'name=PERM'"),
        ("accounts:\n- {accessKey: abcdefg, secretKey: topsecret1, admin: maybe}",
         "admin must be true or false"),
        ("accounts:\n- {accessKey: abcdefg, secretKey: topsecret1}\n"
         "- {accessKey: abcdefg, secretKey: topsecret2}", "appears twice"),
    ],
)  # fmt: skip
def test_a_malformed_file_is_a_clear_error_that_never_quotes_a_secret(
    text: str, message: str
) -> None:
    with pytest.raises(AclConfigError, match=r"plain_acl\.yml") as caught:
        parse_acl(text)
    assert message in str(caught.value)
    assert "topsecret" not in str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "host", "matches"),
    [
        ("*", "1.2.3.4", True),
        ("127.168.0.*", "127.168.0.9", True),
        ("127.168.0.*", "127.168.1.9", False),
        ("127.168.1.1-5", "127.168.1.5", True),
        ("127.168.1.1-5", "127.168.1.6", False),
        ("127.168.1.{1,3}", "127.168.1.3", True),
        ("127.168.1.{1,3}", "127.168.1.2", False),
        ("127.0.0.1,127.0.0.2", "127.0.0.2", True),
        ("127.0.0.1", "not-an-address", False),
        ("", "127.0.0.1", False),
    ],
)
def test_white_remote_addresses(pattern: str, host: str, matches: bool) -> None:
    assert address_matches(pattern, host) is matches


def _decide(
    acl: AclConfig,
    fields: dict[str, str],
    *,
    code: int = RequestCode.SEND_MESSAGE,
    body: bytes = b"",
    host: str = "127.0.0.1",
) -> str | None:
    return decide(
        acl,
        code=code,
        fields=fields,
        body=body,
        version=479,
        host=host,
        needs_admin=kind_of(code) in (Kind.ADMIN, Kind.INTERNAL),
        resources=lambda: resources(code, fields, body),
    )


def _signed(fields: dict[str, str], ak: str, sk: str, body: bytes = b"") -> dict[str, str]:
    signed = dict(fields)
    sign(signed, body, Credentials(ak, sk), 479)
    return signed


@pytest.mark.parametrize(
    ("case", "fields", "code", "host", "remark"),
    [
        ("no key", {"topic": "topicB"}, 10, "127.0.0.1", "No accessKey is configured"),
        ("unknown key", {"topic": "topicB", ACCESS_KEY: "nobody"}, 10, "127.0.0.1",
         "No acl config for nobody"),
        ("bad signature", {"topic": "topicB", ACCESS_KEY: "RocketMQ", SIGNATURE: "AAAA"}, 10,
         "127.0.0.1", "Check signature failed for accessKey=RocketMQ"),
        ("global white address", {"topic": "topicA"}, 17, "127.10.103.7", None),
        ("account white address, unsigned", {"topic": "topicB", ACCESS_KEY: "RocketMQ"}, 10,
         "127.168.0.3", None),
        ("send PUB", "RocketMQ topicB", 10, "127.0.0.1", None),
        ("send to a DENY topic", "RocketMQ topicA", 10, "127.0.0.1",
         "No permission for topic topicA: accessKey=RocketMQ needs PUB"),
        ("send to a SUB-only topic", "RocketMQ topicC", 10, "127.0.0.1",
         "No permission for topic topicC"),
        ("send to a default-DENY topic", "RocketMQ other", 10, "127.0.0.1",
         "No permission for topic other"),
        ("admin code, not admin", "RocketMQ topicB", 17, "127.0.0.1",
         "Need admin permission for request code=17, but accessKey=RocketMQ is not"),
        ("internal code, not admin", "RocketMQ topicB", 103, "127.0.0.1",
         "Need admin permission for request code=103"),
        ("admin code, admin", "rocketmq2 anything", 17, "127.0.0.1", None),
    ],
)  # fmt: skip
def test_decide(
    case: str, fields: dict[str, str] | str, code: int, host: str, remark: str | None
) -> None:
    acl = parse_acl(SAMPLE)
    if isinstance(fields, str):
        ak, topic = fields.split()
        fields = _signed({"topic": topic}, ak, acl.accounts[ak].secret_key)
    got = _decide(acl, fields, code=code, host=host)
    if remark is None:
        assert got is None, case
    else:
        assert got is not None, case
        assert got.startswith(remark), (case, got)


def test_pull_needs_sub_on_the_topic_and_the_group() -> None:
    acl = parse_acl(SAMPLE)
    ok = _signed({"topic": "topicC", "consumerGroup": "groupB"}, "RocketMQ", "12345678")
    assert _decide(acl, ok, code=RequestCode.PULL_MESSAGE) is None
    denied = _signed({"topic": "topicC", "consumerGroup": "groupA"}, "RocketMQ", "12345678")
    assert _decide(acl, denied, code=RequestCode.PULL_MESSAGE) == (
        "No permission for group groupA: accessKey=RocketMQ needs SUB (request code=11)"
    )


def test_tampering_with_a_signed_field_or_the_body_fails_the_signature() -> None:
    acl = parse_acl(SAMPLE)
    fields = _signed({"b": "topicB", "a": "g"}, "RocketMQ", "12345678", b"body")
    code = RequestCode.SEND_MESSAGE_V2
    assert _decide(acl, fields, code=code, body=b"body") is None
    assert _decide(acl, fields, code=code, body=b"other") is not None
    assert _decide(acl, {**fields, "b": "topicC"}, code=code, body=b"body") is not None
    huge = {**fields, ACCESS_KEY: "k" * 1_000_000}
    remark = _decide(acl, huge, code=code, body=b"body")
    assert remark is not None
    assert len(remark) < 200


def test_every_code_a_server_routes_is_classified(tmp_path: Path) -> None:
    broker = Broker(BrokerConfig(store_path_root_dir=tmp_path / "store"))
    namesrv = NameServer(NamesrvConfig())
    controller = Router("controller")
    parts = ControllerParts("n1", {"n1": "127.0.0.1:1"}, tmp_path / "c", ControllerConfig())
    parts.register(controller, heartbeat=True)
    routed = broker.router.codes | namesrv.router.codes | controller.codes
    assert routed, "no routed codes found"
    missing = sorted(code for code in routed if code not in KINDS)
    assert not missing, f"request codes routed but not classified in aclcodes.KINDS: {missing}"
    assert kind_of(RequestCode.SEND_MESSAGE) is Kind.PRODUCER
    assert kind_of(RequestCode.PULL_MESSAGE) is Kind.CONSUMER
    assert kind_of(RequestCode.REGISTER_BROKER) is Kind.INTERNAL
    assert kind_of(RequestCode.DELETE_TOPIC_IN_BROKER) is Kind.ADMIN
    assert kind_of(123456) is Kind.ADMIN  # unknown: fail closed


def test_no_request_code_is_in_two_kind_sets() -> None:
    sets = [aclcodes._PRODUCER, aclcodes._CONSUMER, aclcodes._CLIENT, aclcodes._INTERNAL,
            aclcodes._ADMIN]  # fmt: skip
    for code in RequestCode:
        owners = [s for s in sets if code in s]
        assert len(owners) <= 1, f"{code.name} is in {len(owners)} kind sets of aclcodes.py"


def test_batch_ack_needs_sub_on_the_topics_and_groups_of_its_body() -> None:
    """BATCH_ACK_MESSAGE names its topics and groups only in the body: they are checked there (it
    used to need a signature alone, so any account could ack any group's messages)."""
    acl = parse_acl(SAMPLE)

    def body(group: str, topic: str) -> bytes:
        ack = {"c": group, "t": topic, "r": "0", "so": 0, "q": 0, "rq": 0, "pt": 1, "it": 1}
        return msgspec.json.encode({"acks": [ack | {"b": [0]}]})

    code = RequestCode.BATCH_ACK_MESSAGE
    for group, topic, remark in [
        ("groupB", "topicC", None),
        ("groupA", "topicC", "No permission for group groupA"),
        ("groupB", "topicA", "No permission for topic topicA"),
    ]:
        data = body(group, topic)
        got = _decide(acl, _signed({}, "RocketMQ", "12345678", data), code=code, body=data)
        assert got is None if remark is None else (got or "").startswith(remark), (group, got)
    garbage = _signed({}, "RocketMQ", "12345678", b"{")
    with pytest.raises(ProtocolError, match="BatchAckMessageRequestBody"):  # the guard refuses
        _decide(acl, garbage, code=code, body=b"{")


def _reference_signature(fields: dict[str, str], body: bytes, secret: str, version: int) -> str:
    """RocketMQ's `calSignature(combineRequestContent(...))` written plainly, as first built."""
    skipped = {SIGNATURE, "_UNIQUE_KEY_QUERY"} if version <= 395 else {SIGNATURE}
    values = "".join(v for k, v in sorted(fields.items()) if k not in skipped)
    data = values.encode("utf-8", "surrogatepass") + body
    return base64.b64encode(hmac.new(secret.encode(), data, hashlib.sha1).digest()).decode()


def test_the_fast_signature_equals_the_reference_on_varied_requests() -> None:
    """Cached HMAC pads and key orders (issue 23's cost) sign exactly as RocketMQ does."""
    send = {"a": "g", "b": "T", "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "1", "h": "0"}
    bodies = [b"", b"x", "h\u00e9llo \u4e2d\u6587 \U0001f600".encode(), os.urandom(4096)]
    secrets = ["12345678", "s\u00e9cr\u00e8te-\u5bc6\u94a5", "k" * 64, "k" * 65, "k" * 300]
    requests: list[dict[str, str]] = [
        send,
        {**send, "i": "UNIQ_KEY\x01AC11\x02WAIT\x01true\x02", ACCESS_KEY: "ak"},
        {**send, "b": "t\u00f6pic-\u4e3b\u9898-\U0001f680", "a": "\ud800"},  # a lone surrogate
        {ACCESS_KEY: "ak", **dict(reversed(send.items()))},  # same keys, another order
        {"_UNIQUE_KEY_QUERY": "true", "topic": "T", SIGNATURE: "stale"},
        {},
    ]
    for version in (395, 479):
        for fields in requests:
            for body in bodies:
                for secret in secrets:
                    expected = _reference_signature(fields, body, secret, version)
                    assert signature(fields, body, secret, version) == expected
                    signed = dict(fields)
                    sign(signed, body, Credentials("ak", secret), version)
                    assert signed[SIGNATURE] == _reference_signature(signed, body, secret, version)
    # one key order, other values each time: the remembered order never carries values over
    for n in range(50):
        fields = {**send, "g": str(n), "e": str(n % 4)}
        assert signature(fields, b"", "12345678", 479) == _reference_signature(
            fields, b"", "12345678", 479
        )


def test_resources_and_admin_need_from_the_tables_match_the_kinds() -> None:
    fields = {"b": "T1", "topic": "T2", "consumerGroup": "G", "group": "G2"}
    for code in [*KINDS, 123456]:
        kind = kind_of(code)
        assert (code not in aclcodes.USER_CODES) == (kind in (Kind.ADMIN, Kind.INTERNAL)), code
        if code in (RequestCode.HEART_BEAT, RequestCode.BATCH_ACK_MESSAGE):
            continue
        topic = "T1" if code in (RequestCode.SEND_MESSAGE_V2, 320) else "T2"
        want = []
        if kind is Kind.PRODUCER:
            want.append((topic, Perm.PUB))
        elif kind is Kind.CONSUMER:
            want.append((topic, Perm.SUB))
        if kind in (Kind.CONSUMER, Kind.CLIENT):
            want.append(("%RETRY%G", Perm.SUB))
        assert resources(code, fields, b"") == want, code
    retry = resources(RequestCode.SEND_MESSAGE, {"topic": "%RETRY%G"}, b"")
    assert retry == [("%RETRY%G", Perm.SUB)]
