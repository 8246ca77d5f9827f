"""The Open Inference Protocol's REST/JSON binding: the routes of a Starlette app, each one
call of the data plane (served by ``qveil.server.protocol.rest.server``).

    GET  /v2/health/live            200 {"live": true}
    GET  /v2/health/ready           200 {"ready": true}, 503 while starting or draining
    GET  /v2                        server metadata                     (token)
    GET  /v2/models/qveil[/versions/V]          model metadata          (token)
    GET  /v2/models/qveil[/versions/V]/ready    200 ready, 503 not
    POST /v2/models/qveil[/versions/V]/infer    inference               (token)

Every call that needs a token goes through the data plane exactly like a gRPC call (the
``Authorization: Bearer`` header as the credential, the client's address as the peer: the
same roles, in-flight and per-caller bounds, state budget and thread pool).
Errors are mapped to HTTP directly by the REST error table
(``qveil.server.protocol.rest.errors``): ``{"error": message, "reason": REASON}``, 400 for
bad input, 401, 403, 404, 429 and 503 with ``Retry-After`` when waiting helps. The body is
read up to ``--max-message-bytes`` (413 beyond, nothing stored) and decoded once
(``qveil.server.protocol.rest.v2_codec``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from qveil.server.protocol.dataplane import CallContext, DataPlane
from qveil.server.protocol.rest.errors import error_response
from qveil.server.protocol.rest.v2_codec import V2Body, parse_body, render
from qveil.server.protocol.v2_model import InferRequest

if TYPE_CHECKING:  # starlette loads only when the REST endpoint is served (--http-port)
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["HEADER_LENGTH", "build_app", "call_context"]

HEADER_LENGTH = "inference-header-content-length"


def call_context(request: Request) -> CallContext:
    """The data plane's view of an HTTP request: the client's address in gRPC's peer form
    (so a host has ONE state budget over both bindings) and its Authorization header."""
    client = request.client
    if client is None:
        peer = "http:unknown"
    elif ":" in client.host:
        peer = f"ipv6:[{client.host}]:{client.port}"
    else:
        peer = f"ipv4:{client.host}:{client.port}"
    return CallContext(
        peer=peer, authorization=request.headers.get("authorization"), protocol="rest"
    )


async def read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it is larger than ``limit`` bytes (by its declared length,
    before anything is read, or while it streams in)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> Response:
    # starlette loads only when the REST endpoint is served (--http-port)
    from starlette.responses import JSONResponse

    return JSONResponse(
        {
            "error": f"request body exceeds the limit of {limit} bytes (--max-message-bytes); "
            "nothing was stored",
            "reason": "BODY_TOO_LARGE",
        },
        status_code=413,
    )


def build_app(plane: DataPlane, serving: Callable[[], bool], *, max_body_bytes: int) -> Starlette:
    """The Starlette app (routes above) over ``plane``."""
    # starlette loads only when the REST endpoint is served (--http-port)
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def ready() -> bool:
        return bool(plane.ready and serving())

    def mapped(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:  # noqa: BLE001 - every error goes through the one table
                return error_response(exc)

        return run

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def health_ready(request: Request) -> Response:
        ok = ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    def _model(request: Request) -> tuple[str, str]:
        return request.path_params["model"], request.path_params.get("version", "")

    async def model_ready(request: Request) -> Response:
        name, version = _model(request)
        ok = ready() and plane.model_ready(name, version)
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    async def server_metadata(request: Request) -> Response:
        return JSONResponse(await plane.server_metadata(call_context(request)))

    async def model_metadata(request: Request) -> Response:
        name, version = _model(request)
        return JSONResponse(await plane.model_metadata(call_context(request), name, version))

    async def infer(request: Request) -> Response:
        name, version = _model(request)
        body = await read_body(request, max_body_bytes)
        if body is None:
            return _too_large(max_body_bytes)
        hlen = request.headers.get(HEADER_LENGTH)
        decoded: list[V2Body] = []

        def decode() -> InferRequest:
            decoded.append(parse_body(body, hlen, model_name=name, version=version))
            return decoded[0].request

        resp = await plane.infer(call_context(request), decode)
        content, headers = render(resp, decoded[0])
        media = headers.pop("content-type")
        return Response(content, media_type=media, headers=headers or None)

    m = "/v2/models/{model}"
    v = "/v2/models/{model}/versions/{version}"
    routes = [
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", health_ready, methods=["GET"]),
        Route("/v2", mapped(server_metadata), methods=["GET"]),
        Route("/v2/", mapped(server_metadata), methods=["GET"]),  # the same, no redirect
        Route(m, mapped(model_metadata), methods=["GET"]),
        Route(v, mapped(model_metadata), methods=["GET"]),
        Route(m + "/ready", model_ready, methods=["GET"]),
        Route(v + "/ready", model_ready, methods=["GET"]),
        Route(m + "/infer", mapped(infer), methods=["POST"]),
        Route(v + "/infer", mapped(infer), methods=["POST"]),
    ]

    async def not_routed(request: Request, exc: Exception) -> Response:
        """404 and 405 as the protocol's JSON error object, like every other error."""
        status = int(getattr(exc, "status_code", 404))
        what = "no such endpoint" if status == 404 else "method not allowed on this endpoint"
        return JSONResponse(
            {"error": f"{what}: {request.method} {request.url.path[:80]}"}, status_code=status
        )

    return Starlette(routes=routes, exception_handlers={404: not_routed, 405: not_routed})
