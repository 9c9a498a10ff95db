"""Errors of the Connect worker, each with the HTTP status the REST API answers it with.

Kafka Connect's `ConnectExceptionMapper`: the body is `{"error_code", "message"}` and the HTTP
status equals `error_code`. ferrymq adds the two outcomes a forwarded or timed-out write can
have: 409 with Retry-After when no leader is known (nothing was written), 504 when a write may
have landed (never a 500 "failed" for it).
"""

from __future__ import annotations

from ferrymq.errors import FerryError

__all__ = [
    "BadRequestError",
    "ConflictError",
    "ConnectRestError",
    "NotFoundError",
    "NotLeaderError",
    "NotWrittenError",
    "OutcomeUnknownError",
    "UnavailableError",
]


class ConnectRestError(FerryError):
    """An error the REST API answers with `status`."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequestError(ConnectRestError):
    """A bad body, name, config value or state for the operation (400)."""

    status = 400


class NotFoundError(ConnectRestError):
    """No such connector, task or plugin (404)."""

    status = 404


class ConflictError(ConnectRestError):
    """The connector exists already, or the request cannot be served now (409)."""

    status = 409


class NotLeaderError(ConflictError):
    """This worker is not the leader; nothing was written.

    `leader_url` is empty when none is known (the REST layer then answers 409 with Retry-After,
    else forwards).
    """

    def __init__(self, leader_id: str, leader_url: str, reason: str = "") -> None:
        known = f"the leader is {leader_id} at {leader_url}" if leader_url else "no known leader"
        super().__init__(
            f"this worker is not the leader ({known}{'; ' + reason if reason else ''})"
        )
        self.leader_id = leader_id
        self.leader_url = leader_url


class NotWrittenError(ConflictError):
    """The broker refused the record for a passing reason: nothing was written (409).

    No master yet, or too few in-sync replicas; the answer carries Retry-After.
    """


class UnavailableError(ConnectRestError):
    """The worker cannot answer now (its broker is catching up); nothing changed (503)."""

    status = 503


class OutcomeUnknownError(ConnectRestError):
    """A write may or may not have landed (504): GET to check."""

    status = 504
