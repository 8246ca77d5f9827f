"""The REST binding's error table (qveil.server.protocol.rest.errors): each domain error's HTTP
status and JSON body, ``Retry-After`` in whole seconds only where waiting helps, and nothing of
an unexpected exception's text in the answer."""

from __future__ import annotations

import json
import math

import pytest

from qveil.errors import (
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    bad_argument,
)
from qveil.server.protocol.rest.errors import HTTP_STATUS, error_response, http_error


@pytest.mark.parametrize(
    ("exc", "status", "reason"),
    [
        (InvalidArgument("bad"), 400, "INVALID_ARGUMENT"),
        (FailedPrecondition("no"), 400, "FAILED_PRECONDITION"),
        (Unauthenticated("who"), 401, "UNAUTHENTICATED"),
        (PermissionDenied("not you"), 403, "PERMISSION_DENIED"),
        (NotFound("gone"), 404, "NOT_FOUND"),
        (TimeoutError("late"), 504, "DEADLINE_EXCEEDED"),
        (NotImplementedError("later"), 501, "UNIMPLEMENTED"),
        (IntegrityError("torn"), 500, "INTEGRITY_FAILURE"),  # DATA_LOSS has no HTTP status
    ],
)
def test_status_and_body(exc: BaseException, status: int, reason: str) -> None:
    got, body, headers = http_error(exc)
    assert (got, body, headers) == (status, {"error": str(exc), "reason": reason}, {})


def test_a_request_fields_reason_is_kept() -> None:
    exc = bad_argument("state 3 is NaN", field="states", reason="NON_FINITE_STATE")
    assert http_error(exc) == (400, {"error": "state 3 is NaN", "reason": "NON_FINITE_STATE"}, {})


def test_retry_after_in_whole_seconds_only_when_waiting_helps() -> None:
    assert http_error(ResourceExhausted("slow down", retry_after=2.1))[2] == {"Retry-After": "3"}
    assert http_error(ResourceExhausted("now", retry_after=0.0))[2] == {"Retry-After": "1"}
    status, _b, headers = http_error(ResourceExhausted("never", retry_after=math.inf))
    assert status == 429 and headers == {}
    status, _b, headers = http_error(Unavailable("starting"))
    assert status == 503 and int(headers["Retry-After"]) >= 1


def test_an_unexpected_exception_says_nothing_of_itself() -> None:
    status, body, headers = http_error(KeyError("secret key material"))
    assert status == 500 and "secret" not in json.dumps(body)
    assert body == {"error": "internal server error", "reason": "INTERNAL"} and headers == {}


def test_the_table_and_the_starlette_response() -> None:
    assert HTTP_STATUS["RESOURCE_EXHAUSTED"] == 429 and HTTP_STATUS["CANCELLED"] == 499
    r = error_response(ResourceExhausted("wait", retry_after=4.0))
    assert r.status_code == 429 and r.headers["retry-after"] == "4"
    assert json.loads(r.body) == {"error": "wait", "reason": "RESOURCE_EXHAUSTED"}
    r = error_response(NotFound("x"))
    assert r.status_code == 404 and "retry-after" not in r.headers
