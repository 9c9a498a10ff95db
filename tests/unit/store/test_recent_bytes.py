"""The commit log's tail kept in memory: every read gives the bytes the segment files hold."""

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ferrymq.store.commitlog import CommitLog

SEGMENT = 4096

_steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 1500)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("reopen"), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)


def _check_reads(log: CommitLog) -> None:
    end = log.write_offset
    for start in range(log.min_offset, end, 97):
        for length in (1, 50, 700, 5000):
            from_disk = log.chain.read(start, min(length, end - start))
            assert log.read(start, length) == from_disk, (start, length)


@given(_steps)
def test_reads_of_the_tail_equal_the_files_across_rolls_truncations_and_reopens(
    steps: list[tuple[str, float]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        log = CommitLog(directory, SEGMENT)
        log.load()
        counter = 0
        for action, value in steps:
            if action == "append":
                size = int(value)
                at = log.reserve(size)  # may roll, writing a blank to the old segment
                counter += 1
                log.write(at, bytes([counter % 251]) * size)
            elif action == "truncate":
                cut = int(log.min_offset + (log.write_offset - log.min_offset) * value)
                log.truncate(cut)
            else:  # a restart: the same files, nothing in memory, the end set as recovery does
                end = log.write_offset
                log.close()
                log = CommitLog(directory, SEGMENT)
                log.load()
                log.truncate(end)
                log.write_offset = end
            _check_reads(log)
        log.close()


def test_the_tail_is_read_from_memory_and_older_bytes_from_the_file(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, 1 << 20)
    log.load()
    for i in range(8):
        log.write(log.reserve(100_000), bytes([i]) * 100_000)
    file_reads: list[int] = []
    read_file = log.chain.read

    def counting(offset: int, length: int) -> bytes:
        file_reads.append(offset)
        return read_file(offset, length)

    log.chain.read = counting  # type: ignore[method-assign]
    assert log.read(700_000, 200_000) == bytes([7]) * 100_000  # stops at the log's end
    assert log.read(500_000, 1000) == bytes([5]) * 1000
    assert file_reads == []  # the last 512 KiB at most, kept since the last cut to 256 KiB
    assert log.read(100_000, 1000) == bytes([1]) * 1000
    assert file_reads == [100_000]
    log.close()
