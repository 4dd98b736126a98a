"""The base of mpcml's own errors.

Every error mpcml raises on purpose derives from `MpcmlError`, whose message is written for
people and never quotes a data value: a job worker reports such a message to the coordinator
as it is, and any other error by its type alone (its message could hold a value).
"""

from __future__ import annotations


class MpcmlError(Exception):
    """An error of mpcml's own; its message names the problem and holds no private value."""


class StatusError(MpcmlError):
    """A request refused with a gRPC status; `code` is the status name (e.g. NOT_FOUND)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
