"""The MessagingService v2 protobuf classes, built from the official 5.x client's descriptors.

Owns where the `apache.rocketmq.v2` schema comes from (see the package docstring for why):
`build()` downloads the pinned wheel of PyPI `rocketmq-python-client` with pip (no dependencies,
nothing installed), reads the two serialized `FileDescriptorProto`s out of its generated
`definition_pb2.py` and `service_pb2.py` with `ast` (their code is never run nor imported), and
writes them as one `FileDescriptorSet` file in ferrymq's cache. `load()` builds message classes
from that file in a private descriptor pool, so the 4.x client's `rocketmq` module and the 5.x
one never meet in a process.
"""

from __future__ import annotations

import ast
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Final

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    message_factory,
    timestamp_pb2,
)

from ferrymq.errors import FerryError
from ferrymq.store.atomic import write_atomic

__all__ = [
    "CLIENT_PIN",
    "V2",
    "build",
    "cache_dir",
    "client_python",
    "descriptor_file",
    "load",
]

CLIENT_PIN: Final = "rocketmq-python-client==5.1.2"
"""The official client whose stubs define the schema (and which the tests run unchanged)."""
_WHEEL: Final = "rocketmq_python_client-5.1.2-py3-none-any.whl"
_SOURCES: Final = (
    "rocketmq/grpc_protocol/definition_pb2.py",
    "rocketmq/grpc_protocol/service_pb2.py",
)
PACKAGE: Final = "apache.rocketmq.v2"
SERVICE: Final = f"{PACKAGE}.MessagingService"


def cache_dir() -> Path:
    """The cache of ferrymq (`$FERRYMQ_CACHE`, else `~/.cache/ferrymq`)."""
    env = os.environ.get("FERRYMQ_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ferrymq"


def descriptor_file() -> Path:
    """Where `build` writes the descriptor set."""
    return cache_dir() / "rocketmq-apis-v2-5.1.2.desc"


def _serialized_files(source: str) -> list[bytes]:
    """The byte literals passed to `AddSerializedFile(...)` in a generated `_pb2.py`."""
    return [
        node.args[0].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "AddSerializedFile"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, bytes)
    ]


def descriptor_set_from_wheel(wheel: Path) -> bytes:
    """The `FileDescriptorSet` (definition.proto, then service.proto) held in the client's wheel."""
    files = descriptor_pb2.FileDescriptorSet()
    with zipfile.ZipFile(wheel) as archive:
        for name in _SOURCES:
            literals = _serialized_files(archive.read(name).decode())
            if len(literals) != 1:
                raise FerryError(f"{wheel.name}: {name} holds {len(literals)} descriptors, not 1")
            files.file.add().ParseFromString(literals[0])
    return bytes(files.SerializeToString())


def build(*, force: bool = False) -> Path:
    """Download the pinned client wheel (pip) and write the descriptor set; returns its path."""
    target = descriptor_file()
    if target.exists() and not force:
        return target
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = wheels / _WHEEL
    if not wheel.exists():
        with tempfile.TemporaryDirectory(dir=wheels) as tmp:
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            command += ["--only-binary", ":all:", CLIENT_PIN, "-d", tmp]
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise FerryError(f"pip download {CLIENT_PIN} failed: {done.stderr.strip()[-400:]}")
            os.replace(Path(tmp) / _WHEEL, wheel)
    write_atomic(target, descriptor_set_from_wheel(wheel))
    return target


def client_python() -> Path:
    """The python of a venv holding the pinned official client, made once (pip) in the cache.

    Its module `rocketmq` is also the 4.x client's, so it never shares ferrymq's venv.
    """
    venv = cache_dir() / f"rmq5-venv-{CLIENT_PIN.split('==')[1]}"
    python = venv / "bin" / "python"
    ready = venv / ".ready"
    if ready.exists():
        return python
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / "rmq5-venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two processes never build it at once
        if not ready.exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", CLIENT_PIN],
                check=True,
                timeout=600,
            )
            ready.touch()
    return python


class V2:
    """Message classes and enum values of `apache.rocketmq.v2`, by their short names."""

    def __init__(self, descriptor_set: bytes) -> None:
        self.pool = descriptor_pool.DescriptorPool()
        for known in (timestamp_pb2.DESCRIPTOR, duration_pb2.DESCRIPTOR):
            proto = descriptor_pb2.FileDescriptorProto()
            known.CopyToProto(proto)
            self.pool.Add(proto)
        files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
        for proto in files.file:
            self.pool.Add(proto)
        self.service = self.pool.FindServiceByName(SERVICE)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            found: Any = message_factory.GetMessageClass(
                self.pool.FindMessageTypeByName(f"{PACKAGE}.{name}")
            )
        except KeyError:
            try:
                found = self.pool.FindEnumTypeByName(f"{PACKAGE}.{name}").values_by_name
            except KeyError as exc:
                raise AttributeError(name) from exc
        setattr(self, name, found)  # asked once per name
        return found

    def code(self, name: str) -> int:
        """The value of `apache.rocketmq.v2.Code.<name>`."""
        return int(self.pool.FindEnumTypeByName(f"{PACKAGE}.Code").values_by_name[name].number)

    def enum(self, enum: str, name: str) -> int:
        """The value of `apache.rocketmq.v2.<enum>.<name>`."""
        return int(self.pool.FindEnumTypeByName(f"{PACKAGE}.{enum}").values_by_name[name].number)


@functools.cache
def load() -> V2:
    """The schema, building the descriptor file first when it is missing (pip, once)."""
    return V2(build().read_bytes())


if __name__ == "__main__":  # `python -m ferrymq.proxy.stubs`: the build step (make setup, .ci/run)
    sys.stdout.write(f"{build(force='--force' in sys.argv)}\n")
