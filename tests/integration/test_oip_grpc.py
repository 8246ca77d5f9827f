"""The Open Inference Protocol (KServe v2) against a real `qveil serve` subprocess,
spoken by clients nobody here wrote: tritonclient over gRPC and over HTTP (in their own
process, see oip_triton_driver.py) and httpx against the REST binding.

Parity with ValueService: v2 answers equal `ValueClient.values` / `best_actions` bit for bit
(float.hex compared), in either order of first asking, and the release's keyed values
computed here from the bundle; every bad input gets the right error and is not answered (the
server's count of answered values does not move). A wrong implementation (another noise, no
grid, validation after the answer) fails the equality or the count."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from oip_helpers import (
    HTTP_STATUS,
    Env,
    action_input,
    bad_cases,
    decoded,
    doc_block,
    hexes,
    states_input,
)
from server_helpers import served_values

from qveil.client import ValueClient


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("oip"))
    try:
        yield e
    finally:
        assert e.server.terminate() == 0, e.server.output()


PROTOCOLS = ["grpc", "http"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_probes_and_metadata(env: Env, protocol: str) -> None:
    ops = [
        {"op": "live"},
        {"op": "ready"},
        {"op": "model_ready"},
        {"op": "model_ready", "model": "resnet50"},
        {"op": "model_ready", "version": env.release},
        {"op": "model_ready", "version": "another-release"},
        {"op": "server_metadata"},
        {"op": "model_metadata"},
        {"op": "model_metadata", "model": "resnet50"},
    ]
    got = env.triton(protocol, ops)
    assert [g["ok"] for g in got] == [True] * 8 + [False], got
    assert [g["value"] for g in got[:6]] == [True, True, True, False, True, False]
    assert got[6]["value"]["name"] == "qveil"
    md = got[7]["value"]
    assert md["name"] == "qveil" and md["versions"] == [env.release]
    shapes = {t["name"]: (t["datatype"], [int(s) for s in t["shape"]]) for t in md["inputs"]}
    assert shapes == {"STATE": ("FP64", [-1, 1]), "ACTION": ("INT64", [-1])}
    outs = {t["name"]: (t["datatype"], [int(s) for s in t["shape"]]) for t in md["outputs"]}
    assert outs == {"Q": ("FP64", [-1, env.b.n_actions]), "BEST_ACTION": ("INT64", [-1])}
    if protocol == "http":  # (tritonclient.grpc's own message has no `properties` field)
        assert md["properties"]["release_id"] == env.release
    assert "unknown model" in got[8]["message"]
    # probes need no token; metadata needs a role that may call ValueService
    anon = env.triton(protocol, [{"op": "live"}, {"op": "ready"}, {"op": "model_metadata"}], None)
    assert [a["ok"] for a in anon] == [True, True, False]
    assert "bearer token" in anon[2]["message"]


# tritonclient.grpc always sends raw_input_contents (typed contents: the test below);
# tritonclient.http sends the binary extension or JSON data
@pytest.mark.parametrize(("protocol", "binary"), [("grpc", True), ("http", True), ("http", False)])
def test_infer_equals_value_client_bit_for_bit(env: Env, protocol: str, binary: bool) -> None:
    rng = np.random.default_rng(17 + binary + 2 * (protocol == "http"))
    xs = np.concatenate([rng.uniform(-1.0, 2.0, size=6), [-1.0, 2.0]])
    xs[3] = xs[1]  # a repeated state within the batch
    before = env.answered()
    (res,) = env.triton(
        protocol, [{"op": "infer", "inputs": [states_input(xs)], "id": "r1", "binary": binary}]
    )
    assert res["ok"], res
    assert res["model_version"] == env.release and res["id"] == "r1"
    assert env.answered() == before + 8 * env.b.n_actions  # every state, repeats too
    q, best = decoded(res, "Q"), decoded(res, "BEST_ACTION")
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        want = c.values(xs)
        want_best = c.best_actions(xs)
    assert q.shape == (8, env.b.n_actions) and hexes(q) == hexes(want)
    assert hexes(q) == hexes(served_values(env.b, xs))
    assert best.tolist() == want_best.tolist()

    # ACTION given: Q[i] = value(state i, ACTION[i]); ValueService asked FIRST this time
    ys = rng.uniform(-1.0, 2.0, size=5)
    acts = [2, 0, 1, 2, 0]
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        cols = {a: c.values(ys[[i for i, b in enumerate(acts) if b == a]], [a]) for a in set(acts)}
    (res2,) = env.triton(
        protocol,
        [{"op": "infer", "inputs": [states_input(ys), action_input(acts)], "binary": binary}],
    )
    assert res2["ok"], res2 and set(res2["outputs"]) == {"Q"}
    q2 = decoded(res2, "Q")
    assert q2.shape == (5,)
    for a, col in cols.items():
        idx = [i for i, b in enumerate(acts) if b == a]
        assert hexes(q2[idx]) == hexes(col[:, 0])
    (res3,) = env.triton(
        protocol,
        [
            {
                "op": "infer",
                "inputs": [states_input(ys), action_input(acts)],
                "outputs": ["Q", "BEST_ACTION"],
                "binary": binary,
            }
        ],
    )
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        assert decoded(res3, "BEST_ACTION").tolist() == c.best_actions(ys).tolist()
    assert hexes(decoded(res3, "Q")) == hexes(q2)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_inputs_get_the_right_error_and_answer_nothing(env: Env, protocol: str) -> None:
    cases = bad_cases(env)
    before = env.answered()
    got = env.triton(protocol, [{"op": "infer", **op} for _, op, _, _ in cases])
    assert env.answered() == before
    for (label, _, code, fragment), res in zip(cases, got, strict=True):
        assert not res["ok"], (label, res)
        want = f"StatusCode.{code}" if protocol == "grpc" else HTTP_STATUS[code]
        assert res["status"] == want, (label, res)
        assert fragment in res["message"], (label, res)
    # no token: UNAUTHENTICATED, nothing answered
    (anon,) = env.triton(protocol, [{"op": "infer", "inputs": [states_input([0.42])]}], None)
    want = "StatusCode.UNAUTHENTICATED" if protocol == "grpc" else "401"
    assert not anon["ok"] and anon["status"] == want, anon
    assert env.answered() == before


def test_typed_contents_and_raw_errors_over_grpc(env: Env) -> None:
    """fp64_contents/int64_contents (what grpcurl or KServe's SDK send) answer like raw;
    malformed raw contents are INVALID_ARGUMENT; no raw noise or weight is reachable."""
    import grpc

    from qveil.oip import grpc_predict_v2_pb2 as pb
    from qveil.oip import grpc_predict_v2_pb2_grpc as pb_grpc

    md = (("authorization", f"Bearer {env.tokens.query}"),)
    xs = [0.25, -0.75, 1.5]
    with grpc.insecure_channel(env.server.target) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        t = pb.ModelInferRequest.InferInputTensor(name="STATE", datatype="FP64", shape=[3, 1])
        t.contents.fp64_contents.extend(xs)
        resp = stub.ModelInfer(pb.ModelInferRequest(model_name="qveil", inputs=[t]), metadata=md)
        assert not resp.raw_output_contents
        q = np.array(resp.outputs[0].contents.fp64_contents).reshape(3, -1)
        with ValueClient(env.server.target, token=env.tokens.query) as c:
            assert hexes(q) == hexes(c.values(xs))
        before = env.answered()
        raw = pb.ModelInferRequest.InferInputTensor(name="STATE", datatype="FP64", shape=[2, 1])
        for req, fragment in (
            (
                pb.ModelInferRequest(
                    model_name="qveil", inputs=[raw], raw_input_contents=[b"\0" * 12]
                ),
                "multiple of 8",
            ),
            (
                pb.ModelInferRequest(
                    model_name="qveil", inputs=[raw], raw_input_contents=[b"\0" * 8]
                ),
                "1 elements",
            ),
            (
                pb.ModelInferRequest(
                    model_name="qveil", inputs=[raw], raw_input_contents=[b"", b""]
                ),
                "2 raw_input_contents",
            ),
        ):
            with pytest.raises(grpc.RpcError) as ei:
                stub.ModelInfer(req, metadata=md)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert fragment in (ei.value.details() or ""), ei.value.details()
        for call, req in (
            (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest),
            (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest),
        ):
            with pytest.raises(grpc.RpcError) as ei:
                call(req(repository_name="", model_name="qveil"), metadata=md)
            assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "no repository" in (ei.value.details() or "")
        assert env.answered() == before


def test_undecodable_model_infer_is_invalid_argument(env: Env) -> None:
    """A ModelInfer body that is not a protobuf message gets INVALID_ARGUMENT (as an
    undecodable ValueService request does), not UNKNOWN, and answers nothing; a real channel
    sends the raw bytes."""
    import grpc

    md = (("authorization", f"Bearer {env.tokens.query}"),)
    before = env.answered()
    garbage = b"\x0a\x05ab"  # field 1, 5 bytes announced, 2 sent
    with grpc.insecure_channel(env.server.target) as ch:
        for method in (
            "/inference.GRPCInferenceService/ModelInfer",
            "/qveil.v1.ValueService/GetValues",
        ):
            call = ch.unary_unary(method)
            with pytest.raises(grpc.RpcError) as ei:
                call(garbage, metadata=md, timeout=10)
            assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, ei.value)
            assert "not a valid message" in (ei.value.details() or "")
    assert env.answered() == before


def test_vendored_proto_matches_tritons_wire_format(env: Env) -> None:
    """Every message of the vendored grpc_predict_v2.proto exists in Triton's
    grpc_service.proto as compiled into tritonclient with the same fields (names, numbers,
    types, labels), the repository requests included, but for the one documented
    difference: ModelMetadataResponse.properties (the protocol's, not in Triton's file); every
    RPC has the same request/response types. (tests/unit/common/test_oip_proto.py checks it
    against the upstream texts.)"""
    from google.protobuf import descriptor_pb2

    from qveil.oip import grpc_predict_v2_pb2 as pb

    (res,) = env.triton("grpc", [{"op": "descriptor"}])
    theirs = descriptor_pb2.FileDescriptorProto.FromString(bytes.fromhex(res["value"]))
    ours = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(ours)
    assert ours.package == theirs.package == "inference"

    def fields(fd: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}

        def walk(msgs: Any, prefix: str) -> None:
            for m in msgs:
                name = f"{prefix}{m.name}"
                out[name] = sorted(
                    (f.name, f.number, f.type, f.label, f.type_name) for f in m.field
                )
                walk(m.nested_type, name + ".")

        walk(fd.message_type, "")
        return out

    mine, triton = fields(ours), fields(theirs)
    properties = ("properties", 6, 11, 3, ".inference.ModelMetadataResponse.PropertiesEntry")
    only_ours = {"ModelMetadataResponse.PropertiesEntry"}
    assert set(mine) - set(triton) == only_ours
    for name in set(mine) - only_ours:
        extra = [properties] if name == "ModelMetadataResponse" else []
        assert sorted(triton[name] + extra) == mine[name], name
    rpcs = {m.name: (m.input_type, m.output_type) for m in theirs.service[0].method}
    assert len(ours.service[0].method) == 8
    for m in ours.service[0].method:
        assert rpcs[m.name] == (m.input_type, m.output_type), m.name


@pytest.mark.parametrize(("protocol", "binary"), [("grpc", True), ("http", True), ("http", False)])
def test_fp32_states_are_answered_as_their_exact_fp64(
    env: Env, protocol: str, binary: bool
) -> None:
    """Most clients send FP32 tensors: an FP32 STATE is widened exactly to FP64 and answered
    bit for bit as those FP64 states (ValueService's values of the same numbers)."""
    xs32 = np.asarray([0.1, 0.5, 1.25, -0.75], dtype=np.float32)
    spec = {**states_input(xs32.astype(np.float64)), "datatype": "FP32", "np": "FP32"}
    (res,) = env.triton(protocol, [{"op": "infer", "inputs": [spec], "binary": binary}])
    assert res["ok"], res
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        want = c.values(xs32.astype(np.float64))
    assert hexes(decoded(res, "Q")) == hexes(want)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_parameters_of_every_kind_are_accepted_and_change_nothing(env: Env, protocol: str) -> None:
    """tritonclient sends `priority` as an InferParameter.uint64_param and a float custom
    parameter as a double_param (gRPC; numbers in the JSON over REST): accepted with bool,
    int64 and string ones, and the answer is the same bits as without parameters."""
    xs = [0.3125, -0.5, 1.75]
    params = {"temperature": 0.25, "n": 2, "flag": True, "note": "x"}
    (res,) = env.triton(
        protocol,
        [{"op": "infer", "inputs": [states_input(xs)], "priority": 3, "parameters": params}],
    )
    assert res["ok"], res
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        assert hexes(decoded(res, "Q")) == hexes(c.values(xs))


def test_double_and_uint64_parameters_on_inputs_and_outputs(env: Env) -> None:
    """Every InferParameter kind (bool, int64, string, double, uint64) on the request, an
    input and a requested output: the same answer; ModelMetadata's `properties` name the
    release, the value grid and the noise construction, all from the public card."""
    import grpc

    from qveil.oip import grpc_predict_v2_pb2 as pb
    from qveil.oip import grpc_predict_v2_pb2_grpc as pb_grpc

    md = (("authorization", f"Bearer {env.tokens.query}"),)
    every = {
        "b": pb.InferParameter(bool_param=True),
        "i": pb.InferParameter(int64_param=-3),
        "s": pb.InferParameter(string_param="x"),
        "d": pb.InferParameter(double_param=0.5),
        "u": pb.InferParameter(uint64_param=2**64 - 1),
    }
    xs = [0.125, 0.875]
    with grpc.insecure_channel(env.server.target) as ch:
        stub = pb_grpc.GRPCInferenceServiceStub(ch)
        req = pb.ModelInferRequest(model_name="qveil", parameters=every)
        t = req.inputs.add(name="STATE", datatype="FP64", shape=[2, 1], parameters=every)
        t.contents.fp64_contents.extend(xs)
        req.outputs.add(name="Q", parameters=every)
        resp = stub.ModelInfer(req, metadata=md, timeout=30)
        (q,) = resp.outputs
        meta = stub.ModelMetadata(pb.ModelMetadataRequest(name="qveil"), metadata=md, timeout=30)
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        assert hexes(np.array(q.contents.fp64_contents)) == hexes(c.values(xs))
        release = c.release()
    props = dict(meta.properties)
    assert props["release_id"] == env.release
    assert float(props["value_grid"]) == release.value_grid
    card = env.b.public_card()
    assert props["noise_path"] == card["noise_path"]["construction"]
    assert props["env_id"] == card["env_id"] and float(props["epsilon"]) == card["epsilon"]
    assert set(props) <= {"release_id", "value_grid", "noise_path", *card}
    text = " ".join(props)
    assert "weights" not in text and "key" not in text


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_documented_tritonclient_example_works(env: Env, protocol: str) -> None:
    """docs/api.md's tritonclient block, run as written in its own process (`token` a query
    token, the address the test server's); over HTTP with the two changes the doc names (the
    module, the REST address). Its values are ValueService's, bit for bit."""
    code = doc_block("**tritonclient** over gRPC", "python")
    code = code.replace("127.0.0.1:50051", env.url("grpc"))
    if protocol == "http":
        code = code.replace("tritonclient.grpc as", "tritonclient.http as")
        code = code.replace(env.url("grpc"), env.url("http"))
    probe = (
        "import json\n"
        "print(json.dumps({'q': [float(v).hex() for v in q.reshape(-1)], 'shape': q.shape,\n"
        "    'best': best.tolist(), 'q_at': [float(v).hex() for v in q_at]}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", f"token = {env.tokens.query!r}\n{code}\n{probe}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "qveil" in proc.stdout.splitlines()[0]  # the metadata it prints
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        assert got["shape"] == [2, env.b.n_actions]
        assert got["q"] == hexes(c.values([0.3, 0.7]))
        assert got["best"] == c.best_actions([0.3, 0.7]).tolist()
        want = [c.values([0.3], [1])[0, 0], c.values([0.7], [0])[0, 0]]
    assert got["q_at"] == hexes(want)
