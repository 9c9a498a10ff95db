import json

from ferrymq.security.acl2 import AuthState, User, UserPut, UserType, apply
from ferrymq.security.acl2admin import decide_admin
from ferrymq.security.acl2guard import AuthStore, WithInitUser
from ferrymq.wire.codes import RequestCode as R
from ferrymq.wire.codes import ResponseCode


def _state() -> AuthState:
    return apply(AuthState(), UserPut(User("alice", "alice-pw")))


def test_changes_become_events_and_refusals_name_the_problem() -> None:
    state = _state()
    created = decide_admin(state, R.AUTH_CREATE_USER, {}, b'{"username":"bob","password":"pw"}')
    assert created.event == UserPut(User("bob", "pw"))
    again = decide_admin(state, R.AUTH_CREATE_USER, {}, b'{"username":"alice","password":"x"}')
    assert (again.code, again.event) == (ResponseCode.INVALID_PARAMETER, None)
    assert "is existed" in (again.remark or "")
    fields = {"username": "alice"}
    updated = decide_admin(state, R.AUTH_UPDATE_USER, fields, b'{"userType":"Super"}')
    assert updated.event == UserPut(User("alice", "alice-pw", UserType.SUPER))
    acl = {"subject": "User:alice", "policies": [{"entries": [
        {"resource": "Topic:t", "actions": ["Pub"], "decision": "Allow"}]}]}  # fmt: skip
    put = decide_admin(state, R.AUTH_CREATE_ACL, {}, json.dumps(acl).encode())
    assert put.code == ResponseCode.SUCCESS
    assert put.event is not None
    for code, fields, body in (
        (R.AUTH_DELETE_USER, {}, b""),
        (R.AUTH_DELETE_ACL, {"subject": "User:alice"}, b""),
        (R.AUTH_CREATE_USER, {}, b"not json"),
        (R.AUTH_DELETE_ACL, {"subject": "User:alice", "policyType": "Bogus"}, b""),
    ):
        outcome = decide_admin(state, code, fields, body)
        assert (outcome.code, outcome.event) == (ResponseCode.INVALID_PARAMETER, None), code
    unknown = decide_admin(state, R.SEND_MESSAGE, {}, b"")
    assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


def test_reads_answer_without_a_password() -> None:
    state = _state()
    listed = decide_admin(state, R.AUTH_LIST_USER, {}, b"")
    assert json.loads(listed.body) == [
        {"username": "alice", "userType": "Normal", "userStatus": "enable"}
    ]
    assert b"alice-pw" not in decide_admin(state, R.AUTH_GET_USER, {"username": "alice"}, b"").body
    missing = decide_admin(state, R.AUTH_GET_ACL, {"subject": "User:alice"}, b"")
    assert missing.code == ResponseCode.INVALID_PARAMETER


def test_an_init_user_counts_only_until_the_kept_users_have_one_of_its_name() -> None:
    kept = AuthState()
    init = User("root", "init-pw", UserType.SUPER)
    source = WithInitUser(lambda: kept, init)
    assert source.state.users == {"root": init}  # a fresh controller: nothing replicated yet
    kept = apply(kept, UserPut(User("root", "changed-pw", UserType.SUPER)))
    assert source.state.users["root"].password == "changed-pw"  # the kept one decides


def test_a_store_kept_by_controllers_ignores_what_the_metadata_log_replays() -> None:
    store = AuthStore()
    store.apply(UserPut(User("local", "pw")))  # classic mode: the metadata log's events
    assert store.take(_state(), 3)
    assert not store.take(AuthState(), 2)  # an older answer
    store.apply(UserPut(User("late", "pw")))
    store.replace_all(AuthState())
    assert set(store.state.users) == {"alice"}
