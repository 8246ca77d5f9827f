"""The REST binding against the Open Inference Protocol's own OpenAPI description.

`tests/data/oip/open_inference_rest.yaml` is the protocol's official REST spec, vendored
verbatim (source URL and commit in tests/data/oip/README.md). Every response of a real
`qveil serve` (a subprocess, SQLite store, tokens) is validated against the response schema
that file documents for the operation and status (jsonschema, the spec's `components`
resolved from the file itself: no schema is written here):

* the operation is the spec path the URL matches, with the version segment optional and
  `/v2` the same as `/v2/`, as the protocol's text (inference_rest.md) writes them;
* a status the operation documents is validated against its schema (200: the success
  object; 400: the error object);
* an error status the YAML does not list (401, 404, 405, 413) must still carry the error
  object the protocol's text requires of every failed request ("A failed ... request must be
  indicated by an HTTP error status (typically 400). The HTTP body must contain the
  $..._error_response object"): the component of that operation named below.

The request bodies sent for the success cases are checked against the spec's
`inference_request` too (they are what any conforming client may send), and no rejected
request answers anything (the server's count of answered values does not move)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import pytest
import yaml
from oip_helpers import Env, bad_cases, hexes, serving_env, states_input

from qveil.client import ValueClient

SPEC_FILE = Path(__file__).resolve().parents[1] / "data" / "oip" / "open_inference_rest.yaml"
#: the protocol's error object of each operation (inference_rest.md; the YAML's components)
ERROR_OBJECT = {
    "get-v2": "metadata_server_error_response",
    "get-v2-models-$-modelName-versions-$-modelVersion": "metadata_model_error_response",
    "post-v2-models-$-MODEL_NAME-versions-$-MODEL_VERSION-infer": "inference_error_response",
}


class Spec:
    """The vendored OpenAPI document: operations by URL, response validation."""

    def __init__(self, path: Path) -> None:
        self.doc: dict[str, Any] = yaml.safe_load(path.read_text())
        assert self.doc["openapi"].startswith("3.0")
        self.routes: list[tuple[re.Pattern[str], str]] = []
        for template in self.doc["paths"]:
            rx = re.escape(template.rstrip("/"))
            rx = rx.replace(re.escape("/versions/${MODEL_VERSION}"), "(?:/versions/[^/]+)?")
            rx = rx.replace(re.escape("${MODEL_NAME}"), "[^/]+")
            self.routes.append((re.compile(rx + "/?"), template))

    def validator(self, schema: dict[str, Any]) -> jsonschema.protocols.Validator:
        """A validator of ``schema`` (a `$ref` into the file), whose references resolve
        against the file's own `components` (OpenAPI 3.0's schema objects: JSON Schema draft
        4 for every keyword the file uses)."""
        assert set(schema) == {"$ref"} and schema["$ref"].startswith("#/components/schemas/")
        return jsonschema.Draft4Validator({**schema, "components": self.doc["components"]})

    def component(self, name: str) -> dict[str, Any]:
        assert name in self.doc["components"]["schemas"], name
        return {"$ref": f"#/components/schemas/{name}"}

    def operation(self, method: str, url_path: str) -> dict[str, Any] | None:
        hits = [t for rx, t in self.routes if rx.fullmatch(url_path)]
        assert len(hits) <= 1, (url_path, hits)
        if not hits:
            return None
        op: dict[str, Any] | None = self.doc["paths"][hits[0]].get(method.lower())
        return op

    def response_schema(self, op: dict[str, Any], status: int) -> dict[str, Any] | None:
        """The schema the spec gives this operation's response of ``status``; for an error
        status it does not list, the operation's error object. None: no body schema."""
        documented = op["responses"].get(str(status))
        if documented is not None:
            content = documented.get("content")
            if content is None:
                return None
            schema: dict[str, Any] = content["application/json"]["schema"]
            return schema
        assert status >= 400, f"{op['operationId']}: status {status} is not in the spec"
        return self.component(ERROR_OBJECT[op["operationId"]])

    def check(self, method: str, url_path: str, r: httpx.Response) -> None:
        """``r`` conforms: JSON, and valid against the spec's schema for its status."""
        op = self.operation(method, url_path)
        assert r.headers["content-type"].split(";")[0] == "application/json", r.headers
        body = r.json()
        if op is None:  # no such operation (path or method): the protocol's error object
            assert r.status_code in (404, 405), (url_path, r.status_code)
            names = [n for n in self.doc["components"]["schemas"] if n.endswith("_error_response")]
            for name in names:
                self.validator(self.component(name)).validate(body)
            return
        schema = self.response_schema(op, r.status_code)
        if schema is not None:
            errors = list(self.validator(schema).iter_errors(body))
            assert not errors, (method, url_path, r.status_code, [e.message for e in errors])
        if r.status_code >= 400:
            # "The HTTP body must contain the $..._error_response object" (the text; the YAML's
            # inference_error_response leaves `error` out of `required`)
            assert isinstance(body.get("error"), str), body

    def valid_request(self, body: dict[str, Any]) -> None:
        self.validator(self.component("inference_request")).validate(body)


