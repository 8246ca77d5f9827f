"""The errors on the wire: a domain exception as a gRPC status with ``google.rpc.Status``
details (the server's side, :func:`status_for`), and a failed call as a typed exception (the
client's side, :func:`from_grpc_error`). One module for both directions, so they cannot drift.

The server's table: ``qveil.errors.error_status`` gives each domain exception its canonical
code; ``grpc.StatusCode[code]`` is its gRPC status. Details attached (trailer
``grpc-status-details-bin``, the grpcio-status convention): ``google.rpc.ErrorInfo`` (domain
``qveil``, a ``reason`` such as ``STATE_NOT_FINITE``), ``google.rpc.BadRequest`` with the
offending field for INVALID_ARGUMENT, ``RetryInfo`` for RESOURCE_EXHAUSTED and UNAVAILABLE.
Unexpected exceptions become INTERNAL with a generic message (the traceback goes to the
server log only, never to the caller).

Back-off that standard clients understand: RESOURCE_EXHAUSTED and UNAVAILABLE also carry the
trailer ``grpc-retry-pushback-ms`` (gRPC's retry policy waits exactly that long before its
next attempt; gRFC A6). The delay is the exception's ``retry_after`` when it has one (a quota
knows when the request will fit), else a default per code. When retrying the same request
can never succeed (``retry_after`` infinite: a request larger than the caller's bucket), or
the wait is longer than the call's remaining deadline, the pushback is ``-1``: the client's
retry policy gives up at once and the caller sees RESOURCE_EXHAUSTED with the server's
message instead of a DEADLINE_EXCEEDED after waiting in vain.

The client's typed exceptions, one per gRPC status code the server uses; each derives from the
same ``qveil.errors`` domain exception the server mapped to that code, so callers can catch
either the transport-specific class or the domain one::

    RpcError (qveil.errors.QveilError)
    ├── InvalidArgumentError      INVALID_ARGUMENT      (qveil.errors.InvalidArgument)
    ├── NotFoundError             NOT_FOUND             (qveil.errors.NotFound)
    ├── FailedPreconditionError   FAILED_PRECONDITION   (qveil.errors.FailedPrecondition)
    ├── PermissionDeniedError     PERMISSION_DENIED     (qveil.errors.PermissionDenied)
    ├── UnauthenticatedError      UNAUTHENTICATED       (qveil.errors.Unauthenticated)
    ├── ResourceExhaustedError    RESOURCE_EXHAUSTED    (qveil.errors.ResourceExhausted)
    ├── UnavailableError          UNAVAILABLE           (qveil.errors.Unavailable)
    ├── DataLossError             DATA_LOSS             (qveil.errors.IntegrityError)
    ├── DeadlineExceededError     DEADLINE_EXCEEDED
    ├── UnimplementedError        UNIMPLEMENTED
    └── ServerError               INTERNAL, UNKNOWN and anything else

The server attaches a ``google.rpc.Status`` (trailer ``grpc-status-details-bin``) with an
``ErrorInfo`` (``reason``, e.g. ``STATE_NOT_FINITE``) and, for bad input, a ``BadRequest``
naming the offending field; both are exposed as attributes. RESOURCE_EXHAUSTED and
UNAVAILABLE carry a ``RetryInfo`` (``retry_delay``) when waiting helps, and none when
retrying the same request never does (a request larger than the caller's whole budget). By
the time the SDK raises one, its channel has already retried as the server's pushback said
(see :class:`qveil.client.RetryPolicy`): the attempts or the call's deadline ran out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from qveil import errors as domain
from qveil.errors import RETRY_CODES, error_status

__all__ = [
    "DETAILS_KEY",
    "ERROR_DOMAIN",
    "PUSHBACK_KEY",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "FieldViolation",
    "InvalidArgumentError",
    "MappedError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "RpcError",
    "ServerError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "from_grpc_error",
    "is_retryable",
    "is_server_reset",
    "status_for",
]

DETAILS_KEY = "grpc-status-details-bin"
#: gRPC's server pushback trailer: milliseconds before the next attempt, negative: do not retry
PUSHBACK_KEY = "grpc-retry-pushback-ms"
ERROR_DOMAIN = "qveil"


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One bad field of a request (from ``google.rpc.BadRequest``)."""

    field: str
    description: str


