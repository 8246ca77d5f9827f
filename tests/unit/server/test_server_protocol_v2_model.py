"""The Open Inference Protocol's model ``qveil`` (qveil.server.protocol.v2_model) over a real
query service and SQLite answer log, no transport: raw tensors decoded, the metadata, the
outputs by default and by name with the key's values, and every malformed request refused
(InvalidArgument with its reason, or NotFound) before anything is answered or logged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from server_helpers import served_values, serving_query

from qveil.errors import FailedPrecondition, InvalidArgument, NotFound
from qveil.server.protocol.v2_model import (
    MODEL_NAME,
    PLATFORM,
    InferRequest,
    OIPModel,
    Tensor,
    decode_raw,
)

XS = np.array([-1.0, 0.5, 1.75])


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Any, Any]]:
    """One query service with its answer log for the module's refused requests only (none
    of them may answer or log anything)."""
    with serving_query(tmp_path_factory.mktemp("refusing")) as world:
        yield world


def _state(xs: np.ndarray = XS, dtype: str = "FP64") -> Tensor:
    return Tensor("STATE", dtype, (xs.size, 1), xs.astype("<f4" if dtype == "FP32" else "<f8"))


def test_raw_contents_are_decoded_or_refused() -> None:
    t = decode_raw("STATE", "FP64", [2, 1], np.array([0.5, -2.0], "<f8").tobytes())
    assert t.shape == (2, 1) and t.data.tolist() == [0.5, -2.0] and t.data.dtype == np.float64
    a = decode_raw("ACTION", "INT64", [1], np.array([2], "<i8").tobytes())
    assert a.data.tolist() == [2]
    with pytest.raises(InvalidArgument, match="datatype 'BYTES'; expected FP64") as ei:
        decode_raw("STATE", "BYTES", [1], b"x")
    assert ei.value.reason == "WRONG_DATATYPE"
    with pytest.raises(InvalidArgument, match="are 7 bytes, not a multiple of 8") as ei:
        decode_raw("STATE", "FP64", [1], b"1234567")
    assert ei.value.reason == "WRONG_SHAPE"


@pytest.fixture(scope="module")
def answering(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Any, Any]]:
    """One query service (no answer log) for the module's answered requests."""
    with serving_query(tmp_path_factory.mktemp("answering"), log=False) as world:
        yield world


def test_metadata_and_readiness(answering: tuple[Any, Any, Any, Any]) -> None:
    h, _st, _log, b = answering
    model = OIPModel(h)
    rid = b.bundle_id
    assert model.version() == rid
    assert model.ready(MODEL_NAME) and model.ready(MODEL_NAME, rid)
    assert not model.ready("other") and not model.ready(MODEL_NAME, "r2")
    meta = model.metadata()
    assert meta["name"] == MODEL_NAME and meta["versions"] == [rid]
    assert meta["platform"] == PLATFORM
    assert meta["inputs"][0] == {"name": "STATE", "datatype": "FP64", "shape": [-1, 1]}
    assert meta["outputs"][0] == {"name": "Q", "datatype": "FP64", "shape": [-1, 3]}
    props = meta["properties"]
    assert props["release_id"] == rid and props["value_grid"] == repr(h.limits.value_grid)
    assert props["env_id"] == "LineWalk-v0" and all(isinstance(v, str) for v in props.values())
    with pytest.raises(NotFound, match="unknown model 'm2'"):
        model.metadata("m2")
    with pytest.raises(FailedPrecondition, match="is not the active release") as ei:
        model.metadata(MODEL_NAME, "another-release")  # as a pinned GetValues
    assert ei.value.reason == "RELEASE_NOT_ACTIVE"
    h.holder.draining = True
    try:
        assert not model.ready(MODEL_NAME)
    finally:
        h.holder.draining = False


