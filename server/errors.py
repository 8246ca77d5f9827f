"""The ONE table mapping qveil's domain exceptions to gRPC status codes, and the
``google.rpc.Status`` details sent with each error.

Servicers never choose codes themselves: they call :func:`status_for` on whatever the
handlers raised. The client's exception tree (``qveil.client.errors``) mirrors this table.

Details attached (trailer ``grpc-status-details-bin``, the grpcio-status convention):
``google.rpc.ErrorInfo`` (domain ``qveil``, a ``reason`` such as ``STATE_OUT_OF_INTERVAL``),
``google.rpc.BadRequest`` with the offending field for INVALID_ARGUMENT, ``RetryInfo`` for
RESOURCE_EXHAUSTED and UNAVAILABLE. Unexpected exceptions become INTERNAL with a generic
message (the traceback goes to the server log only, never to the caller).

Back-off that standard clients understand: RESOURCE_EXHAUSTED and UNAVAILABLE also carry the
trailer ``grpc-retry-pushback-ms`` (gRPC's retry policy waits exactly that long before its
next attempt; gRFC A6). The delay is the exception's ``retry_after`` when it has one (a quota
knows when the request will fit), else a default per code. When retrying the same request
can never succeed (``retry_after`` infinite: a storage cap, a request larger than the
caller's bucket), or the wait is longer than the call's remaining deadline, the pushback is
``-1``: the client's retry policy gives up at once and the caller sees RESOURCE_EXHAUSTED
with the server's message instead of a DEADLINE_EXCEEDED after waiting in vain. The REST
binding sends the same delay as ``Retry-After`` (``MappedError.retry_after``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from qveil import errors as e

__all__ = [
    "DETAILS_KEY",
    "PUSHBACK_KEY",
    "ERROR_DOMAIN",
    "STATUS_TABLE",
    "MappedError",
    "bad_argument",
    "status_for",
]

DETAILS_KEY = "grpc-status-details-bin"
#: gRPC's server pushback trailer: milliseconds before the next attempt, negative: do not retry
PUSHBACK_KEY = "grpc-retry-pushback-ms"
ERROR_DOMAIN = "qveil"

#: Domain exception -> (gRPC code, default ErrorInfo reason). First match wins, so subclasses
#: come before their bases (BudgetExceeded before FailedPrecondition).
STATUS_TABLE: tuple[tuple[type[BaseException], grpc.StatusCode, str], ...] = (
    (e.BudgetExceeded, grpc.StatusCode.FAILED_PRECONDITION, "BUDGET_EXCEEDED"),
    (e.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
    (e.NotFound, grpc.StatusCode.NOT_FOUND, "NOT_FOUND"),
    (e.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION"),
    (e.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED"),
    (e.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"),
    (e.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED"),
    (e.Unavailable, grpc.StatusCode.UNAVAILABLE, "UNAVAILABLE"),
    (e.IntegrityError, grpc.StatusCode.DATA_LOSS, "INTEGRITY_FAILURE"),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"),
    (NotImplementedError, grpc.StatusCode.UNIMPLEMENTED, "UNIMPLEMENTED"),
)

_RETRY_AFTER = {grpc.StatusCode.RESOURCE_EXHAUSTED: 0.1, grpc.StatusCode.UNAVAILABLE: 0.5}


def bad_argument(message: str, *, field: str, reason: str) -> e.InvalidArgument:
    """An InvalidArgument naming the request field and a machine-readable reason."""
    exc = e.InvalidArgument(message)
    exc.field = field  # type: ignore[attr-defined]
    exc.reason = reason  # type: ignore[attr-defined]
    return exc


@dataclass(frozen=True, slots=True)
class MappedError:
    code: grpc.StatusCode
    message: str
    reason: str
    trailing_metadata: tuple[tuple[str, bytes | str], ...]
    #: seconds after which the same request may succeed; None: retrying does not help
    retry_after: float | None = None


def _pack(msg: object) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)  # type: ignore[arg-type]
    return a


def status_for(exc: BaseException, *, time_left: float | None = None) -> MappedError:
    """Code, message and trailers (``google.rpc.Status``; the retry pushback) for an exception
    raised by a handler. ``time_left``: seconds left before the call's deadline (None: no
    deadline), so a pushback the call cannot wait out is not sent."""
    for cls, code, default_reason in STATUS_TABLE:
        if isinstance(exc, cls):
            message = str(exc) or code.name
            reason = str(getattr(exc, "reason", None) or default_reason)
            break
    else:
        code, message, reason = grpc.StatusCode.INTERNAL, "internal server error", "INTERNAL"
    details = [_pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN))]
    field = getattr(exc, "field", None)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        details.append(
            _pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(
                            field=str(field or ""), description=message
                        )
                    ]
                )
            )
        )
    retry_after: float | None = None
    pushback: list[tuple[str, bytes | str]] = []
    if code in _RETRY_AFTER:
        hint = getattr(exc, "retry_after", None)
        retry_after = _RETRY_AFTER[code] if hint is None else float(hint)
        if math.isinf(retry_after):
            retry_after = None
        else:
            delay = duration_pb2.Duration()
            delay.FromMilliseconds(math.ceil(retry_after * 1000))
            details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
        waits = retry_after is not None and (time_left is None or retry_after < time_left)
        # a pushback of 0 ms stalls grpcio 1.85's retry until the deadline: at least 1 ms
        ms = max(1, math.ceil(retry_after * 1000)) if waits and retry_after is not None else -1
        pushback.append((PUSHBACK_KEY, str(ms)))
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=details)
    return MappedError(
        code,
        message,
        reason,
        ((DETAILS_KEY, status.SerializeToString()), *pushback),
        retry_after,
    )
