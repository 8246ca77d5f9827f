"""The data plane: what every call of every transport goes through, in no transport's types.

ValueService and the v2 servicer over gRPC (``qveil.server.protocol.grpc``) and the v2 REST
endpoints (``qveil.server.protocol.rest``) each turn their request into a
:class:`CallContext` (who is calling, with which credential, until when) and a decoder of the
request, call one method here, and map what it raises to their own status through their one
error table. Nothing here knows gRPC or HTTP.

One call, whatever the transport:

1. **Admission.** The credential is authorized for the service (``auth``; the caller's role);
   a server that is starting or shutting down refuses (UNAVAILABLE); the call is bounded by
   the calls in flight, globally and per caller (RESOURCE_EXHAUSTED).
2. **Work.** The request is decoded and the query service answers it, with the caller's
   quota key and the call's deadline: a call of at most ``INLINE_MAX_STATES`` states on the
   event loop (pure computation: the release's model and keyed noise, no store, no lock),
   a larger one in the executor, so the loop stays free for other calls.
3. **Metrics.** Every call is observed with its canonical code (``qveil.errors.error_status``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from qveil.common import typing as t
from qveil.errors import ResourceExhausted, Unavailable, error_status
from qveil.server.protocol.v2_model import (
    SERVER_NAME,
    InferRequest,
    InferResponse,
    ModelMetadata,
    OIPModel,
    ServerMetadata,
)
from qveil.server.serving.auth import Authorizer
from qveil.server.serving.limits import per_caller_bound
from qveil.server.serving.logs import ACCESS, AUTH, access_line
from qveil.server.serving.quotas import caller_host
from qveil.server.serving.services import Services
from qveil.version import __version__

__all__ = [
    "ADMIN",
    "AUDIT",
    "VALUE",
    "Call",
    "CallContext",
    "DataPlane",
    "ValuesQuery",
    "new_executor",
]

log = logging.getLogger("qveil.server")
R = TypeVar("R")

VALUE = "qveil.v1.ValueService"
ADMIN = "qveil.v1.AdminService"
AUDIT = "qveil.v1.AuditService"
#: the Open Inference Protocol extensions this server implements
EXTENSIONS = ["binary_tensor_data"]
#: values calls of up to this many states are answered on the event loop (no hand-off to the
#: executor); larger ones run in an executor thread and keep the loop free for other calls
INLINE_MAX_STATES = 64


def _never() -> bool:
    return False


class CallContext(NamedTuple):
    """One call as a transport hands it over."""

    #: the connection, in gRPC's peer form (``ipv4:1.2.3.4:5678``, ``ipv6:[::1]:5678``)
    peer: str
    #: the credential as sent (``Bearer <token>``); None: anonymous
    authorization: str | None = None
    #: ``time.monotonic()`` at which the caller stops waiting; None: no deadline
    deadline: float | None = None
    #: whether the caller has gone away
    cancelled: Callable[[], bool] = _never
    #: the transport ("grpc" or "rest"): a label of the metrics and the access log
    protocol: str = "grpc"


class Call(NamedTuple):
    """An admitted call, as the work sees it."""

    #: the key of the caller's quota: its token (``token:NAME``) or its host
    caller: str
    #: the caller's role (None: anonymous, no tokens file)
    role: str | None
    deadline: float | None


class ValuesQuery(NamedTuple):
    """A decoded GetValues / GetBestActions request."""

    states: npt.NDArray[np.float64]
    actions: tuple[int, ...] = ()
    release_id: str = ""


def _once(decode: Callable[[], ValuesQuery]) -> Callable[[], ValuesQuery]:
    """``decode``, run at most once (on the event loop or in the executor)."""
    decoded: list[ValuesQuery] = []

    def query() -> ValuesQuery:
        if not decoded:
            decoded.append(decode())
        return decoded[0]

    return query


@functools.lru_cache(maxsize=4096)
def budget_key(caller: str) -> str:
    """The quota's key of a caller: its token (``token:NAME``), or the peer's host
    without the port (``peer:ipv4:1.2.3.4``), so a new connection does not get a new bucket."""
    if caller.startswith("peer:"):
        return "peer:" + caller_host(caller.removeprefix("peer:"))
    return caller


class DataPlane:
    """Admission, execution and metrics of every call, and the query endpoints."""

    def __init__(
        self, services: Services, authorizer: Authorizer, executor: ThreadPoolExecutor
    ) -> None:
        #: the server's services; the data plane's own endpoints use the query service only
        self.services = services
        self.query = services.query
        self.model = OIPModel(services.query)
        self.metrics = services.ctx.metrics
        self.limits = services.ctx.limits
        self.authorizer = authorizer
        self.executor = executor
        self.ready = False
        #: Set when a drain's delay is over: new calls get UNAVAILABLE (see app.serve).
        self.closing = False
        self.in_flight = 0
        self.by_caller: dict[str, int] = {}  # in-flight calls per caller (event loop only)

    # ------------------------------------------------------------------ query endpoints
    def _route(
        self, query: Callable[[], ValuesQuery]
    ) -> tuple[Callable[[Call], t.Values], Callable[[Call], t.Values | None]]:
        """The two ways of answering a values call, over one parse of the request: ``inline``
        (on the event loop, when it holds at most INLINE_MAX_STATES states; else None) and
        ``run`` (in an executor thread). Both compute the same answer."""

        def run(call: Call) -> t.Values:
            q = query()
            parsed = self.query.parse(q.states, q.actions, release_id=q.release_id)
            return self.query.values(parsed, deadline=call.deadline, caller=call.caller)

        def inline(call: Call) -> t.Values | None:
            if query().states.shape[0] > INLINE_MAX_STATES:
                return None
            return run(call)

        return run, inline

    async def get_values(self, ctx: CallContext, decode: Callable[[], ValuesQuery]) -> t.Values:
        run, inline = self._route(_once(decode))
        return await self.call(VALUE, "GetValues", ctx, run, inline=inline)

    async def get_best_actions(
        self, ctx: CallContext, decode: Callable[[], ValuesQuery]
    ) -> t.BestActions:
        """GetBestActions: the values of every action (answered as GetValues is), then each
        state's best."""
        run, inline = self._route(_once(decode))
        best = self.query.best_actions

        def run_best(call: Call) -> t.BestActions:
            return best(run(call))

        def inline_best(call: Call) -> t.BestActions | None:
            v = inline(call)
            return None if v is None else best(v)

        return await self.call(VALUE, "GetBestActions", ctx, run_best, inline=inline_best)

    async def get_release(self, ctx: CallContext) -> t.Release:
        return await self.call(VALUE, "GetRelease", ctx, lambda _c: self.query.get_release())

    async def infer(self, ctx: CallContext, decode: Callable[[], InferRequest]) -> InferResponse:
        """v2 ModelInfer; ``decode`` runs after admission, so a bad body is refused like
        any other bad input of an authorized caller."""

        def run(call: Call) -> InferResponse:
            return self.model.infer(decode(), deadline=call.deadline, caller=call.caller)

        return await self.call(VALUE, "v2.ModelInfer", ctx, run)

    async def model_metadata(self, ctx: CallContext, name: str, version: str) -> ModelMetadata:
        return await self.call(
            VALUE, "v2.ModelMetadata", ctx, lambda _c: self.model.metadata(name, version)
        )

    async def server_metadata(self, ctx: CallContext) -> ServerMetadata:
        def meta(_c: Call) -> ServerMetadata:
            # Triton's binary tensor data (REST: Inference-Header-Content-Length)
            return {"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS}

        return await self.call(VALUE, "v2.ServerMetadata", ctx, meta)

    def model_ready(self, name: str, version: str = "") -> bool:
        """v2 model readiness (no token needed, like grpc.health.v1)."""
        return bool(self.ready and self.model.ready(name, version))

    # ------------------------------------------------------------------ every call
    async def call(
        self,
        service: str,
        method: str,
        ctx: CallContext,
        fn: Callable[[Call], R],
        *,
        inline: Callable[[Call], R | None] | None = None,
    ) -> R:
        """Admit the call, run ``fn`` in the executor and observe it. Raises what admission
        or ``fn`` raised (domain exceptions); the transport maps it. ``inline``: work that
        never blocks (a small values call: pure computation), run on the event loop first,
        saving the executor hand-off; its None means "not that kind of request" and ``fn``
        runs in the executor as usual."""
        start = time.perf_counter()
        code = "OK"
        key: str | None = None
        result: R | None = None
        try:
            key, role = self._admit(service, ctx)
            self._enter(key)
            call = Call(caller=budget_key(key), role=role, deadline=ctx.deadline)
            result = None if inline is None else inline(call)
            if result is None:
                loop = asyncio.get_running_loop()
                result = await loop.run_in_executor(self.executor, fn, call)
            return result
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except Exception as exc:
            code = error_status(exc).code
            if code == "INTERNAL":
                log.exception("internal error in %s", method)
            elif code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
                AUTH.warning(
                    "%s refused: %s from %s (%s)",
                    method,
                    code,
                    caller_host(ctx.peer),
                    ctx.protocol,
                    extra={"fields": {"method": method, "code": code, "peer": ctx.peer}},
                )
            raise
        finally:
            if key is not None:
                self._leave(key)
            seconds = time.perf_counter() - start
            self.metrics.observe(method, code, seconds, ctx.protocol)
            self._access(method, ctx, key, code, result, seconds)

    def _access(
        self, method: str, ctx: CallContext, key: str | None, code: str, result: object, secs: float
    ) -> None:
        """The call's access-log line (when ``--access-log`` is on): no state or value."""
        if ACCESS.disabled or not ACCESS.isEnabledFor(logging.INFO):
            return
        rel = self.query.holder.peek()
        values = result.values if isinstance(result, t.Values | t.BestActions) else None
        access_line(
            method=method,
            protocol=ctx.protocol,
            caller=budget_key(key) if key is not None else "peer:" + caller_host(ctx.peer),
            release=rel.release_id if rel is not None else "-",
            code=code,
            states=len(values) if values is not None else "-",
            ms=round(secs * 1000.0, 3),
        )

    def observe_error(self, method: str, exc: BaseException, start: float) -> None:
        """Observe a call that failed after :meth:`call` returned (a stream's later message)."""
        code = error_status(exc).code
        if code == "INTERNAL":
            log.error("internal error in %s", method, exc_info=exc)
        self.metrics.observe(method, code, time.perf_counter() - start)

    def _enter(self, key: str) -> None:
        self.by_caller[key] = self.by_caller.get(key, 0) + 1
        self.in_flight += 1
        self.metrics.in_flight = self.in_flight

    def _leave(self, key: str) -> None:
        left = self.by_caller[key] - 1
        if left:
            self.by_caller[key] = left
        else:
            del self.by_caller[key]
        self.in_flight -= 1
        self.metrics.in_flight = self.in_flight

    def _admit(self, service: str, ctx: CallContext) -> tuple[str, str | None]:
        """Authorize and bound concurrency; return the caller's key for the per-caller count
        and its role.

        A caller is its token when the server has a tokens file, else its connection (peer).
        Each caller may hold at most ``per_caller_bound`` calls in flight, below the global
        bound, so a client flooding the server is refused while others keep being served.
        """
        principal = self.authorizer.authorize(service, ctx.authorization)
        if not self.ready:
            raise Unavailable("the server is starting: model and store not verified yet")
        if self.closing:
            raise Unavailable("the server is shutting down; retry (another replica)")
        limits = self.limits
        key = f"token:{principal.name}" if principal.role is not None else f"peer:{ctx.peer}"
        mine, per_caller = self.by_caller.get(key, 0), per_caller_bound(limits)
        if mine >= per_caller:
            raise ResourceExhausted(
                f"this caller has {mine} calls in flight, the per-caller bound is "
                f"{per_caller}; retry shortly"
            )
        if self.in_flight >= limits.max_in_flight:
            raise ResourceExhausted(
                f"{self.in_flight} calls in flight, the bound is "
                f"{limits.max_in_flight}; retry shortly"
            )
        return key, principal.role

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no call is in flight (True) or ``timeout`` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        while self.in_flight:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True


def new_executor(workers: int) -> ThreadPoolExecutor:
    """The thread pool the data plane runs large calls in."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qveil-query")
