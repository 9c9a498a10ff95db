"""Fuzz targets: every wire and on-disk decoder, fed arbitrary bytes.

The oracle (reference/reliability-harness.md §5): a decoder may reject input only with the typed
errors of `errors.py` (`ProtocolError` for bytes off the wire, `StoreError`/`CorruptRecordError`
for bytes off the disk); anything else escaping (IndexError, struct.error, UnicodeDecodeError,
ValueError, RecursionError, MemoryError...) is a finding. Where a length or CRC guards the
decoder, a `*_fixed` target rewrites it first so the fuzzer gets past the check; the plain target
keeps testing the rejection path. Round trips are checked where an encoder exists.

Each target is `f(data: bytes) -> None`; `tests/fuzz/run.py` drives them with atheris and
`test_fuzz.py` replays seeds and random inputs through them in-process.
"""

from __future__ import annotations

import contextlib
import functools
import struct
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from ferrymq.errors import ProtocolError, StoreError
from ferrymq.store.checkpoint import CHECKPOINT_BYTES, Checkpoint
from ferrymq.store.consumequeue import ENTRY_BYTES, ConsumeQueue
from ferrymq.store.epochs import decode_epoch_file, encode_epoch_file
from ferrymq.store.index import IndexFile
from ferrymq.wire import bodies, broker, controller, namesrv
from ferrymq.wire.frame import FrameDecoder, decode_frame, encode_frame
from ferrymq.wire.ha import MasterPacketDecoder, SlavePacketDecoder
from ferrymq.wire.headers import CommandHeader, from_ext_fields
from ferrymq.wire.properties import CRC32_RESERVED_LEN, decode_properties, encode_properties
from ferrymq.wire.records import (
    body_crc,
    decode_batch,
    decode_record,
    encode_batch,
    peek_record_size,
    record_crc_of,
    record_info,
    record_infos,
    record_infos_py,
)

__all__ = ["EXPECTED_ERRORS", "TARGETS", "Target"]

Target = Callable[[bytes], None]

EXPECTED_ERRORS: Final = (ProtocolError, StoreError)
"""The only exceptions a decoder may raise on bad input."""

_MAX_BODY: Final = 1 << 20


def _frame(data: bytes) -> None:
    """The remoting stream decoder, fed in two chunks split at the first byte's position."""
    cut = data[0] % (len(data) + 1) if data else 0
    decoder = FrameDecoder(max_frame_bytes=_MAX_BODY)
    try:
        commands = decoder.feed(data[1:cut]) + decoder.feed(data[cut:])
    except EXPECTED_ERRORS:
        return
    for command in commands:
        assert decode_frame(encode_frame(command)[4:]) == command


def _frame_fixed(data: bytes) -> None:
    """One frame with a correct total length and header length around fuzzed header bytes."""
    header_length = data[0] if data else 0
    payload = data[1:]
    header_length = min(header_length, len(payload))
    serialize_type = data[1] & 1 if len(data) > 1 else 0
    frame = struct.pack(">i", (serialize_type << 24) | header_length) + payload
    try:
        command = decode_frame(frame)
    except EXPECTED_ERRORS:
        return
    assert decode_frame(encode_frame(command)[4:]) == command


def _header_types() -> list[type[CommandHeader]]:
    found: list[type[CommandHeader]] = []
    for module in (broker, namesrv, controller):
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, CommandHeader)
                and value is not CommandHeader
                and value not in found
            ):
                found.append(value)
    return found


_HEADERS: Final = _header_types()


def _headers(data: bytes) -> None:
    """Typed request/response headers from fuzzed extFields (names of the type's own fields)."""
    if not data:
        return
    header_type = _HEADERS[data[0] % len(_HEADERS)]
    names = list(_field_names(header_type)) or ["x"]
    fields: dict[str, str] = {}
    for chunk in data[1:].split(b"\x00"):
        if chunk:
            fields[names[chunk[0] % len(names)]] = chunk[1:].decode(errors="replace")
    try:
        from_ext_fields(header_type, fields)
    except EXPECTED_ERRORS:
        return


