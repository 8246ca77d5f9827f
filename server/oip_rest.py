"""The Open Inference Protocol's REST/JSON binding (issue 17): a Starlette app on uvicorn, in
the server's process and event loop (``qveil serve --http-port P``; off by default).

    GET  /v2/health/live            200 {"live": true}
    GET  /v2/health/ready           200 {"ready": true}, 503 while starting or draining
    GET  /v2                        server metadata                     (token)
    GET  /v2/models/qveil[/versions/V]          model metadata          (token)
    GET  /v2/models/qveil[/versions/V]/ready    200 ready, 503 not
    POST /v2/models/qveil[/versions/V]/infer    inference               (token)

Every call that needs a token goes through ``Core.unary`` exactly like a gRPC call (the
``Authorization: Bearer`` header read as the ``authorization`` metadata, the same roles,
in-flight and per-caller bounds, thread pool and error table), into the same
:class:`qveil.server.oip.OIPModel`. Errors are ``{"error": message, "reason": REASON}`` with the
HTTP status of the gRPC code (INVALID_ARGUMENT 400, UNAUTHENTICATED 401, ...); 429 and 503
carry ``Retry-After`` when waiting helps (the delay of the gRPC status's RetryInfo). Tensors come
as JSON ``data`` or with Triton's binary-data extension (``Inference-Header-Content-Length``
header, ``binary_data_size`` per input), which tritonclient.http uses by default; outputs are
binary when asked (``binary_data`` / ``binary_data_output``). TLS: the server's --tls-*
files; without TLS it binds 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from google.rpc import error_details_pb2, status_pb2

from qveil.server.errors import DETAILS_KEY, bad_argument
from qveil.server.oip import (
    DTYPES,
    MODEL_NAME,
    SERVER_NAME,
    InferRequest,
    InferResponse,
    OIPModel,
    Tensor,
    decode_raw,
)
from qveil.server.servicers import VALUE, Core

__all__ = ["RestServer", "build_app", "start_rest"]

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
HEADER_LENGTH = "inference-header-content-length"


class RestAbort(Exception):
    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str = "",
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason
        self.retry_after = retry_after


class _Context:
    """What ``Core.unary`` reads from a gRPC context, for one HTTP request."""

    def __init__(self, authorization: str | None, peer: str) -> None:
        self._md = (("authorization", authorization),) if authorization else ()
        self._peer = peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> None:
        return None

    async def abort(self, code: grpc.StatusCode, message: str, trailing_metadata: Any = ()) -> None:
        reason, retry_after = "", None
        for key, value in trailing_metadata or ():
            if key == DETAILS_KEY:
                for d in status_pb2.Status.FromString(value).details:
                    info = error_details_pb2.ErrorInfo()
                    retry = error_details_pb2.RetryInfo()
                    if d.Unpack(info):
                        reason = info.reason
                    elif d.Unpack(retry):
                        retry_after = retry.retry_delay.ToTimedelta().total_seconds()
        raise RestAbort(code, message, reason, retry_after)


def _json_error(
    code: grpc.StatusCode, message: str, reason: str = "", retry_after: float | None = None
) -> Any:
    """The error body; 429 and 503 carry ``Retry-After`` (whole seconds, rounded up) when
    waiting helps, so standard HTTP clients (curl --retry, urllib3's Retry) back off."""
    from starlette.responses import JSONResponse

    body = {"error": message, **({"reason": reason} if reason else {})}
    headers = None
    if retry_after is not None:
        headers = {"Retry-After": str(max(1, math.ceil(retry_after)))}
    return JSONResponse(body, status_code=HTTP_STATUS.get(code, 500), headers=headers)


def _parse_body(body: bytes, header_length: str | None) -> InferRequest:
    """A v2 JSON inference request, with Triton's binary-data extension."""
    try:
        n = int(header_length) if header_length is not None else len(body)
        if not 0 <= n <= len(body):
            raise ValueError
        doc = json.loads(body[:n])
    except ValueError:
        raise bad_argument(
            "the body is not a v2 JSON inference request", field="body", reason="BAD_JSON"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise bad_argument('the request needs "inputs": [...]', field="inputs", reason="BAD_JSON")
    binary = memoryview(body)[n:]
    tensors = []
    for i, t in enumerate(doc["inputs"]):
        if not isinstance(t, dict):
            raise bad_argument(f"inputs[{i}] is not an object", field="inputs", reason="BAD_JSON")
        name, dtype = str(t.get("name", "")), str(t.get("datatype", ""))
        shape_raw = t.get("shape", [])
        if not isinstance(shape_raw, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in shape_raw
        ):
            raise bad_argument(
                f"inputs[{i}].shape must be a list of integers",
                field=f"inputs[{i}].shape",
                reason="WRONG_SHAPE",
            )
        shape = tuple(shape_raw)
        params = t.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if not isinstance(size, int) or size < 0 or size > len(binary):
                raise bad_argument(
                    f"inputs[{i}] binary_data_size {size!r} exceeds the body",
                    field=f"inputs[{i}]",
                    reason="WRONG_SHAPE",
                )
            tensors.append(decode_raw(name, dtype, shape, bytes(binary[:size])))
            binary = binary[size:]
            continue
        dt = DTYPES.get(dtype)
        if dt is None:
            tensors.append(decode_raw(name, dtype, shape, b""))  # words the dtype error
            continue
        flat = _flatten(t.get("data", []))
        try:
            data = np.array(flat, dtype=dt.newbyteorder("="))
            if dt.kind == "i" and any(isinstance(v, float) for v in flat):
                raise TypeError
            if dt.kind == "f" and any(
                isinstance(v, bool) or not isinstance(v, (int, float)) for v in flat
            ):
                raise TypeError
        except (TypeError, ValueError, OverflowError):
            raise bad_argument(
                f"inputs[{i}] data are not all {dtype} numbers",
                field=f"inputs[{i}].data",
                reason="WRONG_DATATYPE",
            ) from None
        tensors.append(Tensor(name, dtype, shape, data))
    outputs = doc.get("outputs") or []
    names = [str(o.get("name", "")) for o in outputs if isinstance(o, dict)]
    return InferRequest(
        inputs=tensors, id=str(doc.get("id", ""))[:256], outputs=names, model_name=MODEL_NAME
    )


def _flatten(data: Any) -> list[Any]:
    if isinstance(data, list):
        out: list[Any] = []
        for v in data:
            out.extend(_flatten(v))
        return out
    return [data]


def _wants_binary(doc_outputs: list[Any], params: dict[str, Any], name: str) -> bool:
    for o in doc_outputs:
        if isinstance(o, dict) and o.get("name") == name:
            p = o.get("parameters") or {}
            return bool(isinstance(p, dict) and p.get("binary_data"))
    return bool(params.get("binary_data_output"))


def _render(resp: InferResponse, body: bytes, header_length: str | None) -> Any:
    from starlette.responses import Response

    n = int(header_length) if header_length is not None else len(body)
    doc = json.loads(body[:n])
    params = doc.get("parameters") or {}
    doc_outputs = doc.get("outputs") or []
    outs, blobs = [], []
    for t in resp.outputs:
        flat = np.ascontiguousarray(t.data, dtype=DTYPES[t.datatype]).reshape(-1)
        o: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if _wants_binary(doc_outputs, params if isinstance(params, dict) else {}, t.name):
            raw = flat.tobytes()
            o["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            o["data"] = [float(v) for v in flat] if t.datatype == "FP64" else flat.tolist()
        outs.append(o)
    head = {"model_name": resp.model_name, "model_version": resp.model_version, "outputs": outs}
    if resp.id:
        head["id"] = resp.id
    text = json.dumps(head, allow_nan=False).encode()
    if not blobs:
        return Response(text, media_type="application/json")
    return Response(
        text + b"".join(blobs),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(text))},
    )


def build_app(core: Core, serving: Callable[[], bool], *, max_body_bytes: int) -> Any:
    """The Starlette app (routes above) over ``core``."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from qveil import __version__

    model = OIPModel(core.handlers)

    def ready() -> bool:
        return bool(core.ready and serving())

    async def call(request: Request, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        client = request.client
        # gRPC's peer form, so a host has ONE new-state budget over both bindings
        if client is None:
            peer = "http:unknown"
        elif ":" in client.host:
            peer = f"ipv6:[{client.host}]:{client.port}"
        else:
            peer = f"ipv4:{client.host}:{client.port}"
        ctx: Any = _Context(request.headers.get("authorization"), peer)
        kwargs: dict[str, Any] = (
            {"deadline": None, "caller": "local"} if method == "v2.ModelInfer" else {}
        )
        return await core.unary(VALUE, method, ctx, fn, *args, **kwargs)

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except RestAbort as exc:
                return _json_error(exc.code, exc.message, exc.reason, exc.retry_after)

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
        ok = ready() and model.ready(name, version)
        return JSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    async def server_metadata(request: Request) -> Response:
        md = await call(
            request,
            "v2.ServerMetadata",
            lambda: {"name": SERVER_NAME, "version": __version__, "extensions": []},
        )
        return JSONResponse(md)

    async def model_metadata(request: Request) -> Response:
        name, version = _model(request)
        return JSONResponse(await call(request, "v2.ModelMetadata", model.metadata, name, version))

    async def infer(request: Request) -> Response:
        name, version = _model(request)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            return JSONResponse(
                {
                    "error": f"request body of {declared} bytes exceeds the limit of "
                    f"{max_body_bytes} (--max-message-bytes); nothing was read or stored",
                    "reason": "BODY_TOO_LARGE",
                },
                status_code=413,
            )
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                return JSONResponse(
                    {
                        "error": f"request body exceeds the limit of {max_body_bytes} bytes "
                        "(--max-message-bytes); nothing was stored",
                        "reason": "BODY_TOO_LARGE",
                    },
                    status_code=413,
                )
            chunks.append(chunk)
        body = b"".join(chunks)
        hlen = request.headers.get(HEADER_LENGTH)

        def run(deadline: float | None = None, caller: str = "local") -> InferResponse:
            req = _parse_body(body, hlen)
            req = InferRequest(
                inputs=req.inputs,
                model_name=name,
                model_version=version,
                id=req.id,
                outputs=req.outputs,
            )
            return model.infer(req, deadline=deadline, caller=caller)

        resp = await call(request, "v2.ModelInfer", run)
        return _render(resp, body, hlen)

    m = "/v2/models/{model}"
    v = "/v2/models/{model}/versions/{version}"
    routes = [
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", health_ready, methods=["GET"]),
        Route("/v2", guarded(server_metadata), methods=["GET"]),
        Route(m, guarded(model_metadata), methods=["GET"]),
        Route(v, guarded(model_metadata), methods=["GET"]),
        Route(m + "/ready", model_ready, methods=["GET"]),
        Route(v + "/ready", model_ready, methods=["GET"]),
        Route(m + "/infer", guarded(infer), methods=["POST"]),
        Route(v + "/infer", guarded(infer), methods=["POST"]),
    ]
    return Starlette(routes=routes)


@dataclass
class RestServer:
    """uvicorn serving the app on an already bound socket, inside the running event loop."""

    server: Any
    sock: socket.socket
    task: asyncio.Task[None]
    port: int

    async def stop(self, grace: float) -> None:
        self.server.config.timeout_graceful_shutdown = max(0.0, grace)
        self.server.should_exit = True
        await self.task
        await self.server.shutdown(sockets=[self.sock])


async def start_rest(
    core: Core,
    serving: Callable[[], bool],
    *,
    host: str,
    port: int,
    tls: Any = None,
    max_body_bytes: int = 4 * 1024 * 1024,
) -> RestServer:
    """Bind ``host:port`` (0: any free port) and serve the v2 REST app on it (TLS from the
    server's ``TLSFiles``; mutual TLS when it has a client CA)."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when
    # the socket says it is TCP; without it every response waited ~40 ms (Nagle against the
    # client's delayed ACK: uvicorn writes headers and body separately), 48 ms per call
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        from qveil.errors import InvalidArgument, PortInUse

        if exc.errno == errno.EADDRINUSE:
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise PortInUse(
                f"port {where} is already in use (another qveil serve?); choose another "
                "--http-port or stop the other server"
            ) from None
        raise InvalidArgument(f"cannot bind the v2 REST port {host}:{port}: {exc}") from None
    sock.listen(128)
    sock.setblocking(False)
    kw: dict[str, Any] = {}
    if tls is not None:
        kw = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
        if tls.client_ca is not None:
            kw |= {"ssl_ca_certs": str(tls.client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    config = uvicorn.Config(
        build_app(core, serving, max_body_bytes=max_body_bytes),
        lifespan="off",
        log_level="warning",
        access_log=False,
        **kw,
    )
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])
    task = asyncio.ensure_future(server.main_loop())
    return RestServer(server, sock, task, int(sock.getsockname()[1]))
