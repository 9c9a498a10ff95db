"""The persistent broker id files (seed 000): format, resume states, refusals."""

from pathlib import Path

import pytest

from ferrymq.broker.identity import BrokerIdentity, IdentityFiles, RegisterState
from ferrymq.errors import StoreError


def _files(tmp_path: Path, cluster: str = "C", name: str = "broker-a") -> IdentityFiles:
    return IdentityFiles(tmp_path / "brokerIdentity", cluster, name)


def test_registration_resumes_where_the_files_say(tmp_path: Path) -> None:
    files = _files(tmp_path)
    assert files.state() is RegisterState.INITIAL
    temp = files.save_temp(3, "127.0.0.1:10911;1710000000000")
    assert (
        tmp_path / "brokerIdentity-temp"
    ).read_bytes() == b"C#broker-a#3#127.0.0.1:10911;1710000000000"
    assert files.state() is RegisterState.CREATE_TEMP_METADATA_FILE_DONE
    assert files.load_temp() == temp
    identity = files.save(3)
    assert (tmp_path / "brokerIdentity").read_bytes() == b"C#broker-a#3"
    assert not (tmp_path / "brokerIdentity-temp").exists()
    assert files.state() is RegisterState.CREATE_METADATA_FILE_DONE
    assert files.load() == identity == BrokerIdentity("C", "broker-a", 3)


def test_files_of_another_group_are_refused(tmp_path: Path) -> None:
    _files(tmp_path, name="broker-b").save(2)
    with pytest.raises(StoreError, match="belongs to C/broker-b"):
        _files(tmp_path).load()


def test_an_unreadable_metadata_file_stops_the_broker_but_a_bad_temp_file_starts_over(
    tmp_path: Path,
) -> None:
    (tmp_path / "brokerIdentity-temp").write_bytes(b"C#broker-a#x#code")
    files = _files(tmp_path)
    assert files.load_temp() is None
    assert not (tmp_path / "brokerIdentity-temp").exists()
    for bad in (b"C#broker-a", b"C#broker-a#0", b"C##2", b"\xff#a#1"):
        (tmp_path / "brokerIdentity").write_bytes(bad)
        with pytest.raises(StoreError, match="brokerIdentity"):
            files.load()