class RpcError(domain.QveilError):
    """A call failed with a non-OK gRPC status.

    Attributes: ``code`` (grpc.StatusCode), ``message`` (the server's text), ``reason`` and
    ``metadata`` (from ``google.rpc.ErrorInfo``; "" and {} when absent), ``violations`` (tuple of
    :class:`FieldViolation`), ``retry_delay`` (seconds from ``google.rpc.RetryInfo`` or None).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        reason: str = "",
        metadata: dict[str, str] | None = None,
        violations: tuple[FieldViolation, ...] = (),
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.violations = violations
        self.retry_delay = retry_delay

    def __str__(self) -> str:
        tag = f"{self.code.name}" + (f"/{self.reason}" if self.reason else "")
        return f"{self.message} [{tag}]"


class InvalidArgumentError(RpcError, domain.InvalidArgument):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(RpcError, domain.NotFound):
    code = grpc.StatusCode.NOT_FOUND


class FailedPreconditionError(RpcError, domain.FailedPrecondition):
    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDeniedError(RpcError, domain.PermissionDenied):
    code = grpc.StatusCode.PERMISSION_DENIED


class UnauthenticatedError(RpcError, domain.Unauthenticated):
    code = grpc.StatusCode.UNAUTHENTICATED


class ResourceExhaustedError(RpcError, domain.ResourceExhausted):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(RpcError, domain.Unavailable):
    code = grpc.StatusCode.UNAVAILABLE


class DataLossError(RpcError, domain.IntegrityError):
    code = grpc.StatusCode.DATA_LOSS


class DeadlineExceededError(RpcError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class UnimplementedError(RpcError):
    code = grpc.StatusCode.UNIMPLEMENTED


class ServerError(RpcError):
    code = grpc.StatusCode.INTERNAL


BY_CODE: dict[grpc.StatusCode, type[RpcError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        FailedPreconditionError,
        PermissionDeniedError,
        UnauthenticatedError,
        ResourceExhaustedError,
        UnavailableError,
        DataLossError,
        DeadlineExceededError,
        UnimplementedError,
    )
}


def _details(trailing: object) -> status_pb2.Status | None:
    for key, value in trailing or ():  # type: ignore[attr-defined]
        if key == DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status()
            try:
                status.ParseFromString(value)
            except Exception:  # noqa: BLE001 - a malformed trailer is ignored, not fatal
                return None
            return status
    return None


#: Raised by the server's transport, never by this SDK (it cancels no call it made): a call
#: that reached a server which was shutting down before any handler took it (grpc/grpc#41785).
#: Nothing was processed, so it is UNAVAILABLE in all but name, and as safe to retry.
SERVER_CANCELLED = (
    "the server cancelled the call before answering it (it was shutting down); "
    "safe to retry, on another replica"
)


def is_retryable(exc: grpc.RpcError) -> bool:
    """UNAVAILABLE, or CANCELLED by the server: both mean "not answered, try again"."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


def is_server_reset(exc: grpc.RpcError) -> bool:
    """CANCELLED by the server (see :data:`SERVER_CANCELLED`): the one retryable status the
    channel's retry policy leaves to the SDK (it retries RESOURCE_EXHAUSTED and UNAVAILABLE)."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    return bool(code == grpc.StatusCode.CANCELLED)


def from_grpc_error(exc: grpc.RpcError) -> RpcError:
    """The typed exception for a failed call (works for sync and aio errors).

    CANCELLED becomes :class:`UnavailableError` (its ``code`` stays CANCELLED): this SDK
    never cancels its own calls, so a CANCELLED status comes from a server that reset the
    call while shutting down, before any handler ran (see :data:`SERVER_CANCELLED`)."""
    code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
    message = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
    if code == grpc.StatusCode.CANCELLED:
        return UnavailableError(
            f"{SERVER_CANCELLED} ({message or code.name})", code=code, reason="SERVER_CANCELLED"
        )
    trailing = exc.trailing_metadata() if callable(getattr(exc, "trailing_metadata", None)) else ()
    reason, metadata, violations, retry = "", {}, [], None
    status = _details(trailing)
    if status is not None:
        for any_msg in status.details:
            if any_msg.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                any_msg.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif any_msg.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                any_msg.Unpack(bad)
                violations += [FieldViolation(v.field, v.description) for v in bad.field_violations]
            elif any_msg.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info_r = error_details_pb2.RetryInfo()
                any_msg.Unpack(info_r)
                retry = info_r.retry_delay.ToTimedelta().total_seconds()
    cls = BY_CODE.get(code, ServerError)
    return cls(
        message or code.name,
        code=code,
        reason=reason,
        metadata=metadata,
        violations=tuple(violations),
        retry_delay=retry,
    )


# ---------------------------------------------------------------- the server side
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
    raised by the data plane. ``time_left``: seconds left before the call's deadline (None: no
    deadline), so a pushback the call cannot wait out is not sent."""
    st = error_status(exc)
    code = grpc.StatusCode[st.code]
    details = [_pack(error_details_pb2.ErrorInfo(reason=st.reason, domain=ERROR_DOMAIN))]
    if st.code == "INVALID_ARGUMENT":
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=st.field, description=st.message
        )
        details.append(_pack(error_details_pb2.BadRequest(field_violations=[violation])))
    pushback: list[tuple[str, bytes | str]] = []
    if st.code in RETRY_CODES:
        wait = st.retry_after
        if wait is not None:
            delay = duration_pb2.Duration()
            delay.FromMilliseconds(math.ceil(wait * 1000))
            details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
        waits = wait is not None and (time_left is None or wait < time_left)
        # a pushback of 0 ms stalls grpcio 1.85's retry until the deadline: at least 1 ms
        ms = max(1, math.ceil(wait * 1000)) if waits and wait is not None else -1
        pushback.append((PUSHBACK_KEY, str(ms)))
    status = status_pb2.Status(code=getattr(code_pb2, st.code), message=st.message, details=details)
    return MappedError(
        code,
        st.message,
        st.reason,
        ((DETAILS_KEY, status.SerializeToString()), *pushback),
        st.retry_after,
    )
