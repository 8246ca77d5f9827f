"""A request body that does not parse is the caller's error: INVALID_ARGUMENT.

grpcio's own handling of an undecodable request logs a traceback per request and answers
INTERNAL (or UNKNOWN). This interceptor wraps each method's deserializer: a body that fails
to parse becomes a marker, and the method answers INVALID_ARGUMENT ("request body is not a
valid <message>") with ONE log line (no traceback) instead of calling the servicer. Nothing
is stored. It covers qveil's own services and the v2 ``inference.GRPCInferenceService``;
grpc.health and reflection keep their own handling.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

__all__ = ["BadBodyInterceptor"]

#: method prefixes whose bodies this interceptor checks
CHECKED = ("/qveil.", "/inference.")

log = logging.getLogger("qveil.server")


class _Corrupt:
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _safe(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is a bad body
            return _Corrupt(type(exc).__name__)

    return parse


class BadBodyInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc: no stubs
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler: Any = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if (
            handler is None
            or not method.startswith(CHECKED)  # grpc.health, reflection: their own code
            or handler.request_streaming
            or handler.request_deserializer is None
        ):
            return handler

        async def refuse(request: _Corrupt, context: grpc.aio.ServicerContext) -> None:
            log.warning(
                "%s: undecodable request body (%s): INVALID_ARGUMENT", method, request.error
            )
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request body is not a valid message for {method} ({request.error})",
            )

        if handler.unary_unary is not None:
            inner_uu = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Corrupt):
                    await refuse(request, context)
                return await inner_uu(request, context)

            return handler._replace(
                request_deserializer=_safe(handler.request_deserializer), unary_unary=unary_unary
            )
        if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
            inner_us = handler.unary_stream

            async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Corrupt):
                    await refuse(request, context)
                    return
                async for item in inner_us(request, context):
                    yield item

            return handler._replace(
                request_deserializer=_safe(handler.request_deserializer), unary_stream=unary_stream
            )
        return handler
