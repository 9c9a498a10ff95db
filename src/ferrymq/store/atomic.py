"""Atomic replacement of small files: the only way ferrymq writes metadata.

A metadata file (checkpoint, consumer offsets, topic configs, epochs, broker identity) is either
its old content or its new content after a crash at any instant, never a mix: write a temporary
file beside it, fsync it, rename it over the old one, fsync the directory.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "read_file", "write_atomic"]


def fsync_dir(path: Path) -> None:
    """Make the directory entries of `path` (a directory) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_file(path: Path) -> bytes | None:
    """The content of `path`, or None when it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
