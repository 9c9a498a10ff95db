"""The topics a sink connector reads: Kafka Connect's `topics` / `topics.regex` rule.

Shared by the sink plugins (PostgresSink, FileSink): exactly one of the two keys, each topic a
valid name, the pattern a valid regular expression.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ferrymq.model import validate_topic

__all__ = ["list_value", "topic_selection_errors"]


def list_value(config: Mapping[str, str], key: str) -> list[str]:
    """A comma-separated config value's items, stripped, empty ones dropped."""
    return [part.strip() for part in (config.get(key) or "").split(",") if part.strip()]


def topic_selection_errors(config: Mapping[str, str]) -> dict[str, list[str]]:
    """What is wrong with a sink's `topics` / `topics.regex`, by key (empty: nothing)."""
    errors: dict[str, list[str]] = {}
    topics = list_value(config, "topics")
    pattern = (config.get("topics.regex") or "").strip()
    if bool(topics) == bool(pattern):
        errors.setdefault("topics", []).append("give exactly one of topics and topics.regex")
    for topic in topics:
        try:
            validate_topic(topic)
        except ValueError as exc:
            errors.setdefault("topics", []).append(str(exc))
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            errors.setdefault("topics.regex", []).append(f"not a regular expression: {exc}")
    return errors
