"""A controller-mode broker's persistent id: the `brokerIdentity` and `brokerIdentity-temp` files.

Spec: reference/rocketmq-controller-spec.md section 2 (seed 000). The metadata file holds
`cluster#brokerName#brokerId`; the temp file, written before the id is applied at the controller,
adds `#registerCheckCode` (`address;millis`), so a broker that crashed after the controller
accepted its id proves on restart that the id is its own. Unlike RocketMQ (delete, then write),
both are written atomically and fsynced (`store.atomic`): a crash leaves the old or the new
content, never a torn one.

Registration walks INITIAL -> temp file -> applied -> metadata file -> registered; `state`
says where a restart resumes.
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from pathlib import Path

from ferrymq.errors import StoreError
from ferrymq.store.atomic import fsync_dir, read_file, write_atomic

__all__ = ["BrokerIdentity", "IdentityFiles", "RegisterState"]


class RegisterState(enum.Enum):
    """Where a broker's registration with the controller stands (RocketMQ `RegisterState`)."""

    INITIAL = "INITIAL"
    CREATE_TEMP_METADATA_FILE_DONE = "CREATE_TEMP_METADATA_FILE_DONE"
    CREATE_METADATA_FILE_DONE = "CREATE_METADATA_FILE_DONE"
    REGISTERED = "REGISTERED"


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    """A broker's id in its group; `register_check_code` only while it is being applied."""

    cluster_name: str
    broker_name: str
    broker_id: int
    register_check_code: str = ""

    def encode(self) -> bytes:
        """The file content: `cluster#name#id` (`#code` in the temp file)."""
        parts = [self.cluster_name, self.broker_name, str(self.broker_id)]
        if self.register_check_code:
            parts.append(self.register_check_code)
        return "#".join(parts).encode()

    @classmethod
    def decode(cls, data: bytes, *, temp: bool) -> BrokerIdentity:
        """Parse a file's content.

        Raises:
            ValueError: not `cluster#name#id` (plus `#code` for a temp file), or a bad id.
        """
        parts = data.decode().split("#")
        if len(parts) != (4 if temp else 3) or not all(parts):
            raise ValueError(f"expected {'cluster#name#id#code' if temp else 'cluster#name#id'}")
        broker_id = int(parts[2])
        if broker_id < 1:
            raise ValueError(f"broker id {broker_id} is below 1")
        return cls(parts[0], parts[1], broker_id, parts[3] if temp else "")


class IdentityFiles:
    """The two files at `storePathBrokerIdentity` (`<storePathRootDir>/brokerIdentity`)."""

    def __init__(self, path: Path, cluster_name: str, broker_name: str) -> None:
        self.path = path
        self.temp_path = path.with_name(path.name + "-temp")
        self.cluster_name = cluster_name
        self.broker_name = broker_name

    def load(self) -> BrokerIdentity | None:
        """The applied identity, if the metadata file exists.

        Raises:
            StoreError: the file is unreadable, or names another cluster or broker name (an
                operator must fix it: RocketMQ's `checkMetadataValid`).
        """
        data = read_file(self.path)
        if data is None:
            return None
        try:
            identity = BrokerIdentity.decode(data, temp=False)
        except (ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"{self.path}: {exc}") from None
        self._check_names(identity, self.path)
        return identity

    def load_temp(self) -> BrokerIdentity | None:
        """The identity being applied, if the temp file exists and reads back whole.

        A temp file that does not parse is dropped (nothing was applied with it that a fresh
        start cannot redo).

        Raises:
            StoreError: it names another cluster or broker name.
        """
        data = read_file(self.temp_path)
        if data is None:
            return None
        try:
            identity = BrokerIdentity.decode(data, temp=True)
        except (ValueError, UnicodeDecodeError):
            self.clear_temp()
            return None
        self._check_names(identity, self.temp_path)
        return identity

    def state(self) -> RegisterState:
        """Where registration resumes after a (re)start."""
        if self.load() is not None:
            return RegisterState.CREATE_METADATA_FILE_DONE
        if self.load_temp() is not None:
            return RegisterState.CREATE_TEMP_METADATA_FILE_DONE
        return RegisterState.INITIAL

    def save_temp(self, broker_id: int, register_check_code: str) -> BrokerIdentity:
        """Write the temp file (before ApplyBrokerId)."""
        identity = BrokerIdentity(
            self.cluster_name, self.broker_name, broker_id, register_check_code
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.temp_path, identity.encode())
        return identity

    def save(self, broker_id: int) -> BrokerIdentity:
        """Write the metadata file (after ApplyBrokerId succeeded), then drop the temp file."""
        identity = BrokerIdentity(self.cluster_name, self.broker_name, broker_id)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, identity.encode())
        self.clear_temp()
        return identity

    def clear_temp(self) -> None:
        """Delete the temp file (applied, or refused: start over)."""
        with contextlib.suppress(FileNotFoundError):
            self.temp_path.unlink()
            fsync_dir(self.temp_path.parent)

    def _check_names(self, identity: BrokerIdentity, path: Path) -> None:
        if (identity.cluster_name, identity.broker_name) != (self.cluster_name, self.broker_name):
            raise StoreError(
                f"{path} belongs to {identity.cluster_name}/{identity.broker_name}, not "
                f"{self.cluster_name}/{self.broker_name}: fix the config or move the file"
            )
