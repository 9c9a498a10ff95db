"""The leader's decisions refuse what could never be written or run, as 400s."""

from collections.abc import Mapping

import pytest

from ferrymq.connect import decide
from ferrymq.connect.errors import BadRequestError
from ferrymq.connect.plugin import ConfigKey, ConfigType, ConnectorPlugin, Plugins
from ferrymq.connect.records import encode_record
from ferrymq.connect.state import ConfigState


class Wide(ConnectorPlugin):
    """A plugin that makes as many task configs as it is allowed, each `padding` bytes."""

    type = "sink"
    keys = (ConfigKey("padding", ConfigType.INT, "bytes per task config", default="10"),)

    def task_configs(self, config: Mapping[str, str], max_tasks: int) -> list[dict[str, str]]:
        pad = "x" * int(config.get("padding", "10"))
        return [{"pad": pad, "task": str(i)} for i in range(max_tasks)]


PLUGINS = Plugins({"Wide": Wide})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1025", "no more than 1024"),
        ("0", "at least 1"),
        ("2147483648", "out of range"),
        ("-2147483649", "out of range"),
        ("ten", "Not a number of type INT"),
    ],
)
def test_tasks_max_outside_its_range_is_a_bad_request(value: str, message: str) -> None:
    config = {"connector.class": "Wide", "tasks.max": value}
    with pytest.raises(BadRequestError, match=message):
        decide.create(ConfigState(), PLUGINS, "c", config)


def test_a_record_too_large_for_the_log_is_a_bad_request_not_a_retry() -> None:
    config = {"connector.class": "Wide", "tasks.max": "1024", "padding": "2048"}
    with pytest.raises(BadRequestError, match="over the limit of 1048576"):
        decide.create(ConfigState(), PLUGINS, "c", config)
    fits = {**config, "padding": "900"}
    record = decide.create(ConfigState(), PLUGINS, "c", fits)
    assert len(record.tasks) == 1024
    assert len(encode_record(record)) <= decide.MAX_RECORD_BYTES
