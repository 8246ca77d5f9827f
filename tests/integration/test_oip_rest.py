"""The v2 REST/JSON binding (`qveil serve --http-port`) spoken by plain httpx, as
curl would: JSON tensors (no binary extension), the same answers as ValueService bit for bit
(a JSON double round-trips exactly: repr is shortest-exact) and the release's keyed values,
the same bad inputs with HTTP statuses and nothing answered, auth by `Authorization:
Bearer`, a body over --max-message-bytes refused before it is read whole, TLS with the
server's certificates, and loopback-only binding without TLS. (tritonclient.http, with its
binary extension, is in test_oip_grpc.py.)"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from oip_helpers import (
    MAX_BATCH,
    Env,
    bad_cases,
    doc_block,
    hexes,
    serving_env,
    states_input,
)
from server_helpers import make_bundle, make_certs, make_tokens, running, served_values

from qveil.client import ValueClient

STATUS = {
    "INVALID_ARGUMENT": 400,
    "NOT_FOUND": 404,
    "UNAUTHENTICATED": 401,
    "FAILED_PRECONDITION": 400,
}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with serving_env(tmp_path_factory.mktemp("oip-rest")) as e:
        yield e


def base(env: Env) -> str:
    return f"http://127.0.0.1:{env.http_port}"


def auth(env: Env, role: str | None = "query") -> dict[str, str]:
    tok = env.tokens.of(role)
    return {"Authorization": f"Bearer {tok}"} if tok else {}


def json_tensor(spec: dict[str, Any]) -> dict[str, Any]:
    """A driver spec (oip_helpers) as a plain v2 JSON tensor."""
    data = [float.fromhex(v) if isinstance(v, str) else v for v in spec["data"]]
    return {
        "name": spec["name"],
        "datatype": spec["datatype"],
        "shape": spec["shape"],
        "data": data,
    }


def infer(
    env: Env,
    body: dict[str, Any],
    *,
    model: str = "qveil",
    role: str | None = "query",
    version: str = "",
) -> httpx.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    # json.dumps writes NaN for nan (what a client that sends it would send)
    return httpx.post(
        base(env) + path,
        content=json.dumps(body),
        headers={"Content-Type": "application/json", **auth(env, role)},
        timeout=30,
    )


def test_health_metadata_and_auth(env: Env) -> None:
    assert httpx.get(base(env) + "/v2/health/live").json() == {"live": True}
    r = httpx.get(base(env) + "/v2/health/ready")
    assert r.status_code == 200 and r.json() == {"ready": True}
    assert httpx.get(base(env) + "/v2/models/qveil/ready").status_code == 200
    assert httpx.get(base(env) + "/v2/models/other/ready").status_code == 503
    md = httpx.get(base(env) + "/v2/models/qveil", headers=auth(env))
    assert md.status_code == 200, md.text
    assert md.json()["versions"] == [env.release] and md.json()["name"] == "qveil"
    ver = httpx.get(base(env) + f"/v2/models/qveil/versions/{env.release}", headers=auth(env))
    assert ver.status_code == 200
    anon = httpx.get(base(env) + "/v2/models/qveil")
    assert anon.status_code == 401 and "bearer token" in anon.json()["error"]
    bad = httpx.get(base(env) + "/v2/models/qveil", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and bad.json()["reason"] == "UNAUTHENTICATED"
    other = httpx.get(base(env) + "/v2/models/resnet50", headers=auth(env))
    assert other.status_code == 404
    assert httpx.get(base(env) + "/v2", headers=auth(env)).json()["name"] == "qveil"


def test_infer_json_equals_value_client(env: Env) -> None:
    xs = np.array([-0.3, 1.7, 0.0625, -0.3, 1.99])
    before = env.answered()
    r = infer(env, {"id": "a", "inputs": [json_tensor(states_input(xs))]})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["model_name"] == "qveil" and doc["model_version"] == env.release
    assert doc["id"] == "a"
    outs = {o["name"]: o for o in doc["outputs"]}
    q = np.array(outs["Q"]["data"], dtype=np.float64).reshape(outs["Q"]["shape"])
    best = outs["BEST_ACTION"]["data"]
    assert env.answered() == before + 5 * env.b.n_actions  # a repeated state counts too
    assert hexes(q) == hexes(served_values(env.b, xs))
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        assert hexes(q) == hexes(c.values(xs))
        assert best == c.best_actions(xs).tolist()
        # ACTION, as nested JSON data; only Q by default
        r2 = infer(
            env,
            {
                "inputs": [
                    {"name": "STATE", "datatype": "FP64", "shape": [2, 1], "data": [[0.9], [0.1]]},
                    {"name": "ACTION", "datatype": "INT64", "shape": [2], "data": [1, 2]},
                ]
            },
        )
        assert r2.status_code == 200, r2.text
        (o,) = r2.json()["outputs"]
        assert o["name"] == "Q" and o["shape"] == [2]
        assert hexes(o["data"]) == hexes([c.values([0.9], [1])[0, 0], c.values([0.1], [2])[0, 0]])
    pinned = infer(env, {"inputs": [json_tensor(states_input([0.9]))]}, version=env.release)
    assert pinned.status_code == 200


def test_bad_inputs_answer_nothing(env: Env) -> None:
    before = env.answered()
    for label, op, code, fragment in bad_cases(env):
        body: dict[str, Any] = {"inputs": [json_tensor(t) for t in op["inputs"]]}
        if "outputs" in op:
            body["outputs"] = [{"name": n} for n in op["outputs"]]
        r = infer(env, body, model=op.get("model", "qveil"), version=op.get("model_version", ""))
        assert r.status_code == STATUS[code], (label, r.text)
        assert fragment in r.json()["error"], (label, r.text)
    extra = [
        ("not JSON", b"{not json", 400, "not a v2 JSON"),
        ("no inputs", b"{}", 400, '"inputs"'),
        (
            "float ACTION",
            json.dumps(
                {
                    "inputs": [
                        json_tensor(states_input([0.2])),
                        {"name": "ACTION", "datatype": "INT64", "shape": [1], "data": [1.5]},
                    ]
                }
            ).encode(),
            400,
            "INT64 numbers",
        ),
        (
            "string STATE",
            json.dumps(
                {
                    "inputs": [
                        {"name": "STATE", "datatype": "FP64", "shape": [1, 1], "data": ["0.2"]},
                    ]
                }
            ).encode(),
            400,
            "FP64 numbers",
        ),
        (
            "shape not ints",
            json.dumps(
                {
                    "inputs": [
                        {"name": "STATE", "datatype": "FP64", "shape": ["1", 1], "data": [0.2]},
                    ]
                }
            ).encode(),
            400,
            "list of integers",
        ),
    ]
    for label, raw, status, fragment in extra:
        r = httpx.post(base(env) + "/v2/models/qveil/infer", content=raw, headers=auth(env))
        assert r.status_code == status and fragment in r.json()["error"], (label, r.text)
    anon = infer(env, {"inputs": [json_tensor(states_input([0.4242]))]}, role=None)
    assert anon.status_code == 401
    # a body over --max-message-bytes (4 MiB) is refused from its Content-Length
    huge = b'{"inputs": [' + b" " * (5 * 1024 * 1024) + b"]}"
    r = httpx.post(base(env) + "/v2/models/qveil/infer", content=huge, headers=auth(env))
    assert r.status_code == 413 and r.json()["reason"] == "BODY_TOO_LARGE"
    assert env.answered() == before
    assert MAX_BATCH == 16


def test_deep_and_malformed_bodies_are_400(env: Env) -> None:
    """A body nested deeper than the JSON parser allows (10,000 levels), at the top or inside
    a tensor's data, and every other body that is not a v2 request, is the caller's error:
    HTTP 400 with a reason, never a 500; nothing is answered, and the server keeps answering."""
    deep = "[" * 10_000 + "]" * 10_000
    bodies = [
        ("deep document", deep.encode()),
        (
            "deep data",
            (
                '{"inputs": [{"name": "STATE", "datatype": "FP64", "shape": [1, 1], '
                f'"data": {deep}}}]}}'
            ).encode(),
        ),
        ("deep outputs", f'{{"inputs": [], "outputs": {deep}}}'.encode()),
        ("not UTF-8", b'{"inputs": [\xff\xfe]}'),
        ("a list", b"[1, 2]"),
        ("inputs not a list", b'{"inputs": "STATE"}'),
        ("input not an object", b'{"inputs": [7]}'),
        ("outputs not a list", b'{"inputs": [], "outputs": 3}'),
        ("truncated", b'{"inputs": [{"name": "STATE", "datat'),
    ]
    before = env.answered()
    for label, raw in bodies:
        r = httpx.post(base(env) + "/v2/models/qveil/infer", content=raw, headers=auth(env))
        assert r.status_code == 400, (label, r.status_code, r.text)
        assert r.json()["reason"] in ("BAD_JSON", "MISSING_INPUT"), (label, r.text)
    # Triton's binary extension: a header length past the body, a blob past the body
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "STATE",
                    "datatype": "FP64",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": 64},
                }
            ]
        }
    ).encode()
    for label, length in (("header past the body", len(head) + 100), ("blob past", len(head))):
        r = httpx.post(
            base(env) + "/v2/models/qveil/infer",
            content=head + b"\0" * 8,
            headers={**auth(env), "Inference-Header-Content-Length": str(length)},
        )
        assert r.status_code == 400, (label, r.status_code, r.text)
    assert env.answered() == before
    ok = infer(env, {"inputs": [json_tensor(states_input([0.5]))]})
    assert ok.status_code == 200, ok.text


def test_tls_and_loopback_binding(tmp_path: Any) -> None:
    """With --tls-cert/--tls-key the REST binding speaks HTTPS with the same certificate (on
    the --listen host); without TLS it binds 127.0.0.1 even when gRPC listens everywhere."""
    bundle = make_bundle(tmp_path / "b", seed=5)
    certs = make_certs(tmp_path / "certs")
    tokens = make_tokens(tmp_path / "tokens.toml")
    import grpc

    creds = grpc.ssl_channel_credentials(root_certificates=certs.ca.read_bytes())
    with running(
        tmp_path,
        bundle,
        "--tls-cert",
        str(certs.server_cert),
        "--tls-key",
        str(certs.server_key),
        "--tokens-file",
        str(tokens.path),
        "--http-port",
        "0",
        health_creds=creds,
        name="tls",
    ) as sp:
        url = sp.rest_url("https")
        with httpx.Client(verify=ssl.create_default_context(cafile=str(certs.ca))) as c:
            assert c.get(url + "/v2/health/ready").json() == {"ready": True}
            r = c.post(
                url + "/v2/models/qveil/infer",
                json={"inputs": [json_tensor(states_input([0.5]))]},
                headers={"Authorization": f"Bearer {tokens.query}"},
            )
            assert r.status_code == 200, r.text
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https", "http") + "/v2/health/live", timeout=5)
    with running(
        tmp_path,
        bundle,
        "--listen",
        "0.0.0.0:0",
        "--insecure",
        "--tokens-file",
        str(tokens.path),
        "--http-port",
        "0",
        name="plain",
    ) as sp:
        assert sp.rest_url().startswith("http://")


def test_drain_turns_v2_readiness_off_first(tmp_path: Any) -> None:
    """SIGTERM: the v2 readiness probes (REST and gRPC ServerReady) answer not-ready at once
    while liveness and queries keep working for --drain-delay, then the process exits 0."""
    import signal
    import time

    import grpc
    from server_helpers import health_status, start_server

    from qveil.oip import grpc_predict_v2_pb2 as pb
    from qveil.oip import grpc_predict_v2_pb2_grpc as pb_grpc

    bundle = make_bundle(tmp_path / "b", seed=6)
    sp = start_server(tmp_path, bundle, "--http-port", "0", "--drain-delay", "5", name="drain")
    url = sp.rest_url()
    try:
        assert health_status(sp.target, "inference.GRPCInferenceService") == "SERVING"
        with grpc.insecure_channel(sp.target) as ch:
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            assert stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready
            assert httpx.get(url + "/v2/health/ready").status_code == 200
            sp.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 4
            while httpx.get(url + "/v2/health/ready").status_code == 200:
                assert time.monotonic() < deadline, "readiness stayed on after SIGTERM"
                time.sleep(0.05)
            assert not stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready
            assert not stub.ModelReady(pb.ModelReadyRequest(name="qveil"), timeout=5).ready
            assert httpx.get(url + "/v2/health/live").json() == {"live": True}
            r = httpx.post(
                url + "/v2/models/qveil/infer",
                json={"inputs": [json_tensor(states_input([0.5]))]},
            )
            assert r.status_code == 200, r.text  # still answering during the drain delay
    finally:
        code = sp.terminate()
    assert code == 0, sp.output()


def test_state_budget_is_shared_with_value_service(tmp_path: Any) -> None:
    """Quota parity: the v2 bindings spend the same per-caller state budget as ValueService
    (one bucket per token, whichever binding or connection), every state counted.
    With a bucket of 3 states: ValueService spends 2, a v2 request of 1 state is answered,
    then a v2 request is refused (HTTP 429, RESOURCE_EXHAUSTED, with Retry-After) even for a
    state asked before, and answers nothing."""
    bundle = make_bundle(tmp_path / "b", seed=6)
    tokens = make_tokens(tmp_path / "tokens.toml")
    with running(
        tmp_path,
        bundle,
        "--http-port",
        "0",
        "--state-rate",
        "0.001",
        "--state-burst",
        "3",
        "--tokens-file",
        str(tokens.path),
        name="quota",
    ) as sp:
        url = sp.rest_url() + "/v2/models/qveil/infer"
        head = {"Authorization": f"Bearer {tokens.query}"}
        states = [0.25, 0.5]
        with ValueClient(sp.target, token=tokens.query) as c:
            c.values(states)
        r = httpx.post(
            url, json={"inputs": [json_tensor(states_input([0.75]))]}, headers=head, timeout=30
        )
        assert r.status_code == 200, r.text
        from qveil.client import AdminClient

        with AdminClient(sp.target, token=tokens.admin) as ad:
            answered = ad.stats().states_answered
        for xs in ([0.25], [0.875]):  # asked before, and new: the same refusal
            r = httpx.post(
                url, json={"inputs": [json_tensor(states_input(xs))]}, headers=head, timeout=30
            )
            assert r.status_code == 429, r.text
            assert int(r.headers["retry-after"]) >= 900  # 1 state at 0.001/s: 1000 s
        with AdminClient(sp.target, token=tokens.admin) as ad:
            assert ad.stats().states_answered == answered


def test_unknown_and_inactive_release_ids_get_the_same_answer(env: Env) -> None:
    """A query token cannot learn whether a release id exists: a release the store holds but
    does not serve (registered here from the test) and an id nobody ever used get the same
    status and message (but for the id) on the v2 version path, v2 infer (REST and gRPC) and
    ValueService."""
    import grpc

    from qveil.client import FailedPreconditionError
    from qveil.server.store import open_store

    with open_store(f"sqlite:///{env.db}", create=False) as st:
        rec = st.releases.get_release(env.release)
        inactive = "a" * 32
        try:
            st.releases.get_release(inactive)
        except Exception:  # noqa: BLE001 - NotFound: register it, staged (never served)
            st.releases.create_release(
                release_id=inactive, fingerprint="f" * 64, sigma=rec.sigma, beta=rec.beta,
                interval=tuple(rec.interval), n_actions=rec.n_actions, status="staged",
            )  # fmt: skip
    unknown = "b" * 32

    def rest(version: str) -> tuple[int, str]:
        r = httpx.get(base(env) + f"/v2/models/qveil/versions/{version}", headers=auth(env))
        return r.status_code, r.text.replace(version, "ID")

    def rest_infer(version: str) -> tuple[int, str]:
        body = {"inputs": [json_tensor(states_input(np.array([0.5])))]}
        r = infer(env, body, version=version)
        return r.status_code, r.text.replace(version, "ID")

    def values(version: str) -> tuple[object, str]:
        with ValueClient(env.server.target, token=env.tokens.query) as c:
            with pytest.raises(FailedPreconditionError) as ei:
                c.get_values([0.5], release_id=version)
        return ei.value.code, str(ei.value).replace(version, "ID")

    def grpc_infer(version: str) -> tuple[object, str]:
        from qveil.oip import grpc_predict_v2_pb2 as v2
        from qveil.oip import grpc_predict_v2_pb2_grpc as v2_grpc

        req = v2.ModelInferRequest(model_name="qveil", model_version=version)
        t = req.inputs.add(name="STATE", datatype="FP64", shape=[1, 1])
        t.contents.fp64_contents.append(0.5)
        md = (("authorization", f"Bearer {env.tokens.query}"),)
        with grpc.insecure_channel(env.server.target) as ch:
            with pytest.raises(grpc.RpcError) as ei:
                v2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, metadata=md, timeout=30)
        return ei.value.code(), str(ei.value.details()).replace(version, "ID")

    for ask in (rest, rest_infer, values, grpc_infer):
        a, b = ask(inactive), ask(unknown)
        assert a == b, (ask.__name__, a, b)
        assert a[0] != 200 and a[0] != grpc.StatusCode.OK


def test_rest_follows_the_protocol_to_the_letter(env: Env) -> None:
    """GET /v2/ answers as /v2 (no redirect); the server metadata lists the binary tensor
    data extension it implements; a request id is echoed whole, and a non-string id is
    INVALID_ARGUMENT; an unknown path or method gets the JSON error object (404, 405); a
    missing credential's message speaks of the HTTP header."""
    meta = [httpx.get(base(env) + p, headers=auth(env)) for p in ("/v2", "/v2/")]
    assert [m.status_code for m in meta] == [200, 200] and meta[0].json() == meta[1].json()
    assert meta[0].json()["extensions"] == ["binary_tensor_data"]
    long_id = "x" * 1000
    body = {"id": long_id, "inputs": [json_tensor(states_input([0.3]))]}
    r = infer(env, body)
    assert r.status_code == 200 and r.json()["id"] == long_id
    for bad in (None, 7, {"a": 1}, ["x"]):
        r = infer(env, {"id": bad, "inputs": [json_tensor(states_input([0.3]))]})
        assert r.status_code == 400 and "id must be a string" in r.json()["error"], r.text
    for method, path, status in (
        ("GET", "/v2/nowhere", 404),
        ("DELETE", "/v2/models/qveil/infer", 405),
        ("GET", "/v2/models/qveil/infer", 405),
    ):
        r = httpx.request(method, base(env) + path, headers=auth(env))
        assert r.status_code == status, (method, path, r.text)
        assert r.headers["content-type"].startswith("application/json")
        assert "error" in r.json()
    anon = httpx.get(base(env) + "/v2/models/qveil")
    assert anon.status_code == 401 and "header" in anon.json()["error"]


