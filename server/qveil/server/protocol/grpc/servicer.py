"""Thin grpc.aio servicers of qveil's own services (ValueService, AdminService,
AuditService): each method turns the gRPC context into a :class:`CallContext`, calls the data
plane, converts the answer to protobuf, and maps an error through the one gRPC table
(:func:`qveil.common.errors.status_for`). No SQL, no math, no status-code
choices here."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from qveil.common import serde as convert
from qveil.common.errors import status_for
from qveil.errors import bad_argument
from qveil.noise import FEW
from qveil.server.protocol.dataplane import (
    ADMIN,
    AUDIT,
    Call,
    CallContext,
    DataPlane,
    ValuesQuery,
)
from qveil.v1 import admin_service_pb2 as admin_pb
from qveil.v1 import admin_service_pb2_grpc as admin_grpc
from qveil.v1 import audit_service_pb2 as audit_pb
from qveil.v1 import audit_service_pb2_grpc as audit_grpc
from qveil.v1 import value_service_pb2 as value_pb
from qveil.v1 import value_service_pb2_grpc as value_grpc

__all__ = [
    "AdminServicer",
    "Context",
    "AuditServicer",
    "ValueServicer",
    "abort",
    "answer",
    "call_context",
]

R = TypeVar("R")

#: The context of a call of any service on this server (the helpers below read its
#: metadata, peer and deadline, or abort it: its request and response types do not matter).
Context = grpc.aio.ServicerContext[object, object]


def _time_left(context: Context) -> float | None:
    """Seconds before the call's deadline (None: no deadline)."""
    remaining = context.time_remaining()
    if remaining is None or remaining > 1e7:
        return None
    return float(remaining)


def call_context(context: Context) -> CallContext:
    """The data plane's view of a gRPC call: peer, ``authorization`` metadata, deadline."""
    authorization = None
    for k, v in context.invocation_metadata() or ():
        if k == "authorization":
            authorization = v
            break
    left = _time_left(context)
    return CallContext(
        peer=context.peer(),
        authorization=authorization if isinstance(authorization, str) else None,
        deadline=None if left is None else time.monotonic() + left,
        cancelled=context.cancelled,
    )


async def abort(context: Context, exc: BaseException) -> NoReturn:
    """End the call with the status of ``exc`` (the one table)."""
    mapped = status_for(exc, time_left=_time_left(context))
    await context.abort(mapped.code, mapped.message, trailing_metadata=mapped.trailing_metadata)
    raise AssertionError("abort returned") from None


async def answer(context: Context, pending: Awaitable[R]) -> R:
    """The data plane's answer, or the call aborted with the status of its error."""
    try:
        return await pending
    except Exception as exc:  # noqa: BLE001 - every error goes through the one table
        await abort(context, exc)


def _floats(values: Sequence[float]) -> npt.NDArray[np.float64]:
    """A packed ``repeated double`` as an array, every bit kept: one copy of its buffer, not
    a Python float per value (or, for a few values, the values themselves)."""
    n = len(values)
    if n <= FEW:  # by iteration: cheaper than numpy's array discovery for a few values
        return np.fromiter(values, np.float64, n)
    return np.array(values, dtype=np.float64)


def _request_states(
    request: value_pb.GetValuesRequest | value_pb.GetBestActionsRequest,
) -> npt.NDArray[np.float64]:
    """The request's states: ``states`` (n,) for a 1-D client, or ``state_matrix`` as an
    (n, dims) array; both at once, or values not a multiple of dims, is INVALID_ARGUMENT
    (the query service then checks dims against the release)."""
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


def _query(
    request: value_pb.GetValuesRequest | value_pb.GetBestActionsRequest,
    actions: tuple[int, ...] = (),
) -> Callable[[], ValuesQuery]:
    """A decoder of the request, run by the data plane after admission (a malformed state
    matrix is INVALID_ARGUMENT through the one error table, nothing stored)."""

    def decode() -> ValuesQuery:
        return ValuesQuery(_request_states(request), actions, request.release_id)

    return decode


class ValueServicer(value_grpc.ValueServiceServicer):
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def GetValues(  # noqa: N802
        self, request: value_pb.GetValuesRequest, context: Context
    ) -> value_pb.GetValuesResponse:
        pending = self.plane.get_values(
            call_context(context), _query(request, tuple(request.actions))
        )
        return convert.values_to_proto(await answer(context, pending))

    async def GetBestActions(  # noqa: N802
        self, request: value_pb.GetBestActionsRequest, context: Context
    ) -> value_pb.GetBestActionsResponse:
        pending = self.plane.get_best_actions(call_context(context), _query(request))
        return convert.best_actions_to_proto(await answer(context, pending))

    async def GetRelease(  # noqa: N802
        self, request: value_pb.GetReleaseRequest, context: Context
    ) -> value_pb.GetReleaseResponse:
        rel = await answer(context, self.plane.get_release(call_context(context)))
        return value_pb.GetReleaseResponse(release=convert.release_to_proto(rel))


