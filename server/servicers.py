"""Thin grpc.aio servicers: authorize, bound concurrency, run the handler in the thread pool,
convert, map errors. No SQL and no math here (that is ``handlers``); no status-code choices
(that is ``errors.STATUS_TABLE``)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import numpy as np

from qveil.client import convert
from qveil.errors import ResourceExhausted, Unavailable
from qveil.server.auth import Authorizer
from qveil.server.errors import bad_argument, status_for
from qveil.server.handlers import Handlers, per_caller_bound
from qveil.server.quotas import caller_host
from qveil.v1 import admin_service_pb2 as admin_pb
from qveil.v1 import admin_service_pb2_grpc as admin_grpc
from qveil.v1 import audit_service_pb2 as audit_pb
from qveil.v1 import audit_service_pb2_grpc as audit_grpc
from qveil.v1 import value_service_pb2 as value_pb
from qveil.v1 import value_service_pb2_grpc as value_grpc

__all__ = ["AdminServicer", "AuditServicer", "Core", "ValueServicer"]

log = logging.getLogger("qveil.server")
R = TypeVar("R")

VALUE = "qveil.v1.ValueService"
#: methods whose answers are released values: padded to --min-latency-ms (issue 14 item 7)
PADDED = frozenset({"GetValues", "GetBestActions", "v2.ModelInfer"})
ADMIN = "qveil.v1.AdminService"
AUDIT = "qveil.v1.AuditService"


class Core:
    """What every servicer shares: handlers, authorizer, executor, readiness, in-flight bound."""

    def __init__(
        self, handlers: Handlers, authorizer: Authorizer, executor: ThreadPoolExecutor
    ) -> None:
        self.handlers = handlers
        self.authorizer = authorizer
        self.executor = executor
        self.ready = False
        #: Set when a drain's delay is over: new calls get UNAVAILABLE from us (see app.serve).
        self.closing = False
        self.in_flight = 0
        self.by_caller: dict[str, int] = {}  # in-flight calls per caller (event loop only)

    def _deadline(self, context: grpc.aio.ServicerContext) -> float | None:
        remaining = context.time_remaining()
        if remaining is None or remaining > 1e7:
            return None
        return time.monotonic() + remaining

    async def unary(
        self,
        service: str,
        method: str,
        context: grpc.aio.ServicerContext,
        fn: Callable[..., R],
        *args: Any,
        **kwargs: Any,
    ) -> R:
        start = time.perf_counter()
        code = "OK"
        caller: str | None = None
        try:
            caller = self._admit(service, context)
            self.by_caller[caller] = self.by_caller.get(caller, 0) + 1
            self.in_flight += 1
            self.handlers.metrics.in_flight = self.in_flight
            loop = asyncio.get_running_loop()
            if "deadline" in kwargs:
                kwargs["deadline"] = self._deadline(context)
            if "caller" in kwargs:  # the key of the caller's new-state budget
                kwargs["caller"] = budget_key(caller)
            result = await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))
            await self._pad(start, method, context)
            return result
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        except Exception as exc:  # noqa: BLE001 - every error goes through the one table
            mapped = status_for(exc, time_left=_time_left(context))
            code = mapped.code.name
            if mapped.code == grpc.StatusCode.INTERNAL:
                log.exception("internal error in %s", method)
            await self._pad(start, method, context)  # abort sends the status at once
            await context.abort(
                mapped.code, mapped.message, trailing_metadata=mapped.trailing_metadata
            )
            raise AssertionError("abort returned") from None
        finally:
            if caller is not None:
                left = self.by_caller[caller] - 1
                if left:
                    self.by_caller[caller] = left
                else:
                    del self.by_caller[caller]
                self.in_flight -= 1
                self.handlers.metrics.in_flight = self.in_flight
            self.handlers.metrics.observe(method, code, time.perf_counter() - start)

    async def _pad(self, start: float, method: str, context: grpc.aio.ServicerContext) -> None:
        """Hold a value-returning answer (or error) until the end of its latency bucket:
        ``min_latency_ms`` after the call arrived, or, for a call that took longer, the next
        whole multiple of it. Without it a stored state answers in ~1 ms and a new one in
        ~5 ms, which tells a client whether anyone asked about a state before; quantised,
        both answer at the same instant whenever the store's work fits in one bucket, and a
        slow call is visible only as a whole bucket later (docs/privacy.md,
        benchmarks/bench_timing.py). The call keeps its in-flight slot while it waits."""
        pad = self.handlers.limits.min_latency_ms
        if pad <= 0 or method not in PADDED:
            return
        quantum = pad / 1000.0
        elapsed = time.perf_counter() - start
        left = math.ceil(max(elapsed, 1e-9) / quantum) * quantum - elapsed
        cancelled = getattr(context, "cancelled", None)  # an HTTP request has none
        if left > 0 and not (cancelled is not None and cancelled()):
            await asyncio.sleep(left)

    def _admit(self, service: str, context: grpc.aio.ServicerContext) -> str:
        """Authorize and bound concurrency; return the caller's key for the per-caller count.

        A caller is its token when the server has a tokens file, else its connection (peer).
        Each caller may hold at most ``per_caller_bound`` calls in flight, below the global
        bound, so a client flooding the server is refused while others keep being served.
        """
        md = context.invocation_metadata() or ()
        authorization = next((v for k, v in md if k == "authorization"), None)
        principal = self.authorizer.authorize(
            service, authorization if isinstance(authorization, str) else None
        )
        if not self.ready:
            raise Unavailable("the server is starting: model and store not verified yet")
        if self.closing:
            raise Unavailable("the server is shutting down; retry (another replica)")
        limits = self.handlers.limits
        caller = (
            f"token:{principal.name}" if principal.role is not None else f"peer:{context.peer()}"
        )
        mine, per_caller = self.by_caller.get(caller, 0), per_caller_bound(limits)
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
        return caller

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no call is in flight (True) or ``timeout`` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        while self.in_flight:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    async def abort(
        self, context: grpc.aio.ServicerContext, method: str, exc: Exception, start: float
    ) -> None:
        mapped = status_for(exc, time_left=_time_left(context))
        if mapped.code == grpc.StatusCode.INTERNAL:
            log.error("internal error in %s", method, exc_info=exc)
        self.handlers.metrics.observe(method, mapped.code.name, time.perf_counter() - start)
        await context.abort(mapped.code, mapped.message, trailing_metadata=mapped.trailing_metadata)


def _time_left(context: grpc.aio.ServicerContext) -> float | None:
    """Seconds before the call's deadline (None: no deadline)."""
    remaining = context.time_remaining()
    if remaining is None or remaining > 1e7:
        return None
    return float(remaining)


