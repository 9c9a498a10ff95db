"""Fault injection and history checking for ferrymq clusters (`ferry chaos`, issue 8).

`history` (the JSONL event format) and `checker` (the anomaly analysis) are pure; the rest runs a
cluster of real processes inside a private network namespace and injects faults into it.
"""
