"""The v2 REST binding's HTTP server (qveil.server.protocol.rest.server): uvicorn on an
already bound TCP socket in the running event loop, its readiness following the data plane's
(the whole REST binding end to end: tests/integration/test_oip_rest.py)."""

from __future__ import annotations

import httpx


def test_rest_socket_is_tcp_for_nodelay() -> None:
    """The REST listener is created with proto IPPROTO_TCP: asyncio enables TCP_NODELAY on
    accepted connections only then (with proto 0 every response waited ~40 ms for the
    client's delayed ACK; measured 48 ms vs 1.3 ms per call). Readiness follows the data plane."""
    import asyncio
    import socket

    from qveil.server.protocol.dataplane import DataPlane, new_executor
    from qveil.server.protocol.rest.server import start_rest
    from qveil.server.serving.auth import Authorizer
    from qveil.server.serving.services import Services
    from qveil.server.serving.state import ReleaseHolder

    async def main() -> None:
        executor = new_executor(1)
        plane = DataPlane(
            Services.create(store=None, holder=ReleaseHolder()),
            Authorizer(None),
            executor,
        )
        rest = await start_rest(plane, lambda: True, host="127.0.0.1", port=0)
        try:
            assert rest.sock.proto == socket.IPPROTO_TCP
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{rest.port}") as c:
                assert (await c.get("/v2/health/live")).json() == {"live": True}
                assert (await c.get("/v2/health/ready")).status_code == 503  # not ready yet
                r = await c.post("/v2/models/qveil/infer", json={"inputs": []})
                assert r.status_code == 503 and r.json()["reason"] == "UNAVAILABLE"
        finally:
            await rest.stop(0)
            executor.shutdown()

    asyncio.run(main())