def test_the_documented_curl_commands_work(env: Env) -> None:
    """docs/api.md's curl block, each command run by bash as written (TOKEN a query token;
    the address the test server's): the outputs its comments state."""
    block = doc_block("**curl** (`qveil serve", "bash")
    block = block.replace("127.0.0.1:8000", f"127.0.0.1:{env.http_port}")
    commands = ["curl" + c for c in block.split("\ncurl")]
    commands[0] = commands[0].removeprefix("curl")
    assert len(commands) == 4 and all(c.startswith("curl -s ") for c in commands), commands
    outs = []
    for cmd in commands:
        r = subprocess.run(
            ["bash", "-c", cmd],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "TOKEN": str(env.tokens.query)},
        )
        assert r.returncode == 0 and r.stderr == "", (cmd, r.stderr)
        outs.append(r.stdout)
    assert outs[0] == '{"ready":true}'
    meta = json.loads(outs[1])
    assert meta["name"] == "qveil" and meta["versions"] == [env.release]
    full, at = json.loads(outs[2]), json.loads(outs[3])
    assert [o["name"] for o in full["outputs"]] == ["Q", "BEST_ACTION"]
    q = full["outputs"][0]
    assert full["model_version"] == env.release and q["shape"] == [2, env.b.n_actions]
    assert [o["shape"] for o in at["outputs"]] == [[2]]
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        assert hexes(q["data"]) == hexes(c.values([0.3, 0.7]))
        assert full["outputs"][1]["data"] == c.best_actions([0.3, 0.7]).tolist()
        want = [c.values([0.3], [1])[0, 0], c.values([0.7], [0])[0, 0]]
    assert hexes(at["outputs"][0]["data"]) == hexes(want)
