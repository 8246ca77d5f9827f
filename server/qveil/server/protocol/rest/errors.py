"""The REST transport's one error table: a domain exception (classified once by
``qveil.errors.error_status``) -> HTTP status and the JSON error body (the gRPC table is
``qveil.common.errors.status_for``, shared with the SDK that reads it back).

The body is ``{"error": message, "reason": REASON}``; 429 and 503 carry ``Retry-After``
(whole seconds, rounded up) when waiting helps, so standard HTTP clients (curl --retry,
urllib3's Retry) back off; no ``Retry-After`` when retrying the same request never helps (a
request larger than the caller's whole budget).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from qveil.errors import error_status

if TYPE_CHECKING:  # starlette loads only when the REST endpoint is served (--http-port)
    from starlette.responses import Response

__all__ = ["HTTP_STATUS", "error_response", "http_error"]

#: canonical code -> HTTP status (anything else: 500)
HTTP_STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "OUT_OF_RANGE": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "RESOURCE_EXHAUSTED": 429,
    "CANCELLED": 499,
    "UNIMPLEMENTED": 501,
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
}


def http_error(exc: BaseException) -> tuple[int, dict[str, str], dict[str, str]]:
    """(HTTP status, JSON body, headers) of an exception raised by the data plane."""
    st = error_status(exc)
    body = {"error": st.message, **({"reason": st.reason} if st.reason else {})}
    headers = {}
    if st.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(st.retry_after)))
    return HTTP_STATUS.get(st.code, 500), body, headers


def error_response(exc: BaseException) -> Response:
    """The Starlette response of :func:`http_error`."""
    # starlette loads only when the REST endpoint is served (--http-port)
    from starlette.responses import JSONResponse

    status, body, headers = http_error(exc)
    return JSONResponse(body, status_code=status, headers=headers or None)