@pytest.fixture(scope="module")
def spec() -> Spec:
    return Spec(SPEC_FILE)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with serving_env(tmp_path_factory.mktemp("oip-spec")) as e:
        yield e


def call(
    env: Env,
    method: str,
    path: str,
    body: Any = None,
    *,
    role: str | None = "query",
    raw: bytes | None = None,
) -> httpx.Response:
    tok = env.tokens.of(role)
    headers = {"Authorization": f"Bearer {tok}"} if tok else {}
    if body is not None:
        raw = json.dumps(body).encode()
    if raw is not None:
        headers["Content-Type"] = "application/json"
    url = f"http://127.0.0.1:{env.http_port}{path}"
    return httpx.request(method, url, content=raw, headers=headers, timeout=30)


def tensor(spec: dict[str, Any]) -> dict[str, Any]:
    """An oip_helpers tensor spec as plain v2 JSON (floats from their hex)."""
    data = [float.fromhex(v) if isinstance(v, str) else v for v in spec["data"]]
    return {k: spec[k] for k in ("name", "datatype", "shape")} | {"data": data}


def test_the_vendored_spec_is_the_protocols_and_names_its_error_objects(spec: Spec) -> None:
    """The operations this test maps are the file's; where the YAML documents an error
    response (400), it is the error object named in ERROR_OBJECT."""
    ops = {
        op["operationId"]: op
        for item in spec.doc["paths"].values()
        for m, op in item.items()
        if m in ("get", "post")
    }
    assert set(ERROR_OBJECT) <= set(ops)
    for op_id, name in ERROR_OBJECT.items():
        bad = ops[op_id]["responses"].get("400")
        if bad is not None:
            ref = bad["content"]["application/json"]["schema"]["$ref"]
            assert ref == f"#/components/schemas/{name}"
    assert "open-inference-protocol" in spec.doc["info"]["description"]


def test_the_check_rejects_what_the_spec_forbids(spec: Spec) -> None:
    """The validation is not vacuous: bodies missing what the spec requires fail it."""
    meta_op = spec.operation("GET", "/v2/models/m")
    infer_op = spec.operation("POST", "/v2/models/m/infer")
    assert meta_op is not None and infer_op is not None
    meta = spec.response_schema(meta_op, 200)
    out = {"name": "Q", "datatype": "FP64", "shape": [1]}
    for schema, body in (
        (meta, {"name": "qveil"}),  # no platform
        (meta, {"name": "q", "platform": "p", "properties": {"n": 1}}),  # a property not a string
        (spec.response_schema(infer_op, 200), {"model_name": "q", "outputs": [out]}),  # no data
        (spec.response_schema(infer_op, 400), {"error": 7}),
        (spec.response_schema(meta_op, 404), {"message": "x"}),
    ):
        assert schema is not None
        with pytest.raises(jsonschema.ValidationError):
            spec.validator(schema).validate(body)


def test_success_responses_conform(env: Env, spec: Spec) -> None:
    rel = env.release
    for path in (
        "/v2/health/live",
        "/v2/health/ready",
        "/v2",
        "/v2/",
        "/v2/models/qveil/ready",
        f"/v2/models/qveil/versions/{rel}/ready",
        "/v2/models/qveil",
        f"/v2/models/qveil/versions/{rel}",
    ):
        r = call(env, "GET", path)
        assert r.status_code == 200, (path, r.text)
        spec.check("GET", path, r)
    meta = call(env, "GET", "/v2/models/qveil").json()
    assert meta["properties"]["release_id"] == rel

    xs = [0.3, -0.25, 1.5]
    state = tensor(states_input(xs))
    nested = {**state, "data": [[x] for x in xs]}
    fp32 = {**state, "datatype": "FP32", "data": [0.5, 0.25, 1.0]}
    action = {"name": "ACTION", "datatype": "INT64", "shape": [3], "data": [1, 0, 2]}
    bodies = [
        {"inputs": [state]},
        {"id": "r-1", "inputs": [nested], "parameters": {"temperature": 0.5, "n": 2}},
        {"inputs": [fp32], "outputs": [{"name": "BEST_ACTION"}]},
        {"inputs": [state, action]},
        {
            "inputs": [state, action],
            "outputs": [
                {"name": "Q", "parameters": {"binary_data": False}},
                {"name": "BEST_ACTION"},
            ],
            "parameters": {"binary_data_output": False},
        },
    ]
    for i, body in enumerate(bodies):
        spec.valid_request(body)
        for path in ("/v2/models/qveil/infer", f"/v2/models/qveil/versions/{rel}/infer"):
            r = call(env, "POST", path, body)
            assert r.status_code == 200, (i, path, r.text)
            spec.check("POST", path, r)
            doc = r.json()
            assert doc["model_name"] == "qveil" and doc["model_version"] == rel
            assert doc.get("id") == body.get("id")
    # the values are ValueService's, bit for bit
    q = call(env, "POST", "/v2/models/qveil/infer", bodies[0]).json()["outputs"][0]
    with ValueClient(env.server.target, token=env.tokens.query) as c:
        assert hexes(np.array(q["data"])) == hexes(c.values(xs))


