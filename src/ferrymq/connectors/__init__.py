"""Connector plugins (the `ferrymq.connectors` entry points) and the task runtime on Spark."""
