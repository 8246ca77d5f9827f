"""A request body that does not parse is the caller's error: INVALID_ARGUMENT.

grpcio's own handling of an undecodable request logs a traceback per request and answers
INTERNAL (or UNKNOWN). :func:`checked_server` wraps each method's deserializer once, when the
services are registered: a body that fails to parse becomes a marker, and the method answers
INVALID_ARGUMENT ("request body is not a valid <message>") with ONE log line (no traceback)
instead of calling the servicer. Nothing is stored. It covers qveil's own services and the v2
``inference.GRPCInferenceService``; grpc.health and reflection keep their own handling.

The wrapping happens at registration, not per call (a grpc.aio server interceptor runs a
coroutine and builds a handler for every call): a call of a checked method costs one
``isinstance`` more than the bare method.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar, cast  # Any: AioMethodHandler

import grpc

__all__ = ["checked", "checked_server"]

log = logging.getLogger("qveil.server")

# A request is any service's message (object).
Servicer = TypeVar("Servicer")
#: A grpc.aio method handler: a grpc.RpcMethodHandler named tuple of coroutine behaviours.
AioMethodHandler: TypeAlias = Any  # types-grpcio types sync handlers only, and no _replace


class _Corrupt:
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def _safe(deserialize: Callable[[bytes], object]) -> Callable[[bytes], object]:
    def parse(data: bytes) -> object:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - any parse failure is a bad body
            return _Corrupt(type(exc).__name__)

    return parse


def checked(handler: AioMethodHandler, method: str) -> AioMethodHandler:
    """``handler`` (a grpc.RpcMethodHandler of ``method``, ``/package.Service/Method``) with
    an undecodable body answered INVALID_ARGUMENT; a request-streaming handler, or one
    without a deserializer, is returned as it is."""
    if handler.request_streaming or handler.request_deserializer is None:
        return handler

    async def refuse(request: _Corrupt, context: grpc.aio.ServicerContext[object, object]) -> None:
        log.warning("%s: undecodable request body (%s): INVALID_ARGUMENT", method, request.error)
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request body is not a valid message for {method} ({request.error})",
        )

    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(
            request: object, context: grpc.aio.ServicerContext[object, object]
        ) -> object:
            if request.__class__ is _Corrupt:
                await refuse(request, context)
            return await inner_uu(request, context)

        return handler._replace(
            request_deserializer=_safe(handler.request_deserializer), unary_unary=unary_unary
        )
    if handler.unary_stream is not None and inspect.isasyncgenfunction(handler.unary_stream):
        inner_us = handler.unary_stream

        async def unary_stream(
            request: object, context: grpc.aio.ServicerContext[object, object]
        ) -> AsyncIterator[object]:
            if request.__class__ is _Corrupt:
                await refuse(request, context)
                return
            async for item in inner_us(request, context):
                yield item

        return handler._replace(
            request_deserializer=_safe(handler.request_deserializer), unary_stream=unary_stream
        )
    return handler


class _CheckedServer:
    """What a generated ``add_<Service>Servicer_to_server`` is given instead of the server:
    it registers the service's method handlers (generic and registered, as the generated
    code does) each wrapped once by :func:`checked`."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server
        self._generic = 0

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        # the generated code passes the same methods to add_registered_method_handlers next;
        # they are registered, wrapped, there
        self._generic += len(handlers)

    def add_registered_method_handlers(
        self,
        service: str,
        methods: Mapping[str, AioMethodHandler],
    ) -> None:
        wrapped = {name: checked(h, f"/{service}/{name}") for name, h in methods.items()}
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, wrapped),)
        )
        self._server.add_registered_method_handlers(service, wrapped)
        self._generic -= 1

    def done(self) -> None:
        if self._generic:
            raise RuntimeError(
                "generated gRPC code registered generic handlers without their methods: "
                "the undecodable-body check cannot wrap them (regenerate the stubs)"
            )


def checked_server(
    server: grpc.aio.Server,
    add: Callable[[Servicer, grpc.aio.Server], None],
    servicer: Servicer,
) -> None:
    """``add(servicer, server)`` (a generated ``add_<Service>Servicer_to_server``) with every
    method of the service checked for undecodable bodies (:func:`checked`)."""
    proxy = _CheckedServer(server)
    # the generated function calls only the two registration methods the proxy has
    add(servicer, cast(grpc.aio.Server, proxy))
    proxy.done()
