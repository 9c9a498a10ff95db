"""ACL 1.0 as RocketMQ does it: `plain_acl.yml`, request signatures and the access decision.

Owns the pure core of issue 23's authentication and authorization on remoting:

- `parse_acl` turns `plain_acl.yml` text (accounts with accessKey, secretKey, whiteRemoteAddress,
  admin, defaultTopicPerm, defaultGroupPerm, topicPerms, groupPerms; globalWhiteRemoteAddresses)
  into a typed `AclConfig`, or raises `AclConfigError` naming what is wrong.
- `signature` is RocketMQ's `AclUtils.calSignature(combineRequestContent(...))`:
  Base64(HmacSHA1(secretKey, the values of the extFields sorted by key, Signature left out, in
  UTF-8, then the body)). `sign` adds AccessKey (and SecurityToken) and Signature to a request's
  fields as `AclClientRPCHook.doBeforeRequest` does.
- `decide` is `PlainPermissionManager.validate`: global white addresses pass; then the account of
  the AccessKey, its own white address (passes without a signature, as RocketMQ does), the
  signature, the admin flag the request's kind needs (`aclcodes.py`), and DENY/PUB/SUB of every
  topic and group the request names (a group is its retry topic `%RETRY%group`).

Rules: no I/O, no clock; a secret key never appears in a repr, an error or a remark. Per request
only what varies is computed: each secret key's HMAC pads, each key order's value getter and, per
parsed file, the answer on each (account, resource key) are remembered (bounded); what that saves
is in docs/benchmarks.md ("ACL's cost per request").
When the C accelerator is built, `signature` and `decide`'s signature check run in it
(`accel.acl_signature`, `accel.acl_verify`: the fields sorted, hashed as read, the comparison
constant-time); the Python here stays the reference, and a unit test holds the two equal.
ACL 1.0 has no nonce: a captured request replayed unchanged is valid again (RocketMQ's behaviour;
TLS is what keeps it from being captured). Any change to a signed field fails the signature.
"""

from __future__ import annotations

import binascii
import enum
import functools
import hashlib
import hmac
import ipaddress
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final

import yaml

from ferrymq.errors import FerryError

__all__ = [
    "ACCESS_KEY",
    "RETRY_PREFIX",
    "SECURITY_TOKEN",
    "SIGNATURE",
    "Account",
    "AclConfig",
    "AclConfigError",
    "Credentials",
    "Perm",
    "address_matches",
    "check_perm",
    "content",
    "credentials_of",
    "decide",
    "parse_acl",
    "parse_perm",
    "refused_resource",
    "shown_key",
    "sign",
    "signature",
    "signature_matches",
]

ACCESS_KEY: Final = "AccessKey"
SIGNATURE: Final = "Signature"
SECURITY_TOKEN: Final = "SecurityToken"
RETRY_PREFIX: Final = "%RETRY%"
_UNIQUE_KEY_QUERY: Final = "_UNIQUE_KEY_QUERY"
_V4_9_3: Final = 395
"""`MQVersion.Version.V4_9_3.ordinal()`: up to it, `_UNIQUE_KEY_QUERY` is not signed."""
_SHOWN_KEY_CHARS: Final = 64
"""An access key is cut to this many characters in remarks (a huge field stays a short line)."""
ACL_TEXT_LIMIT: Final = 4 * 1024 * 1024
"""A `plain_acl.yml` larger than this is refused (it is read on every change)."""


class Perm(enum.IntFlag):
    """RocketMQ's `Permission` bits."""

    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_DENY: Final = int(Perm.DENY)
_ANY: Final = int(Perm.ANY)
_PUB_SUB: Final = int(Perm.PUB | Perm.SUB)

_PERMS: Final = {
    "DENY": Perm.DENY,
    "PUB": Perm.PUB,
    "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB,
    "SUB|PUB": Perm.PUB | Perm.SUB,
}


class AclConfigError(FerryError, ValueError):
    """`plain_acl.yml` is unusable; the message says where."""


