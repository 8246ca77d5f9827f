"""The v2 REST/JSON body: decoded once into an :class:`InferRequest` and the caller's output
format, and the answer rendered in that format.

Tensors come as JSON ``data`` or with Triton's binary-data extension
(``Inference-Header-Content-Length`` header, ``binary_data_size`` per input), which
tritonclient.http uses by default; outputs are binary when asked (``binary_data`` per output
or ``binary_data_output`` for all). A body that is not such a request (not JSON, nested
deeper than the JSON parser allows, the wrong types) is INVALID_ARGUMENT: the caller's error,
never the server's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument, bad_argument
from qveil.json_types import JSONObject, JSONValue
from qveil.server.protocol.v2_model import (
    DTYPES,
    MODEL_NAME,
    InferRequest,
    InferResponse,
    Scalar,
    Tensor,
    decode_raw,
)

__all__ = ["V2Body", "parse_body", "render"]


@dataclass(frozen=True, slots=True)
class V2Body:
    """A decoded v2 request body and how its caller wants the outputs."""

    request: InferRequest
    #: outputs asked for by name with their own ``binary_data`` flag
    binary_by_name: dict[str, bool]
    #: ``binary_data_output``: the default for outputs not named
    binary_default: bool

    def binary(self, name: str) -> bool:
        return self.binary_by_name.get(name, self.binary_default)


def _bad_json(message: str, field: str = "body") -> InvalidArgument:
    return bad_argument(message, field=field, reason="BAD_JSON")


def _document(body: bytes, header_length: str | None) -> tuple[JSONObject, memoryview]:
    """The JSON head of the body and the binary data after it."""
    try:
        n = int(header_length) if header_length is not None else len(body)
        if not 0 <= n <= len(body):
            raise ValueError
        doc = json.loads(body[:n])
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json allows
        raise _bad_json("the body is not a v2 JSON inference request") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise _bad_json('the request needs "inputs": [...]', field="inputs")
    return doc, memoryview(body)[n:]


def parse_body(
    body: bytes, header_length: str | None, *, model_name: str = MODEL_NAME, version: str = ""
) -> V2Body:
    """Decode a v2 JSON inference request (with Triton's binary-data extension) once."""
    doc, binary = _document(body, header_length)
    tensors = []
    for i, t in enumerate(doc["inputs"]):
        tensor, binary = _tensor(i, t, binary)
        tensors.append(tensor)
    outputs = doc.get("outputs")
    if outputs is None:  # absent (or null): every output, in JSON
        outputs = []
    if not isinstance(outputs, list):
        raise _bad_json('"outputs" must be a list', field="outputs")
    params = _parameters(doc.get("parameters"), "parameters")
    names: list[str] = []
    by_name: dict[str, bool] = {}
    for j, o in enumerate(outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise _bad_json(
                f'outputs[{j}] must be an object with a string "name"', field=f"outputs[{j}]"
            )
        p = _parameters(o.get("parameters"), f"outputs[{j}].parameters")
        names.append(o["name"])
        by_name.setdefault(o["name"], bool(p.get("binary_data")))
    request = InferRequest(
        inputs=tensors,
        model_name=model_name,
        model_version=version,
        id=_request_id(doc.get("id", "")),
        outputs=names,
    )
    return V2Body(request, by_name, bool(params.get("binary_data_output")))


def _parameters(value: JSONValue, field: str) -> JSONObject:
    """A ``parameters`` member: a JSON object (absent or null: none). Its values may be any
    JSON value (a double, an integer of any size, ...); only the binary-data extension's
    are read."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad_json(f"{field} must be a JSON object", field=field)
    return value


def _request_id(value: JSONValue) -> str:
    """The request's ``id``: a string (the protocol's type), echoed whole in the answer."""
    if not isinstance(value, str):
        raise bad_argument(
            f"id must be a string, got {type(value).__name__}", field="id", reason="WRONG_TYPE"
        )
    return value


def _tensor(i: int, t: JSONValue, binary: memoryview) -> tuple[Tensor, memoryview]:
    """Input ``i`` of the request, and the binary data left after it."""
    if not isinstance(t, dict):
        raise _bad_json(f"inputs[{i}] is not an object", field="inputs")
    for key in ("name", "datatype"):
        if not isinstance(t.get(key), str):
            raise _bad_json(f'inputs[{i}] needs a string "{key}"', field=f"inputs[{i}].{key}")
    name, dtype = t["name"], t["datatype"]
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
    params = _parameters(t.get("parameters"), f"inputs[{i}].parameters")
    size = params.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or size > len(binary):
            raise bad_argument(
                f"inputs[{i}] binary_data_size {size!r} exceeds the body",
                field=f"inputs[{i}]",
                reason="WRONG_SHAPE",
            )
        return decode_raw(name, dtype, shape, bytes(binary[:size])), binary[size:]
    dt = DTYPES.get(dtype)
    if dt is None:
        return decode_raw(name, dtype, shape, b""), binary  # words the dtype error
    data = t.get("data")
    if not isinstance(data, list):
        raise _bad_json(
            f'inputs[{i}] needs "data": [...] (or the binary-data extension\'s "binary_data_size")',
            field=f"inputs[{i}].data",
        )
    return Tensor(name, dtype, shape, _typed(i, dtype, dt, data)), binary


def _typed(i: int, dtype: str, dt: np.dtype[Scalar], data: JSONValue) -> npt.NDArray[Scalar]:
    """JSON ``data`` (nested lists of numbers) as a flat array of ``dt``."""
    flat = _flatten(data)
    try:
        if dt.kind == "i" and any(isinstance(v, float) for v in flat):
            raise TypeError
        if dt.kind == "f" and any(
            isinstance(v, bool) or not isinstance(v, (int, float)) for v in flat
        ):
            raise TypeError
        return np.array(flat, dtype=dt.newbyteorder("="))
    except (TypeError, ValueError, OverflowError):
        raise bad_argument(
            f"inputs[{i}] data are not all {dtype} numbers",
            field=f"inputs[{i}].data",
            reason="WRONG_DATATYPE",
        ) from None


def _flatten(data: JSONValue) -> list[JSONValue]:
    """Nested lists in row-major order, without recursion (any depth the parser accepted)."""
    out: list[JSONValue] = []
    stack: list[Iterator[JSONValue]] = [iter([data])]
    while stack:
        v = next(stack[-1], _END)
        if v is _END:
            stack.pop()
        elif isinstance(v, list):
            stack.append(iter(v))
        else:
            out.append(v)
    return out


_END = object()


def render(resp: InferResponse, fmt: V2Body) -> tuple[bytes, dict[str, str]]:
    """The response body and its headers: JSON, or JSON then the binary outputs."""
    outs, blobs = [], []
    for t in resp.outputs:
        flat = np.ascontiguousarray(t.data, dtype=DTYPES[t.datatype]).reshape(-1)
        o: JSONObject = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if fmt.binary(t.name):
            raw = flat.tobytes()
            o["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            o["data"] = [float(v) for v in flat] if t.datatype == "FP64" else flat.tolist()
        outs.append(o)
    head: JSONObject = {
        "model_name": resp.model_name,
        "model_version": resp.model_version,
        "outputs": outs,
    }
    if resp.id:
        head["id"] = resp.id
    text = json.dumps(head, allow_nan=False).encode()
    if not blobs:
        return text, {"content-type": "application/json"}
    return text + b"".join(blobs), {
        "content-type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(text)),
    }