@functools.cache
def _field_names(header_type: type[CommandHeader]) -> tuple[str, ...]:
    info = msgspec.inspect.type_info(header_type)
    assert isinstance(info, msgspec.inspect.StructType)
    return tuple(f.encode_name for f in info.fields)


def _record(data: bytes) -> None:
    """A stored record as it is (CRC checks on: the rejection path)."""
    try:
        record = decode_record(data, 0)
    except EXPECTED_ERRORS:
        return
    assert record.body_crc == body_crc(record.body)


def _record_fixed(data: bytes) -> None:
    """A stored record with its total size, body CRC and whole-record CRC made right."""
    buf = bytearray(data)
    if len(buf) < 12:
        return
    struct.pack_into(">i", buf, 0, len(buf))
    try:
        record = decode_record(buf, 0, check_crc=False)
    except EXPECTED_ERRORS:
        return
    struct.pack_into(">i", buf, 8, body_crc(record.body))
    if record_crc_of(buf) is not None:
        crc = zlib.crc32(buf[:-CRC32_RESERVED_LEN]) & 0x7FFFFFFF
        buf[-11:-1] = b"%010d" % crc
    try:
        checked = decode_record(buf, 0)
        info = record_info(buf, 0, require_record_crc=False)
    except EXPECTED_ERRORS:
        return
    assert info.size == len(buf) == peek_record_size(buf, 0)[0]
    assert checked.body == record.body


def _record_run(data: bytes) -> None:
    """Bytes a scan takes records from in one call: C and Python take the same ones."""
    first = int.from_bytes(data[:8].ljust(8, b"\0"), "big", signed=True)
    for check_crc in (False, True):
        python = record_infos_py(
            data, 8, len(data), check_crc=check_crc, require_record_crc=False, log_offset=first
        )
        accelerated = record_infos(
            data, 8, len(data), check_crc=check_crc, require_record_crc=False, log_offset=first
        )
        assert accelerated == python
        assert 8 <= python[1] <= max(8, len(data))


def _batch(data: bytes) -> None:
    """A SEND_BATCH_MESSAGE body; whatever decodes re-encodes to the same items."""
    try:
        items = decode_batch(data)
    except EXPECTED_ERRORS:
        return
    assert decode_batch(encode_batch(items)) == items


def _batch_fixed(data: bytes) -> None:
    """A batch whose first item's total size is made to fit."""
    buf = bytearray(data)
    if len(buf) >= 4:
        struct.pack_into(">i", buf, 0, len(buf))
    _batch(bytes(buf))


def _ha_slave(data: bytes) -> None:
    """What a master reads from a slave (handshakes and acks), in two chunks."""
    cut = data[0] % (len(data) + 1) if data else 0
    decoder = SlavePacketDecoder(max_body_bytes=_MAX_BODY)
    try:
        decoder.feed(data[1:cut])
        decoder.feed(data[cut:])
    except EXPECTED_ERRORS:
        return


def _ha_master(data: bytes) -> None:
    """What a slave reads from a master (handshake with epochs, transfers), in two chunks."""
    cut = data[0] % (len(data) + 1) if data else 0
    decoder = MasterPacketDecoder(max_body_bytes=_MAX_BODY)
    try:
        decoder.feed(data[1:cut])
        decoder.feed(data[cut:])
    except EXPECTED_ERRORS:
        return


def _properties(data: bytes) -> None:
    """Message properties; whatever decodes re-encodes to the same map."""
    try:
        properties = decode_properties(data)
    except EXPECTED_ERRORS:
        return
    try:
        encoded = encode_properties(properties)
    except (ValueError, ProtocolError):
        return  # a name or value the encoder refuses (separator characters)
    assert decode_properties(encoded) == properties


_BODY_TYPES: Final = sorted(
    (
        v
        for v in vars(bodies).values()
        if isinstance(v, type) and issubclass(v, bodies._Body) and v is not bodies._Body
    ),
    key=lambda t: t.__name__,
)


def _bodies(data: bytes) -> None:
    """Every JSON body type, and the (optionally zlib-compressed) register-broker body."""
    if not data:
        return
    body_type = _BODY_TYPES[data[0] % len(_BODY_TYPES)]
    with contextlib.suppress(*EXPECTED_ERRORS):
        bodies.decode_body(data[1:], body_type)
    try:
        bodies.decode_register_body(data[1:], compressed=bool(data[0] & 0x80))
    except EXPECTED_ERRORS:
        return


