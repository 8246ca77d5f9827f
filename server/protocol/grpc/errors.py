"""The gRPC transport's one error table: a domain exception (classified once by
``qveil.errors.error_status``) -> gRPC status code, message and the ``google.rpc.Status``
details sent with it.

Servicers never choose codes themselves: they call :func:`status_for` on whatever the data
plane raised. The client's exception tree (``qveil.client.errors``) mirrors this table.

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
with the server's message instead of a DEADLINE_EXCEEDED after waiting in vain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from qveil.errors import RETRY_CODES, error_status

__all__ = ["DETAILS_KEY", "ERROR_DOMAIN", "PUSHBACK_KEY", "MappedError", "status_for"]

DETAILS_KEY = "grpc-status-details-bin"
#: gRPC's server pushback trailer: milliseconds before the next attempt, negative: do not retry
PUSHBACK_KEY = "grpc-retry-pushback-ms"
ERROR_DOMAIN = "qveil"


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
