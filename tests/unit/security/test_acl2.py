"""ACL 2.0's pure core: resources, authentication, authorization order, admin events."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.security.acl import Credentials, sign
from ferrymq.security.acl2 import (
    Acl2Error,
    AclDeleted,
    AclPut,
    Action,
    AuthState,
    Event,
    PolicyEntry,
    PolicyType,
    Resource,
    ResourcePattern,
    ResourceType,
    User,
    UserDeleted,
    UserPut,
    UserStatus,
    UserType,
    apply,
    authenticate,
    authorize,
    create_acl,
    create_user,
    delete_acl,
    delete_user,
    event_from_json,
    event_to_json,
    update_user,
    user_info,
)
from ferrymq.security.aclguard import peer_host

ALICE = User("alice", "alice-pw")
PUB = frozenset({Action.PUB})
SUB = frozenset({Action.SUB})


def _state(*entries: PolicyEntry, default: tuple[PolicyEntry, ...] = ()) -> AuthState:
    state = apply(AuthState(), create_user(AuthState(), ALICE))
    if entries:
        state = apply(state, create_acl(state, "User:alice", entries))
    if default:
        state = apply(state, create_acl(state, "User:alice", default, PolicyType.DEFAULT))
    return state


def _topic(name: str) -> Resource:
    return Resource(ResourceType.TOPIC, name)


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("*", Resource(ResourceType.ANY, "", ResourcePattern.ANY)),
        ("Topic:*", Resource(ResourceType.TOPIC, "", ResourcePattern.ANY)),
        ("group:orders-*", Resource(ResourceType.GROUP, "orders-", ResourcePattern.PREFIXED)),
        ("Cluster:c1", Resource(ResourceType.CLUSTER, "c1")),
    ],
)
def test_resource_keys_parse_and_print_back(key: str, parsed: Resource) -> None:
    assert Resource.parse(key) == parsed
    assert Resource.parse(parsed.key) == parsed


@pytest.mark.parametrize(
    "key", ["Topic", "Queue:x", "Any:x", "Topic:", "Topic:a b", "T:" + "x" * 2000]
)
def test_bad_resource_keys_are_typed_errors(key: str) -> None:
    with pytest.raises(Acl2Error):
        Resource.parse(key)


def test_authentication_is_the_hmac_with_the_password_and_a_disabled_user_is_refused() -> None:
    state = _state()
    fields = {"topic": "t"}
    sign(fields, b"body", Credentials("alice", "alice-pw"), 0)
    assert authenticate(state, fields, b"body", 0) == (ALICE, None)
    assert authenticate(state, fields, b"other", 0)[1] == "check signature failed for User:alice"
    assert authenticate(state, {}, b"", 0)[1] == "No accessKey is configured"
    disabled = apply(state, update_user(state, "alice", status=UserStatus.DISABLE))
    assert authenticate(disabled, fields, b"body", 0)[1] == "User:alice is disabled"
    gone = apply(state, delete_user(state, "alice"))
    assert authenticate(gone, fields, b"body", 0)[1] == "User:alice is not found"
    assert "User:alice" not in gone.acls


def test_the_most_specific_entry_decides_and_deny_wins_at_equal_precision() -> None:
    state = _state(
        PolicyEntry.of("Topic:*", ["Pub", "Sub"]),
        PolicyEntry.of("Topic:secret-*", ["All"], "Deny"),
        PolicyEntry.of("Topic:secret-open", ["Pub"]),
        PolicyEntry.of("Group:g1", ["Sub"], source_ips=["127.0.0.0/24"]),
    )
    assert authorize(state, ALICE, _topic("orders"), PUB, "127.0.0.1") is None
    assert "deny" in (authorize(state, ALICE, _topic("secret-x"), SUB, "127.0.0.1") or "")
    assert authorize(state, ALICE, _topic("secret-open"), PUB, "127.0.0.1") is None
    assert authorize(state, ALICE, _topic("secret-open"), SUB, "127.0.0.1") is not None
    group = Resource(ResourceType.GROUP, "g1")
    assert authorize(state, ALICE, group, SUB, "127.0.0.1") is None
    assert "no matched" in (authorize(state, ALICE, group, SUB, "127.0.1.1") or "")
    assert authorize(state, User("root", "pw", UserType.SUPER), group, SUB, "127.0.1.1") is None


def test_ipv4_clients_of_a_dual_stack_listener_meet_ipv4_blocks_in_allow_and_deny() -> None:
    """A `::` listener names an IPv4 client `::ffff:127.0.0.1`; its host is 127.0.0.1."""
    assert peer_host("[::ffff:127.0.0.1]:4711") == peer_host("127.0.0.1:4711") == "127.0.0.1"
    assert peer_host("[::1]:4711") == "::1"
    state = _state(
        PolicyEntry.of("Topic:*", ["Pub"]),
        PolicyEntry.of("Topic:inner", ["Pub"], "Deny", source_ips=["127.0.0.0/24"]),
        PolicyEntry.of("Group:g1", ["Sub"], source_ips=["127.0.0.0/24"]),
    )
    host = peer_host("[::ffff:127.0.0.1]:4711")
    assert "deny" in (authorize(state, ALICE, _topic("inner"), PUB, host) or "")
    assert authorize(state, ALICE, Resource(ResourceType.GROUP, "g1"), SUB, host) is None


def test_default_policy_applies_only_when_no_custom_entry_matches() -> None:
    state = _state(
        PolicyEntry.of("Topic:a", ["Pub"]), default=(PolicyEntry.of("*", ["All"], "Deny"),)
    )
    assert authorize(state, ALICE, _topic("a"), PUB, "127.0.0.1") is None
    assert "deny" in (authorize(state, ALICE, _topic("b"), PUB, "127.0.0.1") or "")


_ENTRIES = st.lists(
    st.builds(
        PolicyEntry.of,
        st.sampled_from(["*", "Topic:*", "Topic:a*", "Topic:ab*", "Topic:abc", "Group:abc"]),
        st.lists(st.sampled_from(["Pub", "Sub", "All"]), min_size=1, max_size=2),
        st.sampled_from(["Allow", "Deny"]),
    ),
    min_size=1,
    max_size=6,
)


@given(_ENTRIES)
def test_the_decision_does_not_depend_on_the_order_of_entries(entries: list[PolicyEntry]) -> None:
    kept = list({e.resource: e for e in entries}.values())  # one entry per resource
    topic = _topic("abc")
    allowed = [
        authorize(_state(*e), ALICE, topic, PUB, "127.0.0.1") is None for e in (kept, kept[::-1])
    ]
    assert allowed[0] == allowed[1]
    literal = [e for e in kept if e.resource == topic and e.matches(topic, PUB, "")]
    if literal:  # a literal entry that matches decides alone
        assert allowed[0] == (literal[0].decision.value == "Allow")


def test_admin_commands_refuse_what_the_state_does_not_allow_and_acls_merge() -> None:
    state = _state(PolicyEntry.of("Topic:a", ["Pub"]))
    with pytest.raises(Acl2Error, match="is existed"):
        create_user(state, ALICE)
    with pytest.raises(Acl2Error, match="not exist"):
        update_user(state, "bob", password="x")
    with pytest.raises(Acl2Error, match="subject of User:bob is not exist"):
        create_acl(state, "User:bob", [PolicyEntry.of("Topic:a", ["Pub"])])
    merged = apply(
        state,
        create_acl(
            state,
            "User:alice",
            [PolicyEntry.of("Topic:a", ["Sub"]), PolicyEntry.of("Topic:b", ["Pub"])],
        ),
    )
    entries = merged.acls["User:alice"].policies[PolicyType.CUSTOM]
    assert [(e.resource.key, sorted(e.actions)) for e in entries] == [
        ("Topic:a", ["Sub"]),
        ("Topic:b", ["Pub"]),
    ]
    one_left = apply(merged, delete_acl(merged, "User:alice", [Resource.parse("Topic:a")]))
    assert [e.resource.key for e in one_left.acls["User:alice"].policies[PolicyType.CUSTOM]] == [
        "Topic:b"
    ]
    assert delete_acl(one_left, "User:alice", [Resource.parse("Topic:b")]) == AclDeleted(
        "User:alice"
    )
    assert "alice-pw" not in repr(merged)


def test_events_round_trip_through_json_and_bad_json_is_a_typed_error() -> None:
    state = _state(
        PolicyEntry.of("Topic:a*", ["Pub", "Sub"], "Deny", ["127.0.0.0/24"]),
        default=(PolicyEntry.of("*", ["All"]),),
    )
    events: list[Event] = [
        UserPut(User("bob", "pw", UserType.SUPER, UserStatus.DISABLE)),
        UserDeleted("bob"),
        AclPut(state.acls["User:alice"]),
        AclDeleted("User:alice"),
    ]
    for event in events:
        assert event_from_json(json.loads(json.dumps(event_to_json(event)))) == event
    assert "password" not in user_info(ALICE)
    for bad in [[], {"userPut": {"username": "x"}}, {"aclPut": {"subject": "User:a"}}, {"x": 1}]:
        with pytest.raises(Acl2Error):
            event_from_json(bad)