def parse_perm(text: str, where: str) -> Perm:
    """`DENY`, `PUB`, `SUB`, `PUB|SUB` or `SUB|PUB` (RocketMQ `Permission.checkResourcePerms`).

    Raises:
        AclConfigError: any other text (RocketMQ would read it as DENY at runtime).
    """
    perm = _PERMS.get(text.strip())
    if perm is None:
        raise AclConfigError(f"{where}: {text!r} is not DENY, PUB, SUB or PUB|SUB")
    return perm


def check_perm(needed: Perm, owned: Perm) -> bool:
    """RocketMQ `Permission.checkPermission`: DENY wins; ANY is PUB or SUB."""
    have, want = int(owned), int(needed)  # IntFlag's operators cost microseconds each
    if have & _DENY:
        return False
    if want & _ANY:
        return bool(have & _PUB_SUB)
    return bool(want & have)


def _octet_matches(pattern: str, value: int) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("{") and pattern.endswith("}"):
        return any(_octet_matches(p.strip(), value) for p in pattern[1:-1].split(","))
    if "-" in pattern:
        low, _, high = pattern.partition("-")
        return low.isdigit() and high.isdigit() and int(low) <= value <= int(high)
    return pattern.isdigit() and int(pattern) == value


def address_matches(pattern: str, host: str) -> bool:
    """Whether `host` matches a RocketMQ white address pattern.

    Patterns: `*`, `1.2.3.4`, `1.2.3.*`, `1.2.3.1-9`, `1.2.3.{1,5}` (per IPv4 octet), or several
    patterns separated by commas.
    """
    pattern = pattern.strip()
    if not pattern:
        return False
    if pattern in ("*", "*.*.*.*"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if "{" not in pattern and "," in pattern:
        return any(address_matches(p, host) for p in pattern.split(","))
    if not isinstance(address, ipaddress.IPv4Address):
        return pattern == host
    parts = pattern.split(".")
    octets = [int(o) for o in host.split(".")]
    return len(parts) == 4 and all(_octet_matches(p, o) for p, o in zip(parts, octets, strict=True))


@dataclass(frozen=True, slots=True)
class Credentials:
    """An account's keys as a client holds them; the secret never shows in a repr."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need both an access key and a secret key")


def credentials_of(access_key: str | None, secret_key: str | None) -> Credentials | None:
    """Credentials from an SDK's `access_key`/`secret_key` arguments; None when neither is set.

    Raises:
        ValueError: only one of them is set.
    """
    if not access_key and not secret_key:
        return None
    if not access_key or not secret_key:
        raise ValueError("give both access_key and secret_key, or neither")
    return Credentials(access_key, secret_key)


@dataclass(frozen=True, slots=True)
class Account:
    """One `accounts` entry of `plain_acl.yml`."""

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: str = ""
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    topic_perms: Mapping[str, Perm] = field(default_factory=dict)
    group_perms: Mapping[str, Perm] = field(default_factory=dict)
    """Group name (not its retry topic) -> perm."""

    def perm_of(self, resource: str) -> Perm:
        """The account's perm on a topic, or on a group named by its retry topic."""
        if resource.startswith(RETRY_PREFIX):
            group = resource[len(RETRY_PREFIX) :]
            return self.group_perms.get(group, self.default_group_perm)
        return self.topic_perms.get(resource, self.default_topic_perm)


@dataclass(frozen=True, slots=True)
class AclConfig:
    """A parsed `plain_acl.yml`."""

    accounts: Mapping[str, Account]
    global_white_remote_addresses: tuple[str, ...] = ()
    verdicts: dict[tuple[str, Hashable], str | None] = field(
        default_factory=dict, compare=False, repr=False
    )
    """(access key, `decide`'s resource key) -> `refused_resource`'s answer, remembered for this
    file's accounts only (a reload parses a new `AclConfig`), at most `_VERDICTS_LIMIT`."""


def _text(value: Any, where: str, *, required: bool = False) -> str:
    if value is None:
        if required:
            raise AclConfigError(f"{where} is missing")
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise AclConfigError(f"{where} must be a string, not {type(value).__name__}")
    return str(value)


def _resource_perms(value: Any, where: str) -> dict[str, Perm]:
    if value is None:
        return {}
    if not isinstance(value, list):
        raise AclConfigError(f"{where} must be a list of 'name=PERM'")
    perms: dict[str, Perm] = {}
    for number, item in enumerate(value):
        entry = _text(item, f"{where}[{number}]")
        name, sep, perm = entry.partition("=")
        if not sep or not name.strip() or "=" in perm:
            raise AclConfigError(f"{where}[{number}]: {entry!r} is not 'name=PERM' (topicA=SUB)")
        perms[name.strip()] = parse_perm(perm, f"{where}[{number}]")
    return perms


def _account(entry: Any, where: str) -> Account:
    if not isinstance(entry, dict):
        raise AclConfigError(f"{where} must be a mapping")
    access_key = _text(entry.get("accessKey"), f"{where}.accessKey", required=True)
    secret_key = _text(entry.get("secretKey"), f"{where}.secretKey", required=True)
    # RocketMQ `checkPlainAccessConfig`: both longer than 6 characters
    if len(access_key) <= 6 or len(secret_key) <= 6:
        raise AclConfigError(
            f"{where} ({access_key[:_SHOWN_KEY_CHARS]}): accessKey and secretKey must be "
            "longer than 6 characters"
        )
    admin = entry.get("admin", False)
    if isinstance(admin, str) and admin.lower() in ("true", "false"):
        admin = admin.lower() == "true"
    if not isinstance(admin, bool):
        raise AclConfigError(f"{where}.admin must be true or false")

    def default(key: str) -> Perm:
        text = _text(entry.get(key), f"{where}.{key}")
        return parse_perm(text, f"{where}.{key}") if text else Perm.DENY

    return Account(
        access_key=access_key,
        secret_key=secret_key,
        white_remote_address=_text(entry.get("whiteRemoteAddress"), f"{where}.whiteRemoteAddress"),
        admin=admin,
        default_topic_perm=default("defaultTopicPerm"),
        default_group_perm=default("defaultGroupPerm"),
        topic_perms=_resource_perms(entry.get("topicPerms"), f"{where}.topicPerms"),
        group_perms=_resource_perms(entry.get("groupPerms"), f"{where}.groupPerms"),
    )


def parse_acl(text: str, source: str = "plain_acl.yml") -> AclConfig:
    """Parse `plain_acl.yml`.

    Raises:
        AclConfigError: not YAML, or a field of the wrong shape (the message names it and
            `source`; it never quotes a secret key).
    """
    if len(text) > ACL_TEXT_LIMIT:
        raise AclConfigError(f"{source}: larger than {ACL_TEXT_LIMIT} characters")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise AclConfigError(f"{source}: not YAML{at}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AclConfigError(f"{source}: the top level must be a mapping")
    white = data.get("globalWhiteRemoteAddresses") or []
    if not isinstance(white, list):
        raise AclConfigError(f"{source}: globalWhiteRemoteAddresses must be a list")
    addresses = tuple(
        _text(a, f"{source}: globalWhiteRemoteAddresses[{n}]") for n, a in enumerate(white)
    )
    entries = data.get("accounts") or []
    if not isinstance(entries, list):
        raise AclConfigError(f"{source}: accounts must be a list")
    accounts: dict[str, Account] = {}
    for number, entry in enumerate(entries):
        account = _account(entry, f"{source}: accounts[{number}]")
        if account.access_key in accounts:
            raise AclConfigError(
                f"{source}: accounts[{number}]: accessKey "
                f"{account.access_key[:_SHOWN_KEY_CHARS]} appears twice"
            )
        accounts[account.access_key] = account
    return AclConfig(accounts, addresses)


_HMAC_BLOCK: Final = 64
"""SHA-1's block size: HMAC's key is padded (or first hashed) to it (RFC 2104)."""
_IPAD: Final = bytes(x ^ 0x36 for x in range(256))
_OPAD: Final = bytes(x ^ 0x5C for x in range(256))
_VERDICTS_LIMIT: Final = 65536
"""`AclConfig.verdicts` entries; past it they are forgotten (each is a signed request's)."""
_GETTERS_LIMIT: Final = 1024
"""Key orders remembered (`_values_of`) per version kind; past it they are forgotten, so odd
requests cannot grow the memory."""
_getters: Final[tuple[dict[tuple[str, ...], Any], dict[tuple[str, ...], Any]]] = ({}, {})
"""Key order -> its values' getter: [0] for requests after V4_9_3, [1] up to it."""

_accel: ModuleType | None = None
try:
    from ferrymq.wire import accel as _built
except ImportError:  # pragma: no cover - the C accelerator is optional
    pass
else:
    if hasattr(_built, "acl_verify"):  # a build older than the ACL functions lacks them
        _accel = _built


@functools.lru_cache(maxsize=256)
def _c_pads(secret_key: str) -> bytes:
    """`accel.acl_pads` of `secret_key`: HmacSHA1's two key states, once per key."""
    assert _accel is not None
    pads: bytes = _accel.acl_pads(secret_key.encode("utf-8"))
    return pads


@functools.lru_cache(maxsize=256)
def _hmac_pads(secret_key: str) -> tuple[Any, Any]:
    """HmacSHA1's inner and outer hash states for `secret_key`, once per key (RFC 2104).

    What `hmac.digest` redoes on every call; copying the two states is half its cost.
    """
    key = secret_key.encode("utf-8")
    if len(key) > _HMAC_BLOCK:
        key = hashlib.sha1(key).digest()
    key = key.ljust(_HMAC_BLOCK, b"\0")
    return hashlib.sha1(key.translate(_IPAD)), hashlib.sha1(key.translate(_OPAD))


def _values_of(keys: tuple[str, ...], old: bool) -> Callable[[Mapping[str, str]], Iterable[str]]:
    """What takes the signed values, in the order of their sorted keys, out of fields with `keys`.

    One `itemgetter` per key order (the same for every request of one kind), remembered in
    `_getters`: a request then costs a tuple, a dict hit and one C call, not a sort and a loop.
    """
    getters = _getters[old]
    getter = getters.get(keys)
    if getter is None:
        skipped = (SIGNATURE, _UNIQUE_KEY_QUERY) if old else (SIGNATURE,)
        order = [k for k in sorted(keys) if k not in skipped]
        if len(order) >= 2:
            getter = operator.itemgetter(*order)
        else:  # itemgetter of one key gives the value itself, of none is not allowed
            getter = functools.partial(_values_by_loop, order)
        if len(getters) >= _GETTERS_LIMIT:
            getters.clear()
        getters[keys] = getter
    return getter


def _values_by_loop(order: list[str], fields: Mapping[str, str]) -> list[str]:
    return [fields[k] for k in order]


def _signed_text(fields: Mapping[str, str], version: int) -> bytes:
    keys, old = tuple(fields), version <= _V4_9_3
    values = _getters[old].get(keys) or _values_of(keys, old)  # the hit inline: a call less
    return "".join(values(fields)).encode("utf-8", "surrogatepass")


def content(fields: Mapping[str, str], body: bytes, version: int = 0) -> bytes:
    """What RocketMQ signs: the sorted fields' values but Signature, in UTF-8, then the body."""
    return _signed_text(fields, version) + body


def _signature(fields: Mapping[str, str], body: bytes, secret_key: str, version: int) -> bytes:
    """`signature` in ASCII bytes; the content is hashed in two parts, the body not copied."""
    inner_pad, outer_pad = _hmac_pads(secret_key)
    inner = inner_pad.copy()
    inner.update(_signed_text(fields, version))
    inner.update(body)
    outer = outer_pad.copy()
    outer.update(inner.digest())
    return binascii.b2a_base64(outer.digest(), newline=False)


def signature(fields: Mapping[str, str], body: bytes, secret_key: str, version: int = 0) -> str:
    """Base64(HmacSHA1(secret_key, content(fields, body))), in C when built."""
    if _accel is not None:
        text: str = _accel.acl_signature(fields, body, _c_pads(secret_key), version <= _V4_9_3)
        return text
    return _signature(fields, body, secret_key, version).decode("ascii")


def signature_matches(
    fields: Mapping[str, str], body: bytes, secret_key: str, version: int, sent: str
) -> bool:
    """Whether `sent` is the request's signature (compared in constant time), in C when built."""
    if _accel is not None:
        ok: bool = _accel.acl_verify(fields, body, _c_pads(secret_key), version <= _V4_9_3, sent)
        return ok
    expected = _signature(fields, body, secret_key, version)
    return hmac.compare_digest(expected, sent.encode("utf-8", "surrogatepass"))


def sign(fields: dict[str, str], body: bytes, credentials: Credentials, version: int) -> None:
    """Add AccessKey, SecurityToken (if any) and Signature to a request's fields, in place."""
    fields.pop(SIGNATURE, None)
    fields[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        fields[SECURITY_TOKEN] = credentials.security_token
    fields[SIGNATURE] = signature(fields, body, credentials.secret_key, version)


def shown_key(access_key: str) -> str:
    """An access key as logs and refusals show it: a long one cut short (never a secret)."""
    if len(access_key) <= _SHOWN_KEY_CHARS:
        return access_key
    return f"{access_key[:_SHOWN_KEY_CHARS]}... ({len(access_key)} characters)"


def decide(
    acl: AclConfig,
    *,
    code: int,
    fields: Mapping[str, str],
    body: bytes,
    version: int,
    host: str,
    needs_admin: bool,
    resources: Callable[[], Iterable[tuple[str, Perm]]],
    resource_key: Hashable | None = None,
) -> str | None:
    """None if the request may run, else the remark of its NO_PERMISSION answer.

    `needs_admin` and `resources` come from the request's kind (`aclcodes.py`); `resources` is
    called only once the signature is right (whatever it raises goes to the caller).
    `resource_key` (`aclcodes.resource_key`), when given, stands for everything `resources`
    depends on: the answer on resources is then remembered per account and key in `acl.verdicts`.
    """
    white = acl.global_white_remote_addresses
    if white and any(address_matches(p, host) for p in white):
        return None
    access_key = fields.get(ACCESS_KEY)
    if not access_key:
        return "No accessKey is configured"
    account = acl.accounts.get(access_key)
    if account is None:
        return f"No acl config for {shown_key(access_key)}"
    if account.white_remote_address and address_matches(account.white_remote_address, host):
        return None
    sent = fields.get(SIGNATURE, "")
    if not signature_matches(fields, body, account.secret_key, version, sent):
        return f"Check signature failed for accessKey={shown_key(access_key)}"
    if needs_admin and not account.admin:
        return (
            f"Need admin permission for request code={code}, "
            f"but accessKey={shown_key(access_key)} is not"
        )
    if resource_key is None:
        refused = refused_resource(access_key, account, resources)
    else:
        verdicts, key = acl.verdicts, (access_key, resource_key)
        try:
            refused = verdicts[key]
        except KeyError:
            refused = refused_resource(access_key, account, resources)
            if len(verdicts) >= _VERDICTS_LIMIT:
                verdicts.clear()
            verdicts[key] = refused
    return None if refused is None else f"{refused} (request code={code})"


def refused_resource(
    access_key: str, account: Account, resources: Callable[[], Iterable[tuple[str, Perm]]]
) -> str | None:
    """Why `account` may not touch one of `resources` (the first refused), or None.

    An admin account with no per-resource perms may touch everything (RocketMQ's rule).
    """
    if account.admin and not account.topic_perms and not account.group_perms:
        return None
    for resource, needed in resources():
        if not check_perm(needed, account.perm_of(resource)):
            what = (
                f"group {resource[len(RETRY_PREFIX) :]}"
                if resource.startswith(RETRY_PREFIX)
                else f"topic {resource}"
            )
            return f"No permission for {what}: accessKey={shown_key(access_key)} needs " + (
                "PUB or SUB"
                if needed & Perm.ANY
                else "|".join(p.name or "" for p in Perm if p & needed)
            )
    return None
