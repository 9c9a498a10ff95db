import mmap
from collections.abc import Mapping

def encode_records(
    items: list[object],
    topic_part: bytes,
    magic: int,
    queue_id: int,
    first_queue_offset: int,
    step: int,
    first_log_offset: int,
    sys_flag: int,
    born_timestamp_ms: int,
    born_host: bytes,
    store_timestamp_ms: int,
    store_host: bytes,
    reconsume_times: int,
    prepared_transaction_offset: int,
) -> tuple[bytes, list[int]]: ...
def java_string_hash(text: str) -> int: ...
def crc_source() -> str: ...
def measure(items: list[object], overhead: int) -> tuple[int, int]: ...
def decode_buffers(
    data: bytes | bytearray | memoryview,
) -> tuple[int, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes]: ...
def verify_record_crc(record: bytes | bytearray | memoryview, require: bool) -> bool: ...
def scan_entries(
    entries: bytes | bytearray | memoryview,
    max_chosen: int,
    max_scan: int,
    max_bytes: int,
    used_bytes: int,
    have_chosen: bool,
    min_log_offset: int,
    codes: frozenset[int] | set[int] | None,
    span_bytes: int,
) -> tuple[int, int, int, int, int, list[tuple[int, int, int, int]]]: ...
def split_span(
    span: bytes | bytearray | memoryview,
    entries: bytes | bytearray | memoryview,
    first: int,
    count: int,
    check_crc: bool,
    require_record_crc: bool,
) -> tuple[list[bytes], int]: ...
def record_infos(
    buf: bytes | bytearray | memoryview,
    pos: int,
    limit: int,
    check_crc: bool,
    require_record_crc: bool,
    log_offset: int,
) -> tuple[list[tuple[str, int, int, int, int, int, int, int, str | None, str | None]], int]: ...
def index_put(
    buffer: mmap.mmap | bytearray,
    slot_count: int,
    entries_at: int,
    index_count: int,
    begin_timestamp_ms: int,
    keys: list[tuple[str, str, int, int]],
) -> tuple[int, int]: ...
def acl_pads(key: bytes) -> bytes: ...
def acl_signature(
    fields: Mapping[str, str], body: bytes | bytearray | memoryview, pads: bytes, old: bool
) -> str: ...
def acl_verify(
    fields: Mapping[str, str],
    body: bytes | bytearray | memoryview,
    pads: bytes,
    old: bool,
    sent: str,
) -> bool: ...
def sha1(data: bytes | bytearray | memoryview, portable: bool) -> bytes: ...
def sha1_source() -> str: ...