def budget_key(caller: str) -> str:
    """The new-state budget's key of a caller: its token (``token:NAME``), or the peer's host
    without the port (``peer:ipv4:1.2.3.4``), so a new connection does not get a new bucket."""
    if caller.startswith("peer:"):
        return "peer:" + caller_host(caller.removeprefix("peer:"))
    return caller


def _floats(values: Any) -> np.ndarray:
    return np.fromiter(values, dtype=np.float64, count=len(values))


def _request_states(request: Any) -> np.ndarray:
    """The request's states: ``states`` (n,) for a 1-D client, or ``state_matrix`` (issue 16)
    as an (n, dims) array; both at once, or values not a multiple of dims, is
    INVALID_ARGUMENT (the handlers then check dims against the release)."""
    if not request.HasField("state_matrix"):
        return _floats(request.states)
    m = request.state_matrix
    if len(request.states):
        raise bad_argument(
            "give states or state_matrix, not both", field="states", reason="WRONG_DIMS"
        )
    d = int(m.dims)
    if d < 1 or len(m.values) % d:
        raise bad_argument(
            f"state_matrix has {len(m.values)} values, not a multiple of dims = {d}",
            field="state_matrix",
            reason="WRONG_DIMS",
        )
    return _floats(m.values).reshape(-1, d)


def _parsed(fn: Callable[..., R]) -> Callable[..., R]:
    """``fn`` called with the request's states parsed in the worker (so a malformed state
    matrix is INVALID_ARGUMENT through the one error table, nothing stored)."""

    def call(request: Any, *args: Any, **kwargs: Any) -> R:
        return fn(_request_states(request), *args, **kwargs)

    return call


