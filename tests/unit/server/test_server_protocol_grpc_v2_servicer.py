"""``inference.GRPCInferenceService`` (qveil.server.protocol.grpc.v2_servicer): requests decoded
from raw or typed contents and answered in the same form, with the key's values, through a
real in-process server with tokens; probes need no token, the rest the query role; malformed
requests are INVALID_ARGUMENT and the repository calls UNIMPLEMENTED."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from server_helpers import Served, served_values

from qveil.errors import InvalidArgument
from qveil.oip import grpc_predict_v2_pb2 as pb
from qveil.oip import grpc_predict_v2_pb2_grpc as pb_grpc
from qveil.server.protocol.grpc.v2_servicer import request_from_proto, response_to_proto
from qveil.server.protocol.v2_model import InferResponse, Tensor

XS = np.array([-0.5, 0.75, 1.9])


def _request(raw: bool, *, version: str = "") -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="qveil", model_version=version, id="q1")
    t = req.inputs.add(name="STATE", datatype="FP64", shape=[3, 1])
    if raw:
        req.raw_input_contents.append(XS.astype("<f8").tobytes())
    else:
        t.contents.fp64_contents.extend(XS.tolist())
    return req


def test_requests_decode_from_raw_and_typed_contents() -> None:
    for raw in (True, False):
        r = request_from_proto(_request(raw))
        (t,) = r.inputs
        assert (t.name, t.datatype, t.shape) == ("STATE", "FP64", (3, 1))
        assert t.data.tobytes() == XS.tobytes() and (r.id, r.model_name) == ("q1", "qveil")
    req = _request(False)
    req.outputs.add(name="BEST_ACTION")
    assert list(request_from_proto(req).outputs) == ["BEST_ACTION"]


@pytest.mark.parametrize("defect", ["count", "mixed", "dtype"])
def test_malformed_contents_are_refused(defect: str) -> None:
    req = _request(True)
    if defect == "count":
        req.raw_input_contents.append(b"")
        says, reason = "2 raw_input_contents for 1 inputs", "WRONG_SHAPE"
    elif defect == "mixed":
        req.inputs[0].contents.fp64_contents.append(1.0)
        says, reason = "has typed contents as well as raw_input_contents", "MIXED_CONTENTS"
    else:
        req = _request(False)
        req.inputs[0].datatype = "BYTES"
        says, reason = "datatype 'BYTES'", "WRONG_DATATYPE"
    with pytest.raises(InvalidArgument, match=says) as ei:
        request_from_proto(req)
    assert ei.value.reason == reason


def test_responses_encode_raw_and_typed_contents() -> None:
    q = np.array([[1.5, -0.25]])
    resp = InferResponse(
        "qveil",
        "r",
        "i",
        (Tensor("Q", "FP64", (1, 2), q), Tensor("BEST_ACTION", "INT64", (1,), np.array([0]))),
    )
    raw = response_to_proto(resp, raw=True)
    assert raw.raw_output_contents[0] == q.astype("<f8").tobytes()
    assert np.frombuffer(raw.raw_output_contents[1], "<i8").tolist() == [0]
    typed = response_to_proto(resp, raw=False)
    assert list(typed.outputs[0].contents.fp64_contents) == [1.5, -0.25]
    assert list(typed.outputs[1].contents.int64_contents) == [0]
    assert [o.name for o in typed.outputs] == ["Q", "BEST_ACTION"]
    assert list(typed.outputs[0].shape) == [1, 2] and not typed.raw_output_contents


def test_the_service_on_a_real_server(served: Served) -> None:
    md = served.md("query")
    want = served_values(served.bundle, XS)
    with grpc.insecure_channel(served.server.target) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        # probes: no token
        assert stub.ServerLive(pb.ServerLiveRequest()).live
        assert stub.ServerReady(pb.ServerReadyRequest()).ready
        assert stub.ModelReady(pb.ModelReadyRequest(name="qveil")).ready
        assert not stub.ModelReady(pb.ModelReadyRequest(name="other")).ready
        with pytest.raises(grpc.RpcError) as ei:
            stub.ServerMetadata(pb.ServerMetadataRequest())
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        meta = stub.ServerMetadata(pb.ServerMetadataRequest(), metadata=md)
        assert meta.name == "qveil" and list(meta.extensions) == ["binary_tensor_data"]
        mm = stub.ModelMetadata(pb.ModelMetadataRequest(name="qveil"), metadata=md)
        assert [i.name for i in mm.inputs] == ["STATE", "ACTION"]
        assert list(mm.outputs[0].shape) == [-1, 3] and mm.properties["env_id"] == "LineWalk-v0"
        raw = stub.ModelInfer(_request(True), metadata=md)
        assert raw.id == "q1" and raw.model_version == mm.versions[0]
        assert raw.raw_output_contents[0] == want.tobytes()
        typed = stub.ModelInfer(_request(False), metadata=md)
        assert not typed.raw_output_contents
        assert np.array(typed.outputs[0].contents.fp64_contents).tobytes() == want.tobytes()
        assert list(typed.outputs[1].contents.int64_contents) == want.argmax(1).tolist()
        bad = _request(True)
        bad.raw_input_contents[0] = b"1234567"
        with pytest.raises(grpc.RpcError) as ei:
            stub.ModelInfer(bad, metadata=md)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert "not a multiple of 8" in ei.value.details()  # type: ignore[attr-defined]
        for call, req in (
            (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(model_name="x")),
            (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(model_name="x")),
        ):
            with pytest.raises(grpc.RpcError) as ei:
                call(req, metadata=md)
            assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
            assert "there is no repository" in ei.value.details()  # type: ignore[attr-defined]
