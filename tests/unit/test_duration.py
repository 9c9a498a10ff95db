"""Durations on the command line: `ferry chaos --duration 1h` (`make soak DURATION=1h`)."""

import click
import pytest
from click.testing import CliRunner

from ferrymq.cli.duration import Duration, parse_duration_s
from ferrymq.cmd.ferry import cli


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("900", 900.0),
        ("1.5", 1.5),
        ("45s", 45.0),
        ("20m", 1200.0),
        ("1h", 3600.0),
        ("1h30m", 5400.0),
        ("2m10s", 130.0),
        (" 1H ", 3600.0),
        ("0.5h", 1800.0),
    ],
)
def test_durations_parse_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "1d", "1h-", "ten", "1h 30m", "-5m", "1hh"])
def test_anything_else_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration_s(text)


def test_the_parameter_enforces_its_minimum_and_passes_numbers_through() -> None:
    param = Duration(min_s=30)
    assert param.convert("1h", None, None) == 3600.0
    assert param.convert(900.0, None, None) == 900.0
    with pytest.raises(click.BadParameter, match="shorter than 30 s"):
        param.convert("10s", None, None)


def test_a_bad_duration_is_a_usage_error_that_names_it() -> None:
    result = CliRunner().invoke(cli, ["chaos", "--duration", "forever"])
    assert result.exit_code == 2
    assert "'forever' is not a duration" in result.output