class ValueServicer(value_grpc.ValueServiceServicer):
    def __init__(self, core: Core) -> None:
        self.core = core
        self.h = core.handlers

    async def GetValues(
        self,
        request: value_pb.GetValuesRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> value_pb.GetValuesResponse:
        result = await self.core.unary(
            VALUE,
            "GetValues",
            context,
            _parsed(self.h.get_values),
            request,
            list(request.actions),
            release_id=request.release_id,
            deadline=None,
            caller="",
        )
        return convert.values_to_proto(result)

    async def GetBestActions(
        self,
        request: value_pb.GetBestActionsRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> value_pb.GetBestActionsResponse:
        result = await self.core.unary(
            VALUE,
            "GetBestActions",
            context,
            _parsed(self.h.get_best_actions),
            request,
            release_id=request.release_id,
            deadline=None,
            caller="",
        )
        return convert.best_actions_to_proto(result)

    async def GetRelease(
        self,
        request: value_pb.GetReleaseRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> value_pb.GetReleaseResponse:
        rel = await self.core.unary(VALUE, "GetRelease", context, self.h.get_release)
        return value_pb.GetReleaseResponse(release=convert.release_to_proto(rel))


class AdminServicer(admin_grpc.AdminServiceServicer):
    def __init__(self, core: Core) -> None:
        self.core = core
        self.h = core.handlers

    async def ListReleases(
        self,
        request: admin_pb.ListReleasesRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> admin_pb.ListReleasesResponse:
        releases, active = await self.core.unary(
            ADMIN, "ListReleases", context, self.h.list_releases
        )
        return admin_pb.ListReleasesResponse(
            releases=[convert.release_to_proto(r) for r in releases], active_release_id=active
        )

    async def ActivateRelease(
        self,
        request: admin_pb.ActivateReleaseRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> admin_pb.ActivateReleaseResponse:
        rel, previous = await self.core.unary(
            ADMIN,
            "ActivateRelease",
            context,
            self.h.activate,
            request.release_id,
            request.bundle_path,
        )
        return admin_pb.ActivateReleaseResponse(
            release=convert.release_to_proto(rel), previous_release_id=previous
        )

    async def RetireRelease(
        self,
        request: admin_pb.RetireReleaseRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> admin_pb.RetireReleaseResponse:
        rel = await self.core.unary(
            ADMIN, "RetireRelease", context, self.h.retire, request.release_id
        )
        return admin_pb.RetireReleaseResponse(release=convert.release_to_proto(rel))

    async def GetStats(
        self,
        request: admin_pb.GetStatsRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> admin_pb.GetStatsResponse:
        stats = await self.core.unary(ADMIN, "GetStats", context, self.h.stats)
        return convert.stats_to_proto(stats)

    async def GetBudget(
        self,
        request: admin_pb.GetBudgetRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> admin_pb.GetBudgetResponse:
        reports = await self.core.unary(
            ADMIN, "GetBudget", context, self.h.budget, request.dataset_id
        )
        return convert.budget_to_proto(reports)

    async def GetAdminCard(
        self,
        request: admin_pb.GetAdminCardRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> admin_pb.GetAdminCardResponse:
        rid, public, admin = await self.core.unary(
            ADMIN, "GetAdminCard", context, self.h.admin_card, request.release_id
        )
        return admin_pb.GetAdminCardResponse(
            release_id=rid,
            admin_card_json=json.dumps(admin, sort_keys=True),
            card_json=json.dumps(public, sort_keys=True),
        )


class AuditServicer(audit_grpc.AuditServiceServicer):
    def __init__(self, core: Core) -> None:
        self.core = core
        self.h = core.handlers

    async def StreamNoisePoints(
        self,
        request: audit_pb.StreamNoisePointsRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[audit_pb.StreamNoisePointsResponse]:
        release_id, chunks = await self.core.unary(
            AUDIT,
            "StreamNoisePoints",
            context,
            self.h.noise_points,
            request.release_id,
            request.action,
        )
        # One dedicated thread walks the store's cursor (a DB cursor stays on one thread).
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="qveil-audit") as one:
            while True:
                try:
                    chunk = await loop.run_in_executor(one, next, chunks, None)
                except Exception as exc:  # noqa: BLE001
                    await self.core.abort(context, "StreamNoisePoints", exc, start)
                    return
                if chunk is None:
                    break
                yield audit_pb.StreamNoisePointsResponse(
                    release_id=release_id,
                    action=request.action,
                    points=[convert.noise_point_to_proto(p) for p in chunk],
                )
            await loop.run_in_executor(one, chunks.close)

    async def VerifyIntegrity(
        self,
        request: audit_pb.VerifyIntegrityRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> audit_pb.VerifyIntegrityResponse:
        action = request.action if request.HasField("action") else None
        result = await self.core.unary(
            AUDIT, "VerifyIntegrity", context, self.h.verify, request.release_id, action
        )
        return convert.integrity_to_proto(result)

    async def GetStatisticalReport(
        self,
        request: audit_pb.GetStatisticalReportRequest,  # noqa: N802
        context: grpc.aio.ServicerContext,
    ) -> audit_pb.GetStatisticalReportResponse:
        action = request.action if request.HasField("action") else None
        result = await self.core.unary(
            AUDIT, "GetStatisticalReport", context, self.h.report, request.release_id, action
        )
        return convert.report_to_proto(result)
