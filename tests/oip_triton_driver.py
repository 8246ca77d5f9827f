"""Drive a v2 server with tritonclient (grpc or http) in its OWN process; print JSON results.

Why a separate process: tritonclient.grpc registers Triton's grpc_service.proto (package
`inference`) in protobuf's default descriptor pool, and qveil's server stubs register the
same `inference.*` messages from the vendored KServe file; one process cannot hold both
(protobuf refuses the duplicate symbols). The tests that import the server in-process stay
unaffected, and the client under test is still exactly tritonclient.

    python oip_triton_driver.py '{"protocol": "grpc", "url": "127.0.0.1:PORT",
                                  "token": null, "ops": [{"op": "live"}, ...]}'

Operations: live, ready, model_ready, server_metadata, model_metadata, descriptor, and
infer with "inputs": [{"name", "datatype", "shape", "data": [float.hex or int]}],
optional "outputs": [names], "model_version", "priority" (sent by tritonclient.grpc as
InferParameter.uint64_param) and "parameters" (custom request parameters: a float is a
double_param over gRPC). Floats travel as float.hex (bit-exact, NaN
included). Each result is {"ok": true, ...} or {"ok": false, "status": ..., "message": ...}.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

DT = {"FP64": np.float64, "FP32": np.float32, "INT64": np.int64, "INT32": np.int32}


def _array(spec: dict[str, Any]) -> Any:
    dt = DT[spec.get("np", spec["datatype"])]
    vals = [float.fromhex(v) if isinstance(v, str) else v for v in spec["data"]]
    return np.asarray(vals, dtype=dt).reshape(spec.get("data_shape", spec["shape"]))


def _encode(arr: Any) -> dict[str, Any]:
    flat = arr.reshape(-1)
    data = [float(v).hex() for v in flat] if arr.dtype.kind == "f" else [int(v) for v in flat]
    return {"dtype": str(arr.dtype), "shape": list(arr.shape), "data": data}


def _as_json(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"as_json": True} if cfg["protocol"] == "grpc" else {}


def _binary(cfg: dict[str, Any], op: dict[str, Any]) -> dict[str, Any]:
    if cfg["protocol"] == "grpc":
        return {}
    return {"binary_data": bool(op.get("binary", True))}


def _plain(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def _one(client: Any, tc: Any, cfg: dict[str, Any], op: dict[str, Any]) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {cfg['token']}"} if cfg.get("token") else None
    kind = op["op"]
    if kind == "live":
        return {"ok": True, "value": client.is_server_live(headers=headers)}
    if kind == "ready":
        return {"ok": True, "value": client.is_server_ready(headers=headers)}
    if kind == "model_ready":
        ready = client.is_model_ready(
            op.get("model", "qveil"), op.get("version", ""), headers=headers
        )
        return {"ok": True, "value": ready}
    if kind == "server_metadata":
        return {
            "ok": True,
            "value": _plain(client.get_server_metadata(headers=headers, **_as_json(cfg))),
        }
    if kind == "model_metadata":
        md = client.get_model_metadata(op.get("model", "qveil"), headers=headers, **_as_json(cfg))
        return {"ok": True, "value": _plain(md)}
    if kind == "descriptor":
        from google.protobuf import descriptor_pb2
        from tritonclient.grpc import service_pb2

        fd = descriptor_pb2.FileDescriptorProto()
        service_pb2.DESCRIPTOR.CopyToProto(fd)
        return {"ok": True, "value": fd.SerializeToString().hex()}
    if kind == "infer":
        inputs = []
        for spec in op["inputs"]:
            inp = tc.InferInput(spec["name"], list(spec["shape"]), spec["datatype"])
            inp.set_data_from_numpy(_array(spec), **_binary(cfg, op))
            inputs.append(inp)
        outputs = [tc.InferRequestedOutput(n, **_binary(cfg, op)) for n in op.get("outputs", [])]
        res = client.infer(
            op.get("model", "qveil"),
            inputs,
            model_version=op.get("model_version", ""),
            outputs=outputs or None,
            request_id=op.get("id", ""),
            priority=op.get("priority", 0),
            parameters=op.get("parameters"),
            headers=headers,
        )
        resp = _plain(res.get_response(**_as_json(cfg)))
        names = [o["name"] for o in resp["outputs"]]
        return {
            "ok": True,
            "model_version": resp.get("model_version", ""),
            "id": resp.get("id", ""),
            "outputs": {n: _encode(res.as_numpy(n)) for n in names},
        }
    raise ValueError(f"unknown op {kind!r}")


def run(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    from tritonclient.utils import InferenceServerException

    if cfg["protocol"] == "grpc":
        import tritonclient.grpc as tc
    else:
        import tritonclient.http as tc  # type: ignore[no-redef]
    client = tc.InferenceServerClient(url=cfg["url"])
    out: list[dict[str, Any]] = []
    for op in cfg["ops"]:
        try:
            out.append(_one(client, tc, cfg, op))
        except InferenceServerException as exc:
            out.append({"ok": False, "status": str(exc.status()), "message": exc.message()})
    client.close()
    return out


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