class _Service:
    """A servicer whose methods are one admitted call each of one of the server's services."""

    service = ""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    async def _call(self, method: str, context: Context, fn: Callable[[], R]) -> R:
        def run(_call: Call) -> R:
            return fn()

        return await answer(
            context, self.plane.call(self.service, method, call_context(context), run)
        )


class AdminServicer(_Service, admin_grpc.AdminServiceServicer):
    service = ADMIN

    def __init__(self, plane: DataPlane) -> None:
        super().__init__(plane)
        self.h = plane.services.releases

    async def ListReleases(  # noqa: N802
        self, request: admin_pb.ListReleasesRequest, context: Context
    ) -> admin_pb.ListReleasesResponse:
        releases, active = await self._call("ListReleases", context, self.h.list_releases)
        return admin_pb.ListReleasesResponse(
            releases=[convert.release_to_proto(r) for r in releases], active_release_id=active
        )

    async def ActivateRelease(  # noqa: N802
        self, request: admin_pb.ActivateReleaseRequest, context: Context
    ) -> admin_pb.ActivateReleaseResponse:
        rel, previous = await self._call(
            "ActivateRelease",
            context,
            lambda: self.h.activate(request.release_id, request.bundle_path),
        )
        return admin_pb.ActivateReleaseResponse(
            release=convert.release_to_proto(rel), previous_release_id=previous
        )

    async def RetireRelease(  # noqa: N802
        self, request: admin_pb.RetireReleaseRequest, context: Context
    ) -> admin_pb.RetireReleaseResponse:
        rel = await self._call("RetireRelease", context, lambda: self.h.retire(request.release_id))
        return admin_pb.RetireReleaseResponse(release=convert.release_to_proto(rel))

    async def GetStats(  # noqa: N802
        self, request: admin_pb.GetStatsRequest, context: Context
    ) -> admin_pb.GetStatsResponse:
        return convert.stats_to_proto(await self._call("GetStats", context, self.h.stats))

    async def GetBudget(  # noqa: N802
        self, request: admin_pb.GetBudgetRequest, context: Context
    ) -> admin_pb.GetBudgetResponse:
        reports = await self._call("GetBudget", context, lambda: self.h.budget(request.dataset_id))
        return convert.budget_to_proto(reports)

    async def GetAdminCard(  # noqa: N802
        self, request: admin_pb.GetAdminCardRequest, context: Context
    ) -> admin_pb.GetAdminCardResponse:
        rid, public, admin = await self._call(
            "GetAdminCard", context, lambda: self.h.admin_card(request.release_id)
        )
        return admin_pb.GetAdminCardResponse(
            release_id=rid,
            admin_card_json=json.dumps(admin, sort_keys=True),
            card_json=json.dumps(public, sort_keys=True),
        )


class AuditServicer(_Service, audit_grpc.AuditServiceServicer):
    service = AUDIT

    def __init__(self, plane: DataPlane) -> None:
        super().__init__(plane)
        self.h = plane.services.audit

    async def StreamNoisePoints(  # noqa: N802
        self, request: audit_pb.StreamNoisePointsRequest, context: Context
    ) -> AsyncIterator[audit_pb.StreamNoisePointsResponse]:
        release_id, chunks = await self._call(
            "StreamNoisePoints",
            context,
            lambda: self.h.noise_points(request.release_id, request.action),
        )
        # One dedicated thread walks the store's cursor (a DB cursor stays on one thread).
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="qveil-audit") as one:
            while True:
                try:
                    chunk = await loop.run_in_executor(one, next, chunks, None)
                except Exception as exc:  # noqa: BLE001
                    self.plane.observe_error("StreamNoisePoints", exc, start)
                    await abort(context, exc)
                if chunk is None:
                    break
                yield audit_pb.StreamNoisePointsResponse(
                    release_id=release_id,
                    action=request.action,
                    points=[convert.noise_point_to_proto(p) for p in chunk],
                )
            await loop.run_in_executor(one, chunks.close)

    async def VerifyIntegrity(  # noqa: N802
        self, request: audit_pb.VerifyIntegrityRequest, context: Context
    ) -> audit_pb.VerifyIntegrityResponse:
        action = request.action if request.HasField("action") else None
        result = await self._call(
            "VerifyIntegrity", context, lambda: self.h.verify(request.release_id, action)
        )
        return convert.integrity_to_proto(result)

    async def GetStatisticalReport(  # noqa: N802
        self, request: audit_pb.GetStatisticalReportRequest, context: Context
    ) -> audit_pb.GetStatisticalReportResponse:
        action = request.action if request.HasField("action") else None
        result = await self._call(
            "GetStatisticalReport", context, lambda: self.h.report(request.release_id, action)
        )
        return convert.report_to_proto(result)
