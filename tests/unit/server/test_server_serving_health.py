"""grpc.health.v1 of the server (qveil.server.serving.health) on a real grpc.aio server on port
0: unknown services are NOT_FOUND, every service follows set_serving, and a drain turns every
service NOT_SERVING for good and ends the open Watch streams (status OK) at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from qveil.server.serving.health import SERVICES, Health

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@asynccontextmanager
async def _serving(health: Health) -> AsyncIterator[health_pb2_grpc.HealthStub]:
    """A health stub to ``health``'s servicer on a real grpc.aio server on 127.0.0.1:0."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            yield health_pb2_grpc.HealthStub(ch)
    finally:
        await server.stop(0)


async def _check(stub: health_pb2_grpc.HealthStub, service: str = "") -> int:
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(resp.status)


def test_check_follows_set_serving_and_drain() -> None:
    async def main() -> None:
        health = Health()
        async with _serving(health) as stub:
            try:
                await _check(stub)
                raise AssertionError("a service never set is not found")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND
            await health.set_serving(False)
            assert [await _check(stub, s) for s in SERVICES] == [NOT_SERVING] * 5
            await health.set_serving(True)
            assert health.serving is True
            assert [await _check(stub, s) for s in SERVICES] == [SERVING] * 5
            try:
                await _check(stub, "qveil.v1.Nothing")
                raise AssertionError("an unknown service is not found")
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND
            await health.drain()
            assert health.serving is False
            assert await _check(stub) == NOT_SERVING
            await health.set_serving(True)  # ignored once draining
            assert health.serving is False and await _check(stub) == NOT_SERVING

    asyncio.run(main())


def test_a_drain_ends_open_watches_and_later_ones_at_once() -> None:
    async def main() -> None:
        health = Health()
        await health.set_serving(False)
        async with _serving(health) as stub:
            call = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
            seen = [int((await call.read()).status)]
            await health.set_serving(True)
            seen.append(int((await call.read()).status))
            await health.drain()
            seen.append(int((await call.read()).status))
            assert await call.read() == grpc.aio.EOF  # the stream ends
            assert await call.code() == grpc.StatusCode.OK
            assert seen == [NOT_SERVING, SERVING, NOT_SERVING]
            assert health.servicer.watchers == 0
            late = stub.Watch(health_pb2.HealthCheckRequest(service="x"), timeout=10)
            statuses = [int(r.status) async for r in late]
            # an unknown service: SERVICE_UNKNOWN, and the stream ends (draining)
            assert statuses == [health_pb2.HealthCheckResponse.SERVICE_UNKNOWN]
            assert await late.code() == grpc.StatusCode.OK

    asyncio.run(main())
