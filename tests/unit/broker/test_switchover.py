"""The role file a classic switchover leaves: it outlives restarts and overrides the config."""

from pathlib import Path

import msgspec
import pytest

from ferrymq.broker.config import BrokerConfig, BrokerRole
from ferrymq.broker.switchover import ROLE_FILE, apply_role_file, save_role_file


def test_a_switched_role_overrides_the_configured_one_until_the_file_goes(tmp_path: Path) -> None:
    config = BrokerConfig(
        store_path_root_dir=tmp_path, broker_id=0, broker_role=BrokerRole.SYNC_MASTER
    )
    assert apply_role_file(config) is config, "no file: the configuration as it is"
    save_role_file(config, 2, BrokerRole.SLAVE)
    switched = apply_role_file(config)
    assert (switched.broker_id, switched.broker_role) == (2, BrokerRole.SLAVE)
    assert switched.store_path_root_dir == config.store_path_root_dir
    save_role_file(config, 0, BrokerRole.SYNC_MASTER)  # switched back: the file agrees
    assert apply_role_file(config) is config
    (tmp_path / ROLE_FILE).unlink()
    assert apply_role_file(config) is config


def test_a_damaged_role_file_is_refused_not_guessed(tmp_path: Path) -> None:
    config = BrokerConfig(store_path_root_dir=tmp_path)
    (tmp_path / ROLE_FILE).write_text('{"brokerId": 1, "brokerRole": "BOSS"}')
    with pytest.raises(msgspec.ValidationError):
        apply_role_file(config)
