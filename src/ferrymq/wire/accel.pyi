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
def decode_columns(
    data: bytes | bytearray | memoryview,
) -> tuple[list[int], list[int], list[int], list[bytes], list[str]]: ...
def verify_record_crc(record: bytes | bytearray | memoryview, require: bool) -> bool: ...
