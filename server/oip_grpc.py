"""``inference.GRPCInferenceService`` (the Open Inference Protocol's gRPC binding, vendored in
proto/qveil/oip) on the same server and port as ValueService (issue 17).

A thin servicer like those of ``qveil.server.servicers``: decoding and inference run through
``Core.unary`` (the same authorization as ValueService, in-flight bounds, thread pool,
deadline and the one error table) into :class:`qveil.server.oip.OIPModel`, which calls the
ValueService handlers. ServerLive, ServerReady and ModelReady are probes and need no token,
like grpc.health.v1; ServerMetadata, ModelMetadata and ModelInfer need a role that may call
ValueService. RepositoryModelLoad/Unload stay UNIMPLEMENTED (one model, no repository).

Tensors are read from ``raw_input_contents`` (what tritonclient sends) or from typed
``contents`` (``fp64_contents``/``int64_contents``); the response answers in the same form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from qveil import __version__ as qveil_version
from qveil.oip import grpc_predict_v2_pb2 as pb
from qveil.oip import grpc_predict_v2_pb2_grpc as pb_grpc
from qveil.server.errors import bad_argument
from qveil.server.oip import (
    DTYPES,
    SERVER_NAME,
    InferRequest,
    InferResponse,
    OIPModel,
    Tensor,
    decode_raw,
)
from qveil.server.servicers import VALUE, Core

__all__ = [
    "SERVICE_NAME",
    "InferenceServicer",
    "add_inference_service",
    "request_from_proto",
    "response_to_proto",
]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
#: the service name whose roles the v2 calls need (the same as ValueService's)
ROLE_SERVICE = VALUE

_TYPED = {"FP64": "fp64_contents", "INT64": "int64_contents"}


def request_from_proto(req: pb.ModelInferRequest) -> InferRequest:
    """Decode a ModelInferRequest (raw or typed contents); InvalidArgument when malformed."""
    raw = list(req.raw_input_contents)
    if raw and len(raw) != len(req.inputs):
        raise bad_argument(
            f"{len(raw)} raw_input_contents for {len(req.inputs)} inputs",
            field="raw_input_contents",
            reason="WRONG_SHAPE",
        )
    tensors = []
    for i, t in enumerate(req.inputs):
        shape = tuple(int(s) for s in t.shape)
        if raw:
            if t.HasField("contents"):
                raise bad_argument(
                    f"input {t.name[:80]!r} has typed contents as well as raw_input_contents",
                    field=f"inputs[{i}].contents",
                    reason="MIXED_CONTENTS",
                )
            tensors.append(decode_raw(t.name, t.datatype, shape, raw[i]))
            continue
        dt = DTYPES.get(t.datatype)
        if dt is None:  # decode_raw words the error
            tensors.append(decode_raw(t.name, t.datatype, shape, b""))
            continue
        values = getattr(t.contents, _TYPED[t.datatype])
        tensors.append(
            Tensor(t.name, t.datatype, shape, np.fromiter(values, dtype=dt, count=len(values)))
        )
    return InferRequest(
        inputs=tensors,
        model_name=req.model_name,
        model_version=req.model_version,
        id=req.id,
        outputs=[o.name for o in req.outputs],
    )


def response_to_proto(resp: InferResponse, *, raw: bool) -> pb.ModelInferResponse:
    out = pb.ModelInferResponse(
        model_name=resp.model_name, model_version=resp.model_version, id=resp.id
    )
    for t in resp.outputs:
        o = out.outputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        flat = np.ascontiguousarray(t.data, dtype=DTYPES[t.datatype]).reshape(-1)
        if raw:
            out.raw_output_contents.append(flat.tobytes())
        else:
            getattr(o.contents, _TYPED[t.datatype]).extend(flat.tolist())
    return out


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, core: Core, serving: Callable[[], bool]) -> None:
        self.core = core
        self.model = OIPModel(core.handlers)
        self._serving = serving

    def _ready(self) -> bool:
        return bool(self.core.ready and self._serving())

    async def ServerLive(  # noqa: N802
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(  # noqa: N802
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._ready())

    async def ModelReady(  # noqa: N802
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(
            ready=self._ready() and self.model.ready(request.name, request.version)
        )

    async def ServerMetadata(  # noqa: N802
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        def meta() -> pb.ServerMetadataResponse:
            return pb.ServerMetadataResponse(name=SERVER_NAME, version=qveil_version, extensions=[])

        result: pb.ServerMetadataResponse = await self.core.unary(
            ROLE_SERVICE, "v2.ServerMetadata", context, meta
        )
        return result

    async def ModelMetadata(  # noqa: N802
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        md: dict[str, Any] = await self.core.unary(
            ROLE_SERVICE,
            "v2.ModelMetadata",
            context,
            self.model.metadata,
            request.name,
            request.version,
        )
        T = pb.ModelMetadataResponse.TensorMetadata  # noqa: N806
        return pb.ModelMetadataResponse(
            name=md["name"],
            versions=md["versions"],
            platform=md["platform"],
            inputs=[T(**t) for t in md["inputs"]],
            outputs=[T(**t) for t in md["outputs"]],
        )

    async def ModelInfer(  # noqa: N802
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        def infer(deadline: float | None = None, caller: str = "local") -> InferResponse:
            return self.model.infer(request_from_proto(request), deadline=deadline, caller=caller)

        resp: InferResponse = await self.core.unary(
            ROLE_SERVICE, "v2.ModelInfer", context, infer, deadline=None, caller="local"
        )
        return response_to_proto(resp, raw=len(request.raw_input_contents) > 0)


def add_inference_service(core: Core, health: Any, server: grpc.aio.Server) -> None:
    """Register ``inference.GRPCInferenceService`` on ``server`` (``app.create_server``)."""
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(
        InferenceServicer(core, lambda: bool(health.serving)), server
    )
