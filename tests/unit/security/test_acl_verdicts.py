"""ACL 1.0's remembered answers on resources (`AclConfig.verdicts`, `aclcodes.resource_key`).

A remembered answer must be the one `refused_resource` would give: for every request code and
the fields its resources come from, and after `plain_acl.yml` changes (a new `AclConfig`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from pathlib import Path

import pytest

from ferrymq.security import acl
from ferrymq.security.acl import ACCESS_KEY, Credentials, decide, parse_acl, sign
from ferrymq.security.aclcodes import KINDS, resource_key, resources
from ferrymq.security.aclguard import AclFile, AclGuard
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.frame import RemotingCommand

ACL = """
accounts:
- accessKey: RocketMQ
  secretKey: 12345678
  defaultTopicPerm: DENY
  defaultGroupPerm: SUB
  topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB, topicP=PUB]
  groupPerms: [groupA=DENY, groupB=SUB]
- {accessKey: rocketmq2, secretKey: 87654321, admin: true}
"""
_SECRETS = {"RocketMQ": "12345678", "rocketmq2": "87654321"}


def _field_sets() -> list[dict[str, str]]:
    topics = [None, "", "topicA", "topicB", "topicC", "topicP", "%RETRY%groupA", "other"]
    groups = [None, "", "groupA", "groupB", "%RETRY%groupB"]
    sets = []
    for topic, group, second in itertools.product(topics, groups, [None, "groupA"]):
        fields = {}
        if topic is not None:
            fields["b"] = fields["topic"] = topic
        if group is not None:
            fields["consumerGroup"] = group
        if second is not None:
            fields["group"] = second
        sets.append(fields)
    return sets


def test_remembered_answers_equal_fresh_ones_for_every_code_and_field_set() -> None:
    config = parse_acl(ACL)
    codes = [c for c in KINDS if resource_key(c, {}) is not None]
    assert RequestCode.SEND_MESSAGE_V2 in codes
    assert RequestCode.PULL_MESSAGE in codes
    assert resource_key(RequestCode.HEART_BEAT, {}) is None  # its resources are in the body
    for access_key, code, base in itertools.product(_SECRETS, codes, _field_sets()):
        fields = dict(base)
        sign(fields, b"", Credentials(access_key, _SECRETS[access_key]), 479)
        answer = functools.partial(
            decide, code=code, fields=fields, body=b"", version=479, host="127.0.0.1",
            needs_admin=False, resources=functools.partial(resources, code, fields, b""),
        )  # fmt: skip
        fresh = answer(config)
        key = resource_key(code, fields)
        assert answer(config, resource_key=key) == fresh  # computed, then remembered
        assert answer(config, resource_key=key) == fresh, (access_key, code, base)
    assert config.verdicts, "nothing was remembered"


def test_a_reloaded_file_is_decided_afresh(tmp_path: Path) -> None:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    acl_file = AclFile(path)

    async def handler(conn: object, request: RemotingCommand) -> str:
        return "handled"

    class Conn:
        peer = "127.0.0.1:4000"

    guard: AclGuard[Conn, str] = AclGuard(handler, acl_file)
    fields = {"a": "g", "b": "topicB"}
    sign(fields, b"x", Credentials("RocketMQ", "12345678"), 479)
    request = RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=fields, body=b"x")
    for _ in range(2):
        assert guard.check(Conn(), request) is None
    path.write_text(ACL.replace("topicB=PUB|SUB", "topicB=DENY"))
    assert acl_file.reload_if_changed()
    for _ in range(2):
        remark = guard.check(Conn(), request) or ""
        assert remark.startswith("No permission for topic topicB"), remark

    async def answer() -> object:
        return await guard(Conn(), request)

    refused = asyncio.run(answer())
    assert isinstance(refused, RemotingCommand)
    assert refused.code == ResponseCode.NO_PERMISSION


def test_remembered_answers_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acl, "_VERDICTS_LIMIT", 4)
    config = parse_acl(ACL)
    for n in range(10):
        fields = {"b": f"topic{n}", ACCESS_KEY: "rocketmq2"}
        sign(fields, b"", Credentials("rocketmq2", "87654321"), 479)
        code = RequestCode.SEND_MESSAGE_V2
        assert decide(config, code=code, fields=fields, body=b"", version=479, host="127.0.0.1",
                      needs_admin=False, resources=functools.partial(resources, code, fields, b""),
                      resource_key=resource_key(code, fields)) is None  # fmt: skip
        assert 1 <= len(config.verdicts) <= 4
