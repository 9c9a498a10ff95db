"""The storage engine: commit log, consume queues, key index, recovery, flush (no asyncio)."""
