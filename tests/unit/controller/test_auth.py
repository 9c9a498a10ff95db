"""ACL 2.0 users and ACLs as controller state (issue 23): decide, apply, snapshot, read back."""

import json

from ferrymq.controller.auth import AuthCommand, GetAuth
from ferrymq.controller.decide import Decision, View, decide
from ferrymq.controller.liveness import Liveness
from ferrymq.controller.state import ControllerState
from ferrymq.security.acl2 import User, decode_state
from ferrymq.wire.codes import RequestCode, ResponseCode
from ferrymq.wire.controller_log import decode_entry, encode_entry

from .helpers import CONFIG

ALICE = b'{"username":"alice","password":"alice-pw"}'
ACL = json.dumps(
    {
        "subject": "User:alice",
        "policies": [{"entries": [{"resource": "Topic:t", "actions": ["Pub"]}]}],
    }
).encode()


def _decide(state: ControllerState, code: int, body: bytes = b"", **fields: str) -> Decision:
    return decide(AuthCommand(code, fields, body), View(state, Liveness(), CONFIG, 0.0), 0.0)


def test_changes_replicate_as_versioned_events_and_survive_a_snapshot() -> None:
    state = ControllerState()
    created = _decide(state, RequestCode.AUTH_CREATE_USER, ALICE)
    assert created.code == ResponseCode.SUCCESS
    (event,) = decode_entry(encode_entry(created.events))  # through the log's bytes
    stale = _decide(state, RequestCode.AUTH_CREATE_USER, b'{"username":"bob","password":"pw"}')
    assert state.apply_events(1, [event]) == (True,)
    assert state.auth.users["alice"] == User("alice", "alice-pw")
    assert state.apply_events(2, list(stale.events)) == (False,)  # decided at version 0
    acl = _decide(state, RequestCode.AUTH_CREATE_ACL, ACL)
    assert state.apply_events(3, list(acl.events)) == (True,)
    assert state.auth_version == 2
    for code, body, fields in (  # already so: the CLI sends a change once per group (rule 4)
        (RequestCode.AUTH_CREATE_USER, ALICE, {}),
        (RequestCode.AUTH_CREATE_ACL, ACL, {}),
        (RequestCode.AUTH_DELETE_USER, b"", {"username": "bob"}),
        (RequestCode.AUTH_DELETE_ACL, b"", {"subject": "User:bob"}),
    ):
        same = _decide(state, code, body, **fields)
        assert (same.code, same.events) == (ResponseCode.SUCCESS, ()), code
    other = _decide(state, RequestCode.AUTH_CREATE_USER, b'{"username":"alice","password":"x"}')
    assert other.code == ResponseCode.INVALID_PARAMETER
    assert not other.events
    restored = ControllerState()
    restored.restore(state.snapshot())
    assert (restored.auth, restored.auth_version) == (state.auth, 2)
    assert restored.snapshot() == state.snapshot()
    answer = decide(GetAuth(), View(restored, Liveness(), CONFIG, 0.0), 0.0)
    assert decode_state(answer.body) == (state.auth, 2)
    listed = _decide(restored, RequestCode.AUTH_LIST_USER)
    assert b"alice-pw" not in listed.body
    assert not listed.events
