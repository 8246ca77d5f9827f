"""The real qveil server inside this process, for experiments and tests.

:class:`LocalServer` builds what ``qveil serve`` builds
(:func:`qveil.server.app.create_server`
with the value, admin, audit, health and v2 services over
:class:`~qveil.server.serving.services.Services` and a real store) and runs it on a background event
loop bound to ``127.0.0.1:0``. Clients reach it over loopback gRPC like any server, so what
they get is what a deployment answers: the released values, the mean plus the noise the
release's key gives each snapped state (:mod:`qveil.keyed`), the same bits as every other
copy of the release. It skips only the process concerns of ``qveil serve`` (signals,
draining, port files, TLS, REST). ``services`` (and ``services.ctx.metrics``: states
answered, new points logged) are exposed so a caller can show that its answers came from
here.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import TypeVar

import grpc

from qveil.server.app import create_server
from qveil.server.governance.closing import Closing
from qveil.server.protocol.dataplane import DataPlane, new_executor
from qveil.server.serving.auth import Authorizer, load_tokens
from qveil.server.serving.health import Health
from qveil.server.serving.limits import Limits
from qveil.server.serving.services import Services
from qveil.server.serving.state import ReleaseHolder
from qveil.server.store import open_store
from qveil.server.store.base import SamplePathStore

__all__ = ["LocalServer"]

T = TypeVar("T")


def _quiet_poller_shutdown(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """The loop's exception handler: drop one known-harmless report, pass the rest on.

    When the last grpc.aio object of the process stops, grpc closes its completion-queue
    poller's socket; a wake-up already scheduled on this loop then reads the closed socket
    and asyncio prints "Exception in callback ... PollerCompletionQueue._handle_events:
    OSError [Errno 9] Bad file descriptor". It happens at random during ``server.stop`` when a
    process starts and stops servers one after another (as an experiment does); the server
    has stopped by then and nothing is lost."""
    exc = context.get("exception")
    if isinstance(exc, OSError) and exc.errno == errno.EBADF:
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_name.endswith("PollerCompletionQueue._handle_events"):
                return
            tb = tb.tb_next
    loop.default_exception_handler(context)


class LocalServer(Closing):
    """The real grpc.aio server (``create_server``) on a background event loop, bound to
    127.0.0.1:0, over a real store (a URL opened here, or an open store: the answer log).
    ``plane``, ``health`` and ``services`` are exposed so tests can drive readiness and
    draining deterministically; ``start=False`` leaves the server NOT_SERVING."""

    server: grpc.aio.Server | None

    def __init__(
        self,
        bundle: Path | None,
        store_url: str | SamplePathStore,
        *,
        tokens: Path | None = None,
        max_batch: int = 4096,
        max_in_flight: int = 64,
        reflection: bool = False,
        start: bool = True,
    ) -> None:
        if isinstance(store_url, str):
            self.store = open_store(store_url)
        else:
            self.store = store_url
        self.executor = new_executor(4)
        self.services = Services.create(
            store=self.store,
            holder=ReleaseHolder(),
            limits=Limits(max_batch=max_batch, max_in_flight=max_in_flight),
        )
        self.answers = self.services.start_answer_log(self.store)
        self.plane = DataPlane(
            self.services, Authorizer(load_tokens(tokens) if tokens else None), self.executor
        )
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet_poller_shutdown)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

        async def build() -> tuple[grpc.aio.Server, int]:
            self.health = Health()
            await self.health.set_serving(False)
            server, port = create_server(
                self.plane, self.health, listen="127.0.0.1:0", reflection=reflection
            )
            await server.start()
            return server, port

        try:
            self.server, self.port = self.run(build())
            if bundle is not None and start:
                self.ready(bundle)
        except BaseException:
            self.close()
            raise

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def run(self, coro: Coroutine[object, object, T], timeout: float = 30.0) -> T:
        """Run a coroutine on the server's event loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def ready(self, bundle: Path) -> None:
        """Load, check the receipt, register and activate ``bundle`` (as ``qveil serve``
        does), then SERVING."""
        self.services.releases.start(bundle)
        self.plane.ready = True
        self.run(self.health.set_serving(True))

    def close(self) -> None:
        server: grpc.aio.Server | None = getattr(self, "server", None)
        if server is not None:
            self.run(server.stop(0))
            self.server = None
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()
        self.executor.shutdown(wait=True)
        self.answers.close()
        self.store.close()
