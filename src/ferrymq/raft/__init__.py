"""Raft for the controller: a pure node (node, log, progress), file storage, one asyncio driver."""
