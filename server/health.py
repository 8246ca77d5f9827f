"""grpc.health.v1 for the server: NOT_SERVING until the model and the store are verified,
SERVING while answering, NOT_SERVING again from the moment a drain (SIGTERM) begins."""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

__all__ = ["SERVICES", "Health"]

SERVICES = ("", "qveil.v1.ValueService", "qveil.v1.AdminService", "qveil.v1.AuditService")


class Health:
    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()
        self.serving = False

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in SERVICES:
            await self.servicer.set(name, status)
        self.serving = serving

    async def drain(self) -> None:
        """NOT_SERVING for every service, and stay so (later set() calls are ignored)."""
        self.serving = False
        await self.servicer.enter_graceful_shutdown()
