"""Undecodable request bodies (qveil.server.protocol.grpc.bad_body) against a real in-process
server: every checked method (unary and server-streaming, qveil's services and the v2 one)
answers INVALID_ARGUMENT naming the method, with one log line and no traceback, without
calling the servicer; a valid body is answered as before; the registration refuses generated
code it cannot wrap."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from server_helpers import Served

from qveil.server.protocol.grpc.bad_body import _CheckedServer, checked
from qveil.v1 import value_service_pb2 as value_pb

GARBAGE = b"\xff\xff\xff\xff"  # a field number 0: no protobuf message parses it


@pytest.mark.parametrize(
    ("method", "stream"),
    [
        ("/qveil.v1.ValueService/GetValues", False),
        ("/qveil.v1.AdminService/GetStats", False),
        ("/qveil.v1.AuditService/StreamNoisePoints", True),
        ("/inference.GRPCInferenceService/ModelInfer", False),
    ],
)
def test_an_undecodable_body_is_invalid_argument_with_one_log_line(
    served: Served, method: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    before = served.server.services.ctx.metrics.states_answered
    with grpc.insecure_channel(served.server.target) as ch, caplog.at_level(logging.WARNING):
        call: Any = (ch.unary_stream if stream else ch.unary_unary)(method)
        with pytest.raises(grpc.RpcError) as ei:
            out = call(GARBAGE, metadata=served.md("admin"), timeout=10)
            if stream:
                list(out)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert ei.value.details() == (  # type: ignore[attr-defined]
        f"request body is not a valid message for {method} (DecodeError)"
    )
    lines = [r for r in caplog.records if r.name == "qveil.server"]
    assert [r.getMessage() for r in lines] == [
        f"{method}: undecodable request body (DecodeError): INVALID_ARGUMENT"
    ]
    assert lines[0].exc_info is None
    assert served.server.services.ctx.metrics.states_answered == before


def test_a_valid_body_is_answered(served: Served) -> None:
    with grpc.insecure_channel(served.server.target) as ch:
        call = ch.unary_unary("/qveil.v1.ValueService/GetValues")
        raw = call(
            value_pb.GetValuesRequest(states=[0.5]).SerializeToString(),
            metadata=served.md("query"),
            timeout=10,
        )
    assert len(value_pb.GetValuesResponse.FromString(raw).values) == 3


def test_handlers_it_cannot_check_are_left_as_they_are() -> None:
    def stream_in(it: object, ctx: object) -> None:
        raise AssertionError

    def plain(req: object, ctx: object) -> None:
        raise AssertionError

    h = grpc.stream_unary_rpc_method_handler(stream_in, request_deserializer=bytes)
    assert checked(h, "/s/M") is h
    no_parser = grpc.unary_unary_rpc_method_handler(plain)
    assert checked(no_parser, "/s/M") is no_parser
    sync_stream = grpc.unary_stream_rpc_method_handler(plain, request_deserializer=bytes)
    assert checked(sync_stream, "/s/M") is sync_stream  # not an async generator


def test_generic_handlers_without_their_methods_are_refused() -> None:
    async def main() -> None:
        proxy = _CheckedServer(grpc.aio.server())
        proxy.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("s.S", {})])
        with pytest.raises(RuntimeError, match="regenerate the stubs"):
            proxy.done()

    asyncio.run(main())
