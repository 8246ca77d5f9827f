"""Domain exceptions shared by every part of qveil, and the one table that gives each its
canonical code (the ``google.rpc.Code`` names, which no transport owns).

:func:`error_status` classifies an exception once; each transport then maps the canonical
code to its own status in one table (gRPC status codes in ``qveil.common.errors``, HTTP
statuses in ``qveil.server.protocol.rest.errors``,
exit codes in the CLI); nothing else inspects messages.

    QveilError
    ├── InvalidArgument        bad input: NaN, wrong dims, unknown action, bad config
    ├── NotFound               unknown release, bundle or dataset
    ├── FailedPrecondition     state does not allow the operation (retired release, ...)
    ├── PermissionDenied       wrong role
    ├── Unauthenticated        missing or bad token
    ├── ResourceExhausted      concurrency or size bound reached
    ├── Unavailable            store unreachable, disk full, read-only database
    ├── IntegrityError         stored noise or ledger fails verification (DATA_LOSS)
    ├── BudgetExceeded         privacy ledger cap would be exceeded (FailedPrecondition)
    └── PortInUse              a server port is taken by another process (FailedPrecondition)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "CODE_TABLE",
    "RETRY_CODES",
    "BudgetExceeded",
    "ErrorStatus",
    "FailedPrecondition",
    "IntegrityError",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "PortInUse",
    "QveilError",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "bad_argument",
    "clip",
    "echo",
    "error_status",
]

#: The most characters of user input an error message repeats (GUIDE: echo at most 80).
ECHO_LIMIT = 80


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` cut to ``limit`` characters by an ellipsis in its middle: its start and its
    end stay, the end the longer (a path's file name, an id's last characters)."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 3
    return text[:head] + "\u2026" + text[len(text) - (limit - 1 - head) :]


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr`` of user input for an error message, cut to ``limit`` characters (:func:`clip`):
    a megabyte-long release id or path never fills a log line or a status message."""
    return repr(clip(value if isinstance(value, str) else str(value), limit))


class QveilError(Exception):
    """Base of every error qveil raises on purpose.

    ``reason``: a machine-readable reason (``google.rpc.ErrorInfo.reason``, e.g.
    ``STATE_NOT_FINITE``); "" means the code's default. ``field``: the request field at
    fault (``google.rpc.BadRequest``), for bad input."""

    reason: str = ""
    field: str = ""


class InvalidArgument(QveilError, ValueError):
    """The caller's input is invalid; nothing was changed."""


class NotFound(QveilError, LookupError):
    """The named release, bundle or dataset does not exist."""


class FailedPrecondition(QveilError):
    """The system is not in a state that allows the operation."""


class PermissionDenied(QveilError):
    """The caller's role does not allow the operation."""


class Unauthenticated(QveilError):
    """No valid credentials were presented."""


class ResourceExhausted(QveilError):
    """A size or concurrency bound was reached; retry later or send less.

    ``retry_after``: seconds after which the same request can succeed (None: no estimate, the
    transport's default delay applies; ``math.inf``: retrying the same request never helps,
    e.g. a request larger than the caller's whole budget)."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        if retry_after is not None and not retry_after >= 0:
            raise ValueError(f"retry_after {retry_after!r} must be >= 0 seconds or None")
        self.retry_after = retry_after


class Unavailable(QveilError):
    """Not available now (the server starting or draining, the store down for a call that
    needs it); retrying later can succeed."""


class IntegrityError(QveilError):
    """Stored data failed verification: a value changed, a row vanished, a chain broke."""


class BudgetExceeded(FailedPrecondition):
    """A privacy event would take a dataset's cumulative epsilon or delta above its cap."""

    def __init__(
        self,
        *,
        dataset_id: str,
        spent: tuple[float, float],
        requested: tuple[float, float],
        cap: tuple[float, float],
    ) -> None:
        self.dataset_id = dataset_id
        self.spent = spent
        self.requested = requested
        self.cap = cap
        super().__init__(
            f"privacy budget of dataset {dataset_id!r} exceeded: spent (eps={spent[0]:.6g}, "
            f"delta={spent[1]:.3g}) + requested (eps={requested[0]:.6g}, "
            f"delta={requested[1]:.3g}) > cap (eps={cap[0]:.6g}, delta={cap[1]:.3g})"
        )


class PortInUse(FailedPrecondition):
    """A port ``qveil serve`` was asked to listen on is held by another process (another
    server, most likely); the message is the whole line ``qveil serve`` prints."""


def bad_argument(message: str, *, field: str, reason: str) -> InvalidArgument:
    """An InvalidArgument naming the request field and a machine-readable reason."""
    exc = InvalidArgument(message)
    exc.field = field
    exc.reason = reason
    return exc


#: Domain exception -> (canonical code, default reason). First match wins, so subclasses
#: come before their bases (BudgetExceeded before FailedPrecondition). Anything else is
#: INTERNAL with a generic message (the traceback goes to the server log only).
CODE_TABLE: tuple[tuple[type[BaseException], str, str], ...] = (
    (BudgetExceeded, "FAILED_PRECONDITION", "BUDGET_EXCEEDED"),
    (InvalidArgument, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    (NotFound, "NOT_FOUND", "NOT_FOUND"),
    (FailedPrecondition, "FAILED_PRECONDITION", "FAILED_PRECONDITION"),
    (PermissionDenied, "PERMISSION_DENIED", "PERMISSION_DENIED"),
    (Unauthenticated, "UNAUTHENTICATED", "UNAUTHENTICATED"),
    (ResourceExhausted, "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"),
    (Unavailable, "UNAVAILABLE", "UNAVAILABLE"),
    (IntegrityError, "DATA_LOSS", "INTEGRITY_FAILURE"),
    (TimeoutError, "DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED"),
    (NotImplementedError, "UNIMPLEMENTED", "UNIMPLEMENTED"),
)

#: Codes whose request may succeed later, with the default wait in seconds when the
#: exception names none (``ResourceExhausted.retry_after``).
RETRY_CODES: dict[str, float] = {"RESOURCE_EXHAUSTED": 0.1, "UNAVAILABLE": 0.5}


@dataclass(frozen=True, slots=True)
class ErrorStatus:
    """An exception as every transport sees it."""

    code: str  # a google.rpc.Code name: "INVALID_ARGUMENT", ..., "INTERNAL"
    message: str
    reason: str
    field: str
    #: seconds after which the same request may succeed; None: waiting does not help (or
    #: the code is not one of RETRY_CODES)
    retry_after: float | None


def error_status(exc: BaseException) -> ErrorStatus:
    """Classify ``exc`` through :data:`CODE_TABLE` (unknown exceptions: INTERNAL, with a
    message that says nothing about them)."""
    for cls, code, default_reason in CODE_TABLE:
        if isinstance(exc, cls):
            message = str(exc) or code
            reason = str(getattr(exc, "reason", "") or default_reason)
            break
    else:
        return ErrorStatus("INTERNAL", "internal server error", "INTERNAL", "", None)
    retry_after: float | None = None
    if code in RETRY_CODES:
        hint = getattr(exc, "retry_after", None)
        retry_after = RETRY_CODES[code] if hint is None else float(hint)
        if math.isinf(retry_after):
            retry_after = None
    field = str(getattr(exc, "field", "") or "")
    return ErrorStatus(code, message, reason, field, retry_after)
