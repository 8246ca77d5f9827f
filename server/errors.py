"""The ONE table mapping qveil's domain exceptions to gRPC status codes, and the
``google.rpc.Status`` details sent with each error.

Servicers never choose codes themselves: they call :func:`status_for` on whatever the
handlers raised. The client's exception tree (``qveil.client.errors``) mirrors this table.

Details attached (trailer ``grpc-status-details-bin``, the grpcio-status convention):
``google.rpc.ErrorInfo`` (domain ``qveil``, a ``reason`` such as ``STATE_OUT_OF_INTERVAL``),
``google.rpc.BadRequest`` with the offending field for INVALID_ARGUMENT, ``RetryInfo`` for
RESOURCE_EXHAUSTED and UNAVAILABLE. Unexpected exceptions become INTERNAL with a generic
message (the traceback goes to the server log only, never to the caller).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from qveil import errors as e

__all__ = [
    "DETAILS_KEY",
    "ERROR_DOMAIN",
    "STATUS_TABLE",
    "MappedError",
    "bad_argument",
    "status_for",
]

DETAILS_KEY = "grpc-status-details-bin"
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
    trailing_metadata: tuple[tuple[str, bytes], ...]


def _pack(msg: object) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)  # type: ignore[arg-type]
    return a


def status_for(exc: BaseException) -> MappedError:
    """Code, message and ``google.rpc.Status`` trailer for an exception raised by a handler."""
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
    if code in _RETRY_AFTER:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(_RETRY_AFTER[code] * 1000))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=details)
    return MappedError(code, message, reason, ((DETAILS_KEY, status.SerializeToString()),))
