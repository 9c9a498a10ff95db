"""The epoch file: RocketMQ's text layout, checked on load, replaced atomically."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.errors import StoreError
from ferrymq.store.epochs import (
    EPOCH_FILE_NAME,
    EpochFile,
    EpochHistory,
    decode_epoch_file,
    encode_epoch_file,
)
from ferrymq.wire.ha import EpochEntry


def test_the_layout_is_rocketmqs() -> None:
    history = EpochHistory([EpochEntry(7, 7000), EpochEntry(8, 8000)])
    # the spec's example: count, CRC32 of the entry lines masked to 31 bits, the lines
    assert encode_epoch_file(history) == b"2\n773307083\n7-7000\n8-8000\n"


@st.composite
def histories(draw: st.DrawFn) -> EpochHistory:
    steps = draw(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 1000)), max_size=20))
    history = EpochHistory()
    epoch, offset = 0, 0
    for epoch_step, offset_step in steps:
        epoch += epoch_step
        offset += offset_step
        history.assign(epoch, offset)
    return history


@given(histories())
def test_every_history_round_trips(history: EpochHistory) -> None:
    assert decode_epoch_file(encode_epoch_file(history), "f") == history


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"2\n773307083\n7-7000\n", "says 2 entries, holds 1"),
        (b"2\n12345\n7-7000\n8-8000\n", "CRC mismatch"),
        (b"x\n0\n", "not an epoch file"),
        (b"\xff\xfe", "not an epoch file"),
        (b"2\n0\n8-8000\n7-7000\n", "does not follow"),
        (b"2\n0\n7-7000\n8-7000\n", "does not follow"),
    ],
)
def test_damaged_files_fail_to_load_never_as_an_empty_history(data: bytes, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        decode_epoch_file(data, "f")


def test_a_zero_crc_disables_the_check_as_in_rocketmq() -> None:
    assert decode_epoch_file(b"1\n0\n3-30\n", "f").entries == (EpochEntry(3, 30),)


def test_changes_are_on_disk_when_they_return(tmp_path: Path) -> None:
    epochs = EpochFile.open(tmp_path)
    assert not (tmp_path / EPOCH_FILE_NAME).exists()
    epochs.assign(1, 0)
    epochs.assign(2, 500)
    epochs.assign(3, 500)  # empty epoch 2 replaced
    assert EpochFile.open(tmp_path).history.entries == (EpochEntry(1, 0), EpochEntry(3, 500))
    epochs.truncate_from_offset(400)
    assert EpochFile.open(tmp_path).history.entries == (EpochEntry(1, 0),)
    epochs.assign(4, 450)
    epochs.truncate_from_epoch(4)
    assert EpochFile.open(tmp_path).history.entries == (EpochEntry(1, 0),)
    assert not list(tmp_path.glob(".*.tmp"))


def test_retention_drops_only_epochs_that_ended() -> None:
    history = EpochHistory([EpochEntry(1, 0), EpochEntry(2, 100), EpochEntry(3, 200)])
    assert history.drop_before(150) is True
    assert list(history) == [EpochEntry(2, 100), EpochEntry(3, 200)]
    assert history.drop_before(10_000) is True
    assert list(history) == [EpochEntry(3, 200)]  # the current epoch always stays
    assert history.find(250, 300) == (EpochEntry(3, 200), 300)
    assert history.find(300, 300) is None
