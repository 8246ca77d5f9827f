"""The v2 REST/JSON body (qveil.server.protocol.rest.v2_codec): JSON and Triton binary-data
requests decoded into the model's tensors, the outputs rendered as JSON or binary as asked,
and every body that is not such a request refused as INVALID_ARGUMENT with its field."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from qveil.errors import InvalidArgument
from qveil.server.protocol.rest.v2_codec import V2Body, parse_body, render
from qveil.server.protocol.v2_model import InferRequest, InferResponse, Tensor


def _body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def test_a_json_request() -> None:
    doc = {
        "id": "r7",
        "inputs": [
            {"name": "STATE", "datatype": "FP64", "shape": [2, 1], "data": [[0.5], [-1]]},
            {"name": "ACTION", "datatype": "INT64", "shape": [2], "data": [1, 0]},
        ],
        "outputs": [{"name": "Q", "parameters": {"binary_data": True}}, {"name": "BEST_ACTION"}],
        "parameters": {"binary_data_output": False, "anything": 2**70},
    }
    b = parse_body(_body(doc), None, version="rel-1")
    req = b.request
    assert (req.model_name, req.model_version, req.id) == ("qveil", "rel-1", "r7")
    st, act = req.inputs
    assert st.shape == (2, 1) and st.data.dtype == np.float64 and st.data.tolist() == [0.5, -1.0]
    assert act.data.dtype == np.int64 and act.data.tolist() == [1, 0]
    assert list(req.outputs) == ["Q", "BEST_ACTION"]
    assert b.binary("Q") is True and b.binary("BEST_ACTION") is False and b.binary("X") is False


def test_outputs_absent_or_null_ask_for_every_output() -> None:
    for doc in ({"inputs": []}, {"inputs": [], "outputs": None}, {"inputs": [], "outputs": []}):
        assert list(parse_body(_body(doc), None).request.outputs) == []


def test_a_binary_data_request() -> None:
    xs = np.array([0.25, 1.5, -0.75], "<f8")
    acts = np.array([2, 0, 1], "<i8")
    head = _body(
        {
            "inputs": [
                {
                    "name": "STATE",
                    "datatype": "FP64",
                    "shape": [3, 1],
                    "parameters": {"binary_data_size": xs.nbytes},
                },
                {
                    "name": "ACTION",
                    "datatype": "INT64",
                    "shape": [3],
                    "parameters": {"binary_data_size": acts.nbytes},
                },
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    b = parse_body(head + xs.tobytes() + acts.tobytes(), str(len(head)))
    st, act = b.request.inputs
    assert st.data.tobytes() == xs.tobytes() and act.data.tolist() == [2, 0, 1]
    assert b.binary_default is True and b.request.id == ""


@pytest.mark.parametrize(
    ("body", "header", "field", "says"),
    [
        (b"not json", None, "body", "not a v2 JSON inference request"),
        (b"[" * 100_000, None, "body", "not a v2 JSON inference request"),
        (b'{"inputs": []}', "99", "body", "not a v2 JSON"),  # header past the body
        (b'{"inputs": []}', "-1", "body", "not a v2 JSON"),
        (_body({"x": 1}), None, "inputs", 'needs "inputs"'),
        (_body({"inputs": [1]}), None, "inputs", "inputs[0] is not an object"),
        (_body({"inputs": [{"datatype": "FP64"}]}), None, "inputs[0].name", 'string "name"'),
        (
            _body({"inputs": [{"name": "STATE", "datatype": "FP64", "shape": [1, 1]}]}),
            None,
            "inputs[0].data",
            'needs "data"',
        ),
        (
            _body({"inputs": [{"name": "S", "datatype": "FP64", "shape": [True], "data": [1]}]}),
            None,
            "inputs[0].shape",
            "shape must be a list of integers",
        ),
        (
            _body({"inputs": [{"name": "S", "datatype": "FP64", "data": ["1"]}]}),
            None,
            "inputs[0].data",
            "are not all FP64 numbers",
        ),
        (
            _body({"inputs": [{"name": "A", "datatype": "INT64", "data": [1.5]}]}),
            None,
            "inputs[0].data",
            "are not all INT64 numbers",
        ),
        (
            _body({"inputs": [{"name": "S", "datatype": "FP64", "data": [True]}]}),
            None,
            "inputs[0].data",
            "FP64 numbers",
        ),
        (
            _body(
                {
                    "inputs": [
                        {
                            "name": "S",
                            "datatype": "FP64",
                            "parameters": {"binary_data_size": 8},
                        }
                    ]
                }
            ),
            None,
            "inputs[0]",
            "binary_data_size 8 exceeds the body",
        ),
        (_body({"inputs": [], "outputs": {"Q": 1}}), None, "outputs", '"outputs" must be a list'),
        (_body({"inputs": [], "outputs": {}}), None, "outputs", '"outputs" must be a list'),
        (_body({"inputs": [], "outputs": ""}), None, "outputs", '"outputs" must be a list'),
        (_body({"inputs": [], "outputs": False}), None, "outputs", '"outputs" must be a list'),
        (_body({"inputs": [], "outputs": [{}]}), None, "outputs[0]", 'string "name"'),
        (_body({"inputs": [], "parameters": []}), None, "parameters", "must be a JSON object"),
        (_body({"inputs": [], "id": 5}), None, "id", "id must be a string, got int"),
        (
            _body({"inputs": [{"name": "S", "datatype": "BYTES", "data": ["a"]}]}),
            None,
            "inputs[S].datatype",
            "datatype 'BYTES'",
        ),
    ],
)
def test_a_body_that_is_no_request_is_refused(
    body: bytes, header: str | None, field: str, says: str
) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(says)) as ei:
        parse_body(body, header)
    assert ei.value.field == field


def test_nested_data_are_read_in_row_major_order() -> None:
    doc = {"inputs": [{"name": "STATE", "datatype": "FP32", "data": [[[1, 2]], [[3.5, 4]]]}]}
    (t,) = parse_body(_body(doc), None).request.inputs
    assert t.data.dtype == np.float32 and t.data.tolist() == [1.0, 2.0, 3.5, 4.0]
    assert t.shape == ()  # no shape given: the model checks it


def _response() -> InferResponse:
    q = np.array([[0.1, -2.5], [3.0, 0.0]])
    best = np.array([0, 0], np.int64)
    return InferResponse(
        "qveil",
        "rel",
        "id9",
        (Tensor("Q", "FP64", (2, 2), q), Tensor("BEST_ACTION", "INT64", (2,), best)),
    )


def test_json_outputs() -> None:
    fmt = V2Body(InferRequest(inputs=[]), {}, False)
    body, headers = render(_response(), fmt)
    assert headers == {"content-type": "application/json"}
    doc = json.loads(body)
    assert doc == {
        "model_name": "qveil",
        "model_version": "rel",
        "outputs": [
            {"name": "Q", "datatype": "FP64", "shape": [2, 2], "data": [0.1, -2.5, 3.0, 0.0]},
            {"name": "BEST_ACTION", "datatype": "INT64", "shape": [2], "data": [0, 0]},
        ],
        "id": "id9",
    }


def test_binary_outputs_follow_the_json_head() -> None:
    fmt = V2Body(InferRequest(inputs=[]), {"BEST_ACTION": False}, True)
    resp = _response()
    body, headers = render(resp, fmt)
    n = int(headers["Inference-Header-Content-Length"])
    assert headers["content-type"] == "application/octet-stream"
    head = json.loads(body[:n])
    q, best = head["outputs"]
    assert q["parameters"] == {"binary_data_size": 32} and "data" not in q
    assert best["data"] == [0, 0]
    assert body[n:] == resp.outputs[0].data.astype("<f8").tobytes()
    no_id = InferResponse("qveil", "rel", "", resp.outputs)
    assert "id" not in json.loads(render(no_id, V2Body(InferRequest(inputs=[]), {}, False))[0])
