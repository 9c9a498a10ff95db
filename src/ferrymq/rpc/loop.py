"""The event loop every ferrymq process and client thread runs: uvloop where it is installed.

uvloop is a dependency on Linux (the fast loop for the servers and for clients' sockets); on
other platforms the code runs on asyncio's own loop unchanged.
"""

from __future__ import annotations

import asyncio

__all__ = ["new_event_loop"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