def test_outputs_are_the_keys_values(answering: tuple[Any, Any, Any, Any]) -> None:
    h, _st, _log, b = answering
    model = OIPModel(h)
    want = served_values(b, XS)
    r = model.infer(InferRequest(inputs=[_state()], id="r1"))
    assert (r.model_name, r.model_version, r.id) == (MODEL_NAME, b.bundle_id, "r1")
    q, best = r.outputs
    assert (q.name, q.datatype, q.shape) == ("Q", "FP64", (3, 3))
    assert q.data.tobytes() == want.tobytes()
    assert (best.name, best.datatype) == ("BEST_ACTION", "INT64")
    assert best.data.tolist() == want.argmax(1).tolist()
    acts = Tensor("ACTION", "INT64", (3,), np.array([2, 0, 1], np.int64))
    (only_q,) = model.infer(InferRequest(inputs=[_state(), acts])).outputs
    assert only_q.shape == (3,) and only_q.data.tolist() == want[[0, 1, 2], [2, 0, 1]].tolist()
    both = model.infer(InferRequest(inputs=[_state(), acts], outputs=["BEST_ACTION", "Q"]))
    assert [t.name for t in both.outputs] == ["BEST_ACTION", "Q"]
    assert both.outputs[0].data.tolist() == want.argmax(1).tolist()
    (b_only,) = model.infer(InferRequest(inputs=[_state()], outputs=["BEST_ACTION"])).outputs
    assert b_only.data.tolist() == want.argmax(1).tolist()
    x32 = np.array([0.1, 1.3], np.float32)
    (q32, _b) = model.infer(InferRequest(inputs=[_state(x32, "FP32")])).outputs
    assert q32.data.tobytes() == served_values(b, x32.astype(np.float64)).tobytes()
    pinned = model.infer(InferRequest(inputs=[_state()], model_version=b.bundle_id))
    assert pinned.model_version == b.bundle_id


@pytest.mark.parametrize(
    ("inputs", "outputs", "reason", "says"),
    [
        ([], (), "MISSING_INPUT", "input STATE .* is required"),
        ([Tensor("X", "FP64", (1,), np.zeros(1))], (), "UNKNOWN_INPUT", "unknown input 'X'"),
        ([_state(), _state()], (), "DUPLICATE", "input STATE is given twice"),
        (
            [Tensor("STATE", "INT64", (1, 1), np.zeros(1, np.int64))],
            (),
            "WRONG_DATATYPE",
            "expected FP64 or FP32",
        ),
        ([Tensor("STATE", "FP64", (2, 1), np.zeros(3))], (), "WRONG_SHAPE", "but 3 elements"),
        ([Tensor("STATE", "FP64", (3,), XS)], (), "WRONG_SHAPE", r"shape \[n, d\], got \[3\]"),
        ([Tensor("STATE", "FP64", (1, 3), XS)], (), "WRONG_SHAPE", "has d = 3; .* d = 1"),
        (
            [_state(), Tensor("ACTION", "INT64", (2,), np.zeros(2, np.int64))],
            (),
            "WRONG_SHAPE",
            r"ACTION must have shape \[n\] = \[3\]",
        ),
        ([_state()], ("V",), "UNKNOWN_OUTPUT", "unknown output 'V'"),
        ([Tensor("STATE", "FP64", (1, 1), np.array([np.nan]))], (), None, "finite|NaN|nan"),
        (
            [_state(), Tensor("ACTION", "INT64", (3,), np.array([0, 5, 1], np.int64))],
            (),
            None,
            "action",
        ),
    ],
)
def test_a_malformed_request_answers_and_logs_nothing(
    refusing: tuple[Any, Any, Any, Any],
    inputs: list[Tensor],
    outputs: tuple[str, ...],
    reason: str | None,
    says: str,
) -> None:
    h, st, log, b = refusing
    with pytest.raises(InvalidArgument, match=says) as ei:
        OIPModel(h).infer(InferRequest(inputs=inputs, outputs=outputs))
    if reason is not None:
        assert ei.value.reason == reason
    assert log.flush(30)
    assert all(st.count_points(b.bundle_id, a) == 0 for a in range(3))
    assert h.metrics.states_answered == 0


def test_an_unknown_model_is_not_found(refusing: tuple[Any, Any, Any, Any]) -> None:
    h, st, log, b = refusing
    with pytest.raises(NotFound, match="this server serves one model, 'qveil'"):
        OIPModel(h).infer(InferRequest(inputs=[_state()], model_name="resnet"))
    assert log.flush(30) and st.count_points(b.bundle_id) == 0
