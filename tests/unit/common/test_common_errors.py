"""The gRPC error table as the client reads it back: every row of the server's table comes
back as the typed exception of its code (and of its domain class), bad-argument details reach
the client, an unexpected error is INTERNAL without its text, and a call a stopping server
cancelled is UNAVAILABLE and retried."""

from __future__ import annotations

import grpc
import pytest

from qveil import errors as domain
from qveil.common import errors as cerr
from qveil.common.errors import status_for
from qveil.errors import CODE_TABLE, bad_argument


class _FakeCall(grpc.RpcError):
    """A failed call as grpc surfaces it (code, details, trailers) for from_grpc_error."""

    def __init__(self, mapped: object) -> None:
        self.m = mapped

    def code(self) -> grpc.StatusCode:
        return self.m.code  # type: ignore[attr-defined,no-any-return]

    def details(self) -> str:
        return self.m.message  # type: ignore[attr-defined,no-any-return]

    def trailing_metadata(self) -> object:
        return self.m.trailing_metadata  # type: ignore[attr-defined]


@pytest.mark.parametrize("dom_cls,code_name,_reason", CODE_TABLE)
def test_client_tree_mirrors_server_table(dom_cls: type, code_name: str, _reason: str) -> None:
    """Every row of the server's one table comes back to the client as the typed exception
    for that code, which is also an instance of the domain exception of the row."""
    if dom_cls is domain.BudgetExceeded:
        exc: BaseException = dom_cls(dataset_id="d", spent=(1, 0), requested=(1, 0), cap=(1, 0))
    else:
        exc = dom_cls("boom")
    mapped = status_for(exc)
    code = grpc.StatusCode[code_name]
    assert mapped.code == code
    back = cerr.from_grpc_error(_FakeCall(mapped))
    assert isinstance(back, cerr.BY_CODE[code])
    if issubclass(dom_cls, domain.QveilError):
        base = dom_cls if dom_cls is not domain.BudgetExceeded else domain.FailedPrecondition
        assert isinstance(back, base)
    assert back.reason


def test_bad_argument_details_reach_client() -> None:
    mapped = status_for(
        bad_argument(
            "state nan at index 2 is not finite", field="states[2]", reason="STATE_NOT_FINITE"
        )
    )
    back = cerr.from_grpc_error(_FakeCall(mapped))
    assert isinstance(back, cerr.InvalidArgumentError) and isinstance(back, ValueError)
    assert back.reason == "STATE_NOT_FINITE"
    assert back.violations[0].field == "states[2]"


def test_unexpected_exception_is_internal_without_leaking() -> None:
    mapped = status_for(KeyError("secret weights W0"))
    assert mapped.code == grpc.StatusCode.INTERNAL and "secret" not in mapped.message


def test_server_cancelled_call_is_unavailable_and_retryable() -> None:
    """grpc-core resets calls that reached a stopping server before any handler took them
    (grpc/grpc#41785): the client sees CANCELLED though it cancelled nothing. The SDK reports
    that as UnavailableError (code kept, reason SERVER_CANCELLED) and retries it."""
    from types import SimpleNamespace

    call = _FakeCall(
        SimpleNamespace(code=grpc.StatusCode.CANCELLED, message="", trailing_metadata=())
    )
    back = cerr.from_grpc_error(call)
    assert isinstance(back, cerr.UnavailableError) and isinstance(back, domain.Unavailable)
    assert back.code == grpc.StatusCode.CANCELLED and back.reason == "SERVER_CANCELLED"
    assert cerr.is_retryable(call)
    assert not cerr.is_retryable(
        _FakeCall(SimpleNamespace(code=grpc.StatusCode.INTERNAL, message="", trailing_metadata=()))
    )
