"""Seed inputs for every fuzz target: real encodings of each format, made by the encoders.

A fuzzer started from valid frames, records and files mutates its way into the decoders' deep
branches at once instead of guessing magic numbers first.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

from ferrymq.store.checkpoint import Checkpoint
from ferrymq.store.consumequeue import pack_entries
from ferrymq.store.epochs import EpochHistory, encode_epoch_file
from ferrymq.wire.bodies import KVTable, TopicConfig, TopicConfigSerializeWrapper, encode_body
from ferrymq.wire.codes import SerializeType
from ferrymq.wire.frame import RemotingCommand, encode_frame
from ferrymq.wire.ha import (
    EpochEntry,
    MasterHandshake,
    SlaveHandshake,
    encode_master_handshake,
    encode_slave_ack,
    encode_slave_handshake,
    encode_transfer_header,
)
from ferrymq.wire.properties import encode_properties
from ferrymq.wire.records import BatchItem, MessageRecord, encode_batch, encode_record

__all__ = ["SEEDS"]


_PROPERTIES = {"UNIQ_KEY": "7F00000100002A9F", "TAGS": "a", "KEYS": "k1 k2", "WAIT": "true"}
_RECORD = MessageRecord(
    topic="chaos",
    body=b"p0-17 " + b"x" * 40,
    queue_id=3,
    queue_offset=17,
    log_offset=4096,
    properties=_PROPERTIES,
)
_COMMAND = RemotingCommand(
    code=310,
    opaque=7,
    remark="r",
    ext_fields={"topic": "chaos", "queueId": "3", "producerGroup": "g", "a": "1"},
    body=b"body",
)


def _frames() -> list[bytes]:
    binary = RemotingCommand(
        code=11, ext_fields={"topic": "t"}, serialize_type=SerializeType.ROCKETMQ
    )
    return [encode_frame(_COMMAND), encode_frame(binary), encode_frame(RemotingCommand(code=0))]


def _with_cut(data: bytes) -> bytes:
    """A leading byte for targets that split their input in two at `data[0]`."""
    return bytes([len(data) // 2 % 256]) + data


def _checkpoint() -> bytes:
    return Checkpoint(1, 2, 3, 4, 5, 6, 7, 8).encode()


def _index_file() -> bytes:
    slots = 16
    header = struct.pack(">qqqqii", 1000, 2000, 0, 4096, 1, 2)
    slot_table = bytearray(slots * 4)
    struct.pack_into(">i", slot_table, 4 * 5, 1)
    entry = struct.pack(">iqii", 5, 4096, 1, 0)
    return header + bytes(slot_table) + bytes(20) + entry


def _record_run() -> bytes:
    """The log offset of the first record (8 bytes), then two records back to back."""
    first = encode_record(_RECORD, record_crc=True)
    second = dataclasses.replace(_RECORD, log_offset=_RECORD.log_offset + len(first))
    return struct.pack(">q", _RECORD.log_offset) + first + encode_record(second, record_crc=True)


SEEDS: dict[str, list[bytes]] = {
    "frame": [_with_cut(b"".join(_frames())), *map(_with_cut, _frames())],
    "frame_fixed": [bytes([len(f) - 8 - len(_COMMAND.body) % 256]) + f[8:] for f in _frames()],
    "headers": [b"\x00\x01chaos\x00\x023\x00\x03g", b"\x05\x00\x01x"],
    "record": [encode_record(_RECORD), encode_record(_RECORD, record_crc=True)],
    "record_fixed": [encode_record(_RECORD, record_crc=True)],
    "record_run": [_record_run()],
    "batch": [encode_batch([BatchItem.of(b"a", _PROPERTIES), BatchItem.of(b"bb")])],
    "batch_fixed": [encode_batch([BatchItem.of(b"a", _PROPERTIES)])],
    "ha_slave": [
        _with_cut(encode_slave_handshake(SlaveHandshake(2)) + encode_slave_ack(4096)),
    ],
    "ha_master": [
        _with_cut(
            encode_master_handshake(MasterHandshake(4096, 2, (EpochEntry(1, 0), EpochEntry(2, 99))))
            + encode_transfer_header(4096, 2, 99, 4000, 5)
            + b"hello"
        ),
    ],
    "properties": [encode_properties(_PROPERTIES)],
    "bodies": [
        b"\x01" + encode_body(KVTable(table={"a": "1"})),
        b"\x02"
        + encode_body(
            TopicConfigSerializeWrapper(topic_config_table={"t": TopicConfig(topic_name="t")})
        ),
        b"\x80" + zlib.compress(b'{"topicConfigSerializeWrapper":{}}'),
    ],
    "checkpoint": [_checkpoint()],
    "checkpoint_fixed": [_checkpoint()[:64]],
    "epochs": [encode_epoch_file(EpochHistory([EpochEntry(1, 0), EpochEntry(3, 100)]))],
    "epochs_fixed": [b"1-0\n3-100\n7-5000\n"],
    "consume_queue": [pack_entries([(0, 120, 0), (120, 130, 5), (250, 90, 0)]) + bytes(8)],
    "index": [_index_file()],
}
"""Valid inputs per target (every target has at least one)."""
