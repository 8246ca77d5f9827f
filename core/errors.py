"""Domain exceptions shared by every part of qveil.

Transport layers map these to their own codes in one table each (gRPC status codes in
``qveil.server.errors``, exit codes in the CLI); nothing else inspects messages.

    QveilError
    ├── InvalidArgument        bad input: NaN, out of interval, unknown action, bad config
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

__all__ = [
    "BudgetExceeded",
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
    "echo",
]

#: The most characters of user input an error message repeats (GUIDE: echo at most 80).
ECHO_LIMIT = 80


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr`` of user input for an error message, cut to ``limit`` characters with an
    ellipsis: a megabyte-long release id or path never fills a log line or a status message."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    return repr(text)


class QveilError(Exception):
    """Base of every error qveil raises on purpose."""


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
    e.g. a storage cap or a request larger than the caller's whole budget)."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        if retry_after is not None and not retry_after >= 0:
            raise ValueError(f"retry_after {retry_after!r} must be >= 0 seconds or None")
        self.retry_after = retry_after


class Unavailable(QveilError):
    """A dependency (the store) cannot serve now; nothing unsafe was answered."""


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
