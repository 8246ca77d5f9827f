"""``inference.GRPCInferenceService`` (the Open Inference Protocol's gRPC binding, vendored in
proto/qveil/oip) on the same server and port as ValueService.

A thin servicer like those of ``qveil.server.protocol.grpc.servicer``: decoding and inference
run through the data plane (the same authorization as ValueService, in-flight bounds, thread
pool, deadline) into :class:`qveil.server.protocol.v2_model.OIPModel`, which calls the query
service; errors go through the one gRPC table. ServerLive, ServerReady and ModelReady are
probes and need no token, like grpc.health.v1; ServerMetadata, ModelMetadata and ModelInfer
need a role that may call ValueService. RepositoryModelLoad/Unload stay UNIMPLEMENTED (one
model, no repository).

Tensors are read from ``raw_input_contents`` (what tritonclient sends) or from typed
``contents`` (``fp64_contents``/``int64_contents``); the response answers in the same form.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
import numpy as np

from qveil.common.serde import packed_doubles, packed_varints
from qveil.errors import bad_argument, echo
from qveil.oip import grpc_predict_v2_pb2 as pb
from qveil.oip import grpc_predict_v2_pb2_grpc as pb_grpc
from qveil.server.protocol.dataplane import DataPlane
from qveil.server.protocol.grpc.bad_body import checked_server
from qveil.server.protocol.grpc.servicer import Context, answer, call_context
from qveil.server.protocol.v2_model import (
    DTYPES,
    InferRequest,
    InferResponse,
    Tensor,
    decode_raw,
)

__all__ = [
    "SERVICE_NAME",
    "InferenceServicer",
    "add_inference_service",
    "request_from_proto",
    "response_to_proto",
]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
NO_REPOSITORY = "this server serves one model, 'qveil', from its bundle: there is no repository"

_TYPED = {"FP64": "fp64_contents", "FP32": "fp32_contents", "INT64": "int64_contents"}
_FP64_FIELD = pb.InferTensorContents.DESCRIPTOR.fields_by_name["fp64_contents"].number
_INT64_FIELD = pb.InferTensorContents.DESCRIPTOR.fields_by_name["int64_contents"].number


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
                    f"input {echo(t.name)} has typed contents as well as raw_input_contents",
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
        # one copy of the repeated field's buffer, not a Python number per value
        tensors.append(Tensor(t.name, t.datatype, shape, np.array(values, dtype=dt)))
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
        elif t.datatype == "FP64":
            o.contents.MergeFromString(packed_doubles(_FP64_FIELD, flat))
        else:
            o.contents.MergeFromString(packed_varints(_INT64_FIELD, flat))
    return out


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, plane: DataPlane, serving: Callable[[], bool]) -> None:
        self.plane = plane
        self._serving = serving

    def _ready(self) -> bool:
        return bool(self.plane.ready and self._serving())

    async def ServerLive(  # noqa: N802
        self, request: pb.ServerLiveRequest, context: Context
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(  # noqa: N802
        self, request: pb.ServerReadyRequest, context: Context
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._ready())

    async def ModelReady(  # noqa: N802
        self, request: pb.ModelReadyRequest, context: Context
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(
            ready=self._ready() and self.plane.model_ready(request.name, request.version)
        )

    async def ServerMetadata(  # noqa: N802
        self, request: pb.ServerMetadataRequest, context: Context
    ) -> pb.ServerMetadataResponse:
        md = await answer(context, self.plane.server_metadata(call_context(context)))
        return pb.ServerMetadataResponse(**md)

    async def ModelMetadata(  # noqa: N802
        self, request: pb.ModelMetadataRequest, context: Context
    ) -> pb.ModelMetadataResponse:
        md = await answer(
            context,
            self.plane.model_metadata(call_context(context), request.name, request.version),
        )
        T = pb.ModelMetadataResponse.TensorMetadata  # noqa: N806
        return pb.ModelMetadataResponse(
            name=md["name"],
            versions=md["versions"],
            platform=md["platform"],
            inputs=[T(**t) for t in md["inputs"]],
            outputs=[T(**t) for t in md["outputs"]],
            properties=md["properties"],
        )

    async def RepositoryModelLoad(  # noqa: N802
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_REPOSITORY)
        raise AssertionError("abort returned")

    async def RepositoryModelUnload(  # noqa: N802
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NO_REPOSITORY)
        raise AssertionError("abort returned")

    async def ModelInfer(  # noqa: N802
        self, request: pb.ModelInferRequest, context: Context
    ) -> pb.ModelInferResponse:
        resp = await answer(
            context, self.plane.infer(call_context(context), lambda: request_from_proto(request))
        )
        return response_to_proto(resp, raw=len(request.raw_input_contents) > 0)


def add_inference_service(
    plane: DataPlane, serving: Callable[[], bool], server: grpc.aio.Server
) -> None:
    """Register ``inference.GRPCInferenceService`` on ``server`` (``app.create_server``);
    ``serving``: whether health says SERVING (ServerReady, ModelReady)."""
    checked_server(
        server,
        pb_grpc.add_GRPCInferenceServiceServicer_to_server,
        InferenceServicer(plane, serving),
    )
