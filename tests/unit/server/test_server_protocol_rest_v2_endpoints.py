"""The v2 REST routes (qveil.server.protocol.rest.v2_endpoints) as an ASGI app over the data
plane of a real in-process server, called in-process by httpx: probes without a token, the
rest through the data plane with the query role, JSON and binary inference with the key's
values, a body over the limit refused (413) before anything is answered, unknown routes and
methods as JSON errors (over a real socket: test_server_protocol_rest_server.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
from server_helpers import Served, served_values

from qveil.server.protocol.rest.v2_endpoints import HEADER_LENGTH, build_app, call_context

XS = [0.3, -0.9, 1.7]


def _run(
    served: Served,
    body: Callable[[httpx.AsyncClient], Awaitable[None]],
    *,
    serving: bool = True,
    limit: int = 4096,
) -> None:
    app = build_app(served.server.plane, lambda: serving, max_body_bytes=limit)

    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 4321))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            await body(c)

    asyncio.run(main())


def _infer_doc(**extra: Any) -> dict[str, Any]:
    return {
        "inputs": [{"name": "STATE", "datatype": "FP64", "shape": [3, 1], "data": XS}],
        **extra,
    }


def test_probes_need_no_token_and_follow_readiness(served: Served) -> None:
    async def ready(c: httpx.AsyncClient) -> None:
        assert (await c.get("/v2/health/live")).json() == {"live": True}
        assert (await c.get("/v2/health/ready")).json() == {"ready": True}
        r = await c.get("/v2/models/qveil/ready")
        assert r.status_code == 200 and r.json() == {"name": "qveil", "ready": True}
        assert (await c.get("/v2/models/other/ready")).status_code == 503

    async def not_ready(c: httpx.AsyncClient) -> None:
        assert (await c.get("/v2/health/live")).status_code == 200
        r = await c.get("/v2/health/ready")
        assert r.status_code == 503 and r.json() == {"ready": False}
        assert (await c.get("/v2/models/qveil/ready")).status_code == 503

    _run(served, ready)
    _run(served, not_ready, serving=False)


def test_metadata_and_inference(served: Served) -> None:
    want = served_values(served.bundle, XS)
    auth = {"authorization": f"Bearer {served.tokens.query}"}

    async def body(c: httpx.AsyncClient) -> None:
        r = await c.get("/v2")
        assert r.status_code == 401 and r.json()["reason"] == "UNAUTHENTICATED"
        assert (await c.get("/v2/", headers=auth)).json()["name"] == "qveil"
        meta = (await c.get("/v2/models/qveil", headers=auth)).json()
        rid = meta["versions"][0]
        assert (await c.get(f"/v2/models/qveil/versions/{rid}", headers=auth)).status_code == 200
        r = await c.post("/v2/models/qveil/infer", json=_infer_doc(id="a"), headers=auth)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        doc = r.json()
        assert doc["id"] == "a" and doc["model_version"] == rid
        q = np.array(doc["outputs"][0]["data"])
        assert q.tobytes() == want.reshape(-1).tobytes()
        binary = _infer_doc(parameters={"binary_data_output": True})
        r = await c.post(f"/v2/models/qveil/versions/{rid}/infer", json=binary, headers=auth)
        n = int(r.headers[HEADER_LENGTH])
        head = json.loads(r.content[:n])
        size = head["outputs"][0]["parameters"]["binary_data_size"]
        assert r.content[n : n + size] == want.astype("<f8").tobytes()
        r = await c.post("/v2/models/qveil/versions/other/infer", json=_infer_doc(), headers=auth)
        assert r.status_code == 400 and r.json()["reason"] == "RELEASE_NOT_ACTIVE"
        r = await c.post("/v2/models/qveil/infer", content=b"{", headers=auth)
        assert r.status_code == 400 and r.json()["reason"] == "BAD_JSON"
        r = await c.post("/v2/models/nope/infer", json=_infer_doc(), headers=auth)
        assert r.status_code == 404 and "serves one model" in r.json()["error"]

    _run(served, body)


def test_a_body_over_the_limit_is_refused_before_it_is_read(served: Served) -> None:
    before = served.server.services.ctx.metrics.states_answered
    auth = {"authorization": f"Bearer {served.tokens.query}"}
    big = json.dumps(_infer_doc(pad="x" * 200)).encode()

    async def body(c: httpx.AsyncClient) -> None:
        r = await c.post("/v2/models/qveil/infer", content=big, headers=auth)
        assert r.status_code == 413 and r.json()["reason"] == "BODY_TOO_LARGE"
        assert "limit of 100 bytes" in r.json()["error"]

        async def chunks() -> Any:  # no content-length: counted while it streams in
            for i in range(0, len(big), 10):
                yield big[i : i + 10]

        r = await c.post("/v2/models/qveil/infer", content=chunks(), headers=auth)
        assert r.status_code == 413

    _run(served, body, limit=100)
    assert served.server.services.ctx.metrics.states_answered == before


def test_unknown_routes_and_methods_are_json_errors(served: Served) -> None:
    async def body(c: httpx.AsyncClient) -> None:
        r = await c.get("/v2/nothing")
        assert r.status_code == 404 and r.json() == {"error": "no such endpoint: GET /v2/nothing"}
        r = await c.get("/v2/models/qveil/infer")
        assert r.status_code == 405 and "method not allowed" in r.json()["error"]

    _run(served, body)


def test_the_call_context_of_a_request() -> None:
    def ctx(client: tuple[str, int] | None) -> Any:
        headers = {"authorization": "Bearer t"}
        req = SimpleNamespace(
            client=None if client is None else SimpleNamespace(host=client[0], port=client[1]),
            headers=headers,
        )
        return call_context(req)  # type: ignore[arg-type]

    c = ctx(("1.2.3.4", 80))
    assert (c.peer, c.authorization, c.protocol) == ("ipv4:1.2.3.4:80", "Bearer t", "rest")
    assert ctx(("::1", 9)).peer == "ipv6:[::1]:9" and ctx(None).peer == "http:unknown"