def _checkpoint(data: bytes) -> None:
    """The checkpoint file as it is (CRC checked: None when damaged)."""
    assert Checkpoint.decode(data) is None or len(data) == CHECKPOINT_BYTES


def _checkpoint_fixed(data: bytes) -> None:
    """A checkpoint with the right length and CRC: it decodes and re-encodes to itself."""
    buf = bytearray(data[:64].ljust(64, b"\x00"))
    buf += struct.pack(">I", zlib.crc32(buf)) + bytes(CHECKPOINT_BYTES - 68)
    checkpoint = Checkpoint.decode(bytes(buf))
    assert checkpoint is not None
    assert checkpoint.encode() == bytes(buf)


def _epochs(data: bytes) -> None:
    """The epoch file as it is."""
    try:
        history = decode_epoch_file(data, "fuzz")
    except EXPECTED_ERRORS:
        return
    assert decode_epoch_file(encode_epoch_file(history), "fuzz").entries == history.entries


def _epochs_fixed(data: bytes) -> None:
    """An epoch file whose count and CRC lines are made right for the fuzzed entry lines."""
    lines = data.split(b"\n")
    body = b"".join(line + b"\n" for line in lines if line)
    crc = zlib.crc32(body) & 0x7FFFFFFF
    _epochs(b"%d\n%d\n" % (len(body.splitlines()), crc) + body)


_DIR: Final = Path(tempfile.mkdtemp(prefix="ferrymq-fuzz-"))
_CQ_ENTRIES: Final = 64
_INDEX_SLOTS: Final = 16
_INDEX_ENTRIES: Final = 32
_INDEX_BYTES: Final = 40 + _INDEX_SLOTS * 4 + _INDEX_ENTRIES * 20


def _consume_queue(data: bytes) -> None:
    """A consume-queue segment file: load it, read every entry, cut it back."""
    directory = _DIR / "cq"
    directory.mkdir(exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    (directory / f"{0:020d}").write_bytes(
        data[: _CQ_ENTRIES * ENTRY_BYTES].ljust(_CQ_ENTRIES * ENTRY_BYTES, b"\x00")
    )
    queue = ConsumeQueue(directory, "fuzz", 0, _CQ_ENTRIES)
    try:
        queue.load()
        entries = queue.entries(queue.min_queue_offset, _CQ_ENTRIES)
        assert all(e.queue_offset >= queue.min_queue_offset for e in entries)
        _ = queue.max_log_offset
        cut = int.from_bytes(data[-8:] or b"\x00", "big", signed=False)
        queue.truncate_log(cut, lambda entry: entry.size > 0)
        assert queue.max_queue_offset <= _CQ_ENTRIES
    except EXPECTED_ERRORS:
        return
    finally:
        queue.chain.close()


def _index(data: bytes) -> None:
    """A key-index file: open it (header checks) and follow hash chains."""
    path = _DIR / "00000000000000000"
    path.write_bytes(data[:_INDEX_BYTES].ljust(_INDEX_BYTES, b"\x00"))
    try:
        index = IndexFile(path, _INDEX_SLOTS, _INDEX_ENTRIES, create=False)
    except EXPECTED_ERRORS:
        return
    try:
        for key_hash in data[:8]:
            index.query(key_hash, 8, 0, 2**62)
    finally:
        index.close()


TARGETS: Final[dict[str, Target]] = {
    "frame": _frame,
    "frame_fixed": _frame_fixed,
    "headers": _headers,
    "record": _record,
    "record_fixed": _record_fixed,
    "record_run": _record_run,
    "batch": _batch,
    "batch_fixed": _batch_fixed,
    "ha_slave": _ha_slave,
    "ha_master": _ha_master,
    "properties": _properties,
    "bodies": _bodies,
    "checkpoint": _checkpoint,
    "checkpoint_fixed": _checkpoint_fixed,
    "epochs": _epochs,
    "epochs_fixed": _epochs_fixed,
    "consume_queue": _consume_queue,
    "index": _index,
}
"""Every fuzz target by name."""
