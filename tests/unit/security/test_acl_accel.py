"""ACL 1.0's signature in C (`accel.acl_signature`, `accel.acl_verify`) against acl.py's Python.

The C path is what `acl.signature` and `acl.decide` run when the extension is built; the
Python `_signature` (hashlib) stays the reference. Inputs the C code reads on its own paths:
more fields than its stack array, keys of every str width, lone surrogates, bodies around the
SHA-1 block size, non-bytes bodies, non-dict mappings, wrong types and huge fields.
"""

from __future__ import annotations

import hashlib
import random
import types
from collections.abc import Iterator, Mapping

import pytest

from ferrymq.security import acl
from ferrymq.security.acl import ACCESS_KEY, SIGNATURE, Credentials, parse_acl, sign
from ferrymq.wire.codes import RequestCode

accel = pytest.importorskip("ferrymq.wire.accel")
if not hasattr(accel, "acl_verify"):  # pragma: no cover - an extension older than the ACL code
    pytest.skip("the C accelerator has no ACL functions", allow_module_level=True)

_ALPHABET = "abZ_\x01\x02\u00e9\u20ac\U0001f600\ud800"


def _python(fields: Mapping[str, str], body: bytes, secret: str, version: int) -> str:
    return acl._signature(fields, body, secret, version).decode("ascii")


def _c(fields: Mapping[str, str], body: object, secret: str, version: int) -> str:
    text: str = accel.acl_signature(fields, body, acl._c_pads(secret), version <= 395)
    return text


def _text(r: random.Random, most: int) -> str:
    return "".join(r.choice(_ALPHABET) for _ in range(r.randint(0, most)))


def test_c_signature_equals_the_python_reference_on_random_requests() -> None:
    r = random.Random(23)
    for _ in range(400):
        fields = {_text(r, 4) or "k": _text(r, 90) for _ in range(r.randint(0, 45))}  # > 32: heap
        if r.random() < 0.5:
            fields[SIGNATURE] = _text(r, 5)
        if r.random() < 0.5:
            fields["_UNIQUE_KEY_QUERY"] = "true"
        body = r.randbytes(r.choice([0, 1, 55, 56, 63, 64, 65, 119, 120, 4096]))
        secret = "s\u00e9" * r.choice([4, 32, 33, 150])  # UTF-8 under, at and over 64 bytes
        version = r.choice([0, 395, 396, 479])
        assert _c(fields, body, secret, version) == _python(fields, body, secret, version)
        assert acl.signature(fields, body, secret, version) == _python(
            fields, body, secret, version
        )


class _Fields(Mapping[str, str]):
    """A mapping that is not a dict (the C code copies it into one)."""

    def __init__(self, items: dict[str, str]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def test_c_signature_takes_any_mapping_and_any_bytes_like_body() -> None:
    fields = {"b": "T", "a": "g", ACCESS_KEY: "ak"}
    expected = _python(fields, b"body", "12345678", 479)
    assert _c(_Fields(fields), b"body", "12345678", 479) == expected
    assert _c(types.MappingProxyType(fields), b"body", "12345678", 479) == expected
    assert _c(fields, bytearray(b"body"), "12345678", 479) == expected
    assert _c(fields, memoryview(b"xbodyx")[1:5], "12345678", 479) == expected


def test_c_verify_accepts_only_the_exact_signature() -> None:
    fields = {"b": "T", "a": "g"}
    pads = acl._c_pads("12345678")
    right = _python(fields, b"x", "12345678", 479)
    assert accel.acl_verify(fields, b"x", pads, False, right)
    for i in range(len(right)):
        other = "B" if right[i] == "A" else "A"
        assert not accel.acl_verify(fields, b"x", pads, False, right[:i] + other + right[i + 1 :])
    for sent in ["", right[:-1], right + "=", right[:-1] + "\u00e9", right[:-1] + "\ud800"]:
        assert not accel.acl_verify(fields, b"x", pads, False, sent)
    assert not accel.acl_verify(fields, b"y", acl._c_pads("12345678"), False, right)
    assert not accel.acl_verify(fields, b"x", acl._c_pads("87654321"), False, right)


def test_c_signature_refuses_wrong_types_with_python_errors() -> None:
    pads = acl._c_pads("12345678")
    with pytest.raises(TypeError):
        accel.acl_signature({"a": 1}, b"", pads, False)
    with pytest.raises(TypeError):
        accel.acl_signature({1: "a"}, b"", pads, False)
    with pytest.raises(TypeError):
        accel.acl_signature({"a": "b"}, "not bytes", pads, False)
    with pytest.raises(ValueError, match="pads"):
        accel.acl_signature({"a": "b"}, b"", pads[:-1], False)
    with pytest.raises(TypeError):
        accel.acl_signature({"a": "b"}, b"", pads)
    with pytest.raises(TypeError):
        accel.acl_verify({"a": "b"}, b"", pads, False, b"not str")
    with pytest.raises(TypeError):
        accel.acl_pads("not bytes")


def test_decide_in_c_refuses_missing_huge_and_non_ascii_signatures_with_a_remark() -> None:
    config = parse_acl("accounts:\n- {accessKey: RocketMQ, secretKey: 12345678, admin: true}\n")
    body = b"b" * 1000

    def decide(fields: dict[str, str]) -> str | None:
        return acl.decide(config, code=RequestCode.SEND_MESSAGE_V2, fields=fields, body=body,
                          version=479, host="127.0.0.1", needs_admin=False,
                          resources=list)  # fmt: skip

    fields = {"a": "g", "b": "T", "i": "v" * 3_000_000}  # a huge field, hashed as it is read
    sign(fields, body, Credentials("RocketMQ", "12345678"), 479)
    assert fields[SIGNATURE] == _python(fields, body, "12345678", 479)
    assert decide(fields) is None
    failed = "Check signature failed for accessKey=RocketMQ"
    assert decide({k: v for k, v in fields.items() if k != SIGNATURE}) == failed
    for sent in ["\u00e9" * 28, "\ud800", "x" * 1_000_000]:
        assert decide({**fields, SIGNATURE: sent}) == failed


@pytest.mark.parametrize("portable", [False, True])
def test_both_sha1_block_functions_equal_hashlib(portable: bool) -> None:
    """The signature's SHA-1 blocks go to OpenSSL's function when found, else to the C one."""
    assert accel.sha1_source() in ("openssl", "c")
    r = random.Random(1)
    for size in [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000, 65536]:
        data = r.randbytes(size)
        assert accel.sha1(data, portable) == hashlib.sha1(data).digest(), size


def test_without_the_c_functions_sign_and_decide_run_the_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An extension built before the ACL functions (or none) leaves `_accel` None."""
    config = parse_acl("accounts:\n- {accessKey: RocketMQ, secretKey: 12345678, admin: true}\n")
    fields = {"a": "g", "b": "T"}
    sign(fields, b"x", Credentials("RocketMQ", "12345678"), 479)
    monkeypatch.setattr(acl, "_accel", None)
    python = dict(fields)
    sign(python, b"x", Credentials("RocketMQ", "12345678"), 479)
    assert python == fields

    def decide(fields: dict[str, str]) -> str | None:
        return acl.decide(config, code=RequestCode.SEND_MESSAGE_V2, fields=fields, body=b"x",
                          version=479, host="127.0.0.1", needs_admin=False,
                          resources=list)  # fmt: skip

    assert decide(fields) is None
    assert decide({**fields, SIGNATURE: "\ud800"}) == (
        "Check signature failed for accessKey=RocketMQ"
    )
