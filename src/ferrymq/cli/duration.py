"""A click parameter for spans of time written as people write them: `90`, `90s`, `20m`, `1h30m`.

Hand-written: a regular expression over three units is all it takes, not worth a dependency.
"""

from __future__ import annotations

import re
from typing import Final

import click

__all__ = ["Duration", "parse_duration_s"]

_PART: Final = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_UNIT_S: Final = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration_s(text: str) -> float:
    """Seconds in `text`: a plain number of seconds, or parts such as `1h`, `20m`, `1h30m`, `45s`.

    Raises:
        ValueError: anything else (naming the text and the accepted forms).
    """
    spec = text.strip().lower()
    try:
        return float(spec)
    except ValueError:
        pass
    parts = _PART.findall(spec)
    if not parts or "".join(number + unit for number, unit in parts) != spec:
        raise ValueError(f"{text!r} is not a duration (seconds, or e.g. 90s, 20m, 1h, 1h30m)")
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


class Duration(click.ParamType[float]):
    """Seconds as a float, from `parse_duration_s`, at least `min_s`."""

    name = "duration"

    def __init__(self, min_s: float = 0.0) -> None:
        self.min_s = min_s

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """Seconds from a number or a duration string; a usage error otherwise."""
        if isinstance(value, int | float):
            seconds = float(value)
        else:
            try:
                seconds = parse_duration_s(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        if seconds < self.min_s:
            self.fail(f"{value!r} is shorter than {self.min_s:g} s", param, ctx)
        return seconds
