"""grpc.health.v1 for the server: NOT_SERVING until the model and the store are verified,
SERVING while answering, NOT_SERVING again from the moment a drain (SIGTERM) begins.

Our own servicer rather than grpc_health's reference one, for one reason: a drain must end
open ``Watch`` streams. A ``Watch`` is an RPC in flight, so grpc.aio's ``server.stop(grace)``
would wait the whole grace period for it and then cancel every call still running. On
:meth:`Health.drain`, each watcher is sent NOT_SERVING and its stream ends with status OK; a
``Watch`` opened after that gets NOT_SERVING and ends at once.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["SERVICES", "Health"]

SERVICES = (
    "",
    "qveil.v1.ValueService",
    "qveil.v1.AdminService",
    "qveil.v1.AuditService",
    "inference.GRPCInferenceService",  # the Open Inference Protocol (KServe v2)
)
Status = health_pb2.HealthCheckResponse.ServingStatus
# a ServingStatus value (the generated enum is an int; its stubs type it as an int)
StatusValue = int
# the context of a grpc.health.v1 call
_Context = grpc.aio.ServicerContext[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]


class _Servicer(health_pb2_grpc.HealthServicer):
    """Check and Watch over one status table and one condition (event loop only)."""

    def __init__(self) -> None:
        self.status: dict[str, StatusValue] = {}
        self.changed = asyncio.Condition()
        self.closed = False
        self.watchers = 0

    async def Check(  # noqa: N802 - gRPC method name
        self, request: health_pb2.HealthCheckRequest, context: _Context
    ) -> health_pb2.HealthCheckResponse:

        status = self.status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(  # noqa: N802 - gRPC method name
        self, request: health_pb2.HealthCheckRequest, context: _Context
    ) -> None:
        last: StatusValue | None = None
        self.watchers += 1
        try:
            async with self.changed:
                while True:
                    status = self.status.get(
                        request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
                    )
                    if status != last:
                        await context.write(health_pb2.HealthCheckResponse(status=status))
                        last = status
                    if self.closed:
                        return  # draining: the stream ends (OK) instead of holding shutdown
                    await self.changed.wait()
        finally:
            self.watchers -= 1

    async def set(self, service: str, status: StatusValue) -> None:
        async with self.changed:
            self.status[service] = status
            self.changed.notify_all()


class Health:
    def __init__(self) -> None:
        self.servicer = _Servicer()
        self.serving = False

    async def set_serving(self, serving: bool) -> None:
        """SERVING or NOT_SERVING for every service; ignored once a drain has begun."""
        if self.servicer.closed:
            return
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in SERVICES:
            await self.servicer.set(name, status)
        self.serving = serving

    async def drain(self) -> None:
        """NOT_SERVING for every service, for good, and end every open Watch stream."""
        self.serving = False
        async with self.servicer.changed:
            for name in SERVICES:
                self.servicer.status[name] = health_pb2.HealthCheckResponse.NOT_SERVING
            self.servicer.closed = True
            self.servicer.changed.notify_all()