def test_error_responses_conform_and_answer_nothing(env: Env, spec: Spec) -> None:
    before = env.answered()
    infer = "/v2/models/qveil/infer"
    cases: list[tuple[str, str, str, Any, bytes | None, str | None, int]] = []
    for label, op, code, _ in bad_cases(env):
        body: dict[str, Any] = {"inputs": [tensor(t) for t in op["inputs"]]}
        if "outputs" in op:
            body["outputs"] = [{"name": n} for n in op["outputs"]]
        model = op.get("model", "qveil")
        version = op.get("model_version", "")
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        status = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "NOT_FOUND": 404}[code]
        cases.append((label, "POST", path, body, None, "query", status))
    state = tensor(states_input([0.375]))
    cases += [
        ("not JSON", "POST", infer, None, b"{not json", "query", 400),
        ("no inputs", "POST", infer, None, b"{}", "query", 400),
        ("id not a string", "POST", infer, {"id": 7, "inputs": [state]}, None, "query", 400),
        ("no token", "POST", infer, {"inputs": [state]}, None, None, 401),
        ("bad token", "POST", infer, {"inputs": [state]}, None, "nope", 401),
        ("GET infer", "GET", infer, None, None, "query", 405),
        (
            "too large",
            "POST",
            infer,
            None,
            b'{"inputs": [' + b" " * (5 << 20) + b"]}",
            "query",
            413,
        ),
        ("metadata, other model", "GET", "/v2/models/resnet50", None, None, "query", 404),
        (
            "metadata, other version",
            "GET",
            "/v2/models/qveil/versions/x1",
            None,
            None,
            "query",
            400,
        ),
        ("metadata, no token", "GET", "/v2/models/qveil", None, None, None, 401),
        ("server metadata, no token", "GET", "/v2", None, None, None, 401),
        ("server metadata, POST", "POST", "/v2/", None, b"{}", "query", 405),
        ("no such path", "GET", "/v2/repository/index", None, None, "query", 404),
    ]
    for label, method, path, body, raw, role, status in cases:
        if role == "nope":
            r = httpx.request(
                method,
                f"http://127.0.0.1:{env.http_port}{path}",
                json=body,
                headers={"Authorization": "Bearer nope"},
                timeout=30,
            )
        else:
            r = call(env, method, path, body, role=role, raw=raw)
        assert r.status_code == status, (label, r.status_code, r.text)
        spec.check(method, path, r)
    assert env.answered() == before


def test_requests_the_spec_forbids_are_400_and_answer_nothing(env: Env, spec: Spec) -> None:
    """Each body breaks the spec's `inference_request` schema in one place (checked here
    against the file), is refused with 400 and the error object, and answers nothing, though
    its tensors would otherwise be answerable."""
    state = tensor(states_input([0.4375, 0.5625]))
    no = {k: v for k, v in state.items()}
    bodies = {
        "parameters not an object": {"inputs": [state], "parameters": 5},
        "parameters a list": {"inputs": [state], "parameters": ["binary_data_output"]},
        "input parameters not an object": {"inputs": [{**state, "parameters": "x"}]},
        "output not an object": {"inputs": [state], "outputs": ["Q"]},
        "output without a name": {"inputs": [state], "outputs": [{"parameters": {}}]},
        "output name not a string": {"inputs": [state], "outputs": [{"name": 1}]},
        "output parameters not an object": {
            "inputs": [state],
            "outputs": [{"name": "Q", "parameters": 3}],
        },
        "input name not a string": {"inputs": [{**state, "name": ["STATE"]}]},
        "input without a datatype": {"inputs": [{k: v for k, v in no.items() if k != "datatype"}]},
        "input without data": {"inputs": [{k: v for k, v in no.items() if k != "data"}]},
        "data not an array": {"inputs": [{**state, "shape": [1, 1], "data": 0.5}]},
        "inputs not an array": {"inputs": state},
    }
    before = env.answered()
    for label, body in bodies.items():
        assert not spec.validator(spec.component("inference_request")).is_valid(body), label
        r = call(env, "POST", "/v2/models/qveil/infer", body)
        assert r.status_code == 400, (label, r.status_code, r.text)
        spec.check("POST", "/v2/models/qveil/infer", r)
    assert env.answered() == before
    ok = call(env, "POST", "/v2/models/qveil/infer", {"inputs": [state]})
    assert ok.status_code == 200 and env.answered() == before + 2 * env.b.n_actions
