"""Blocking clients: :class:`ValueClient` (query role), :class:`AdminClient`,
:class:`AuditClient`. Each is a context manager around one gRPC channel; failed calls raise
the typed exceptions of :mod:`qveil.common.errors`; idempotent calls are retried on
RESOURCE_EXHAUSTED and UNAVAILABLE as the server's pushback says (:class:`RetryPolicy`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from functools import cached_property
from typing import Self, TypeVar

import grpc
import numpy as np
import numpy.typing as npt
from google.protobuf.message import Message

from qveil.client import calls
from qveil.client.calls import StateFields, is_flat, state_fields
from qveil.client.channel import Connection, RetryPolicy, TLSConfig
from qveil.common import serde as convert
from qveil.common import typing as t
from qveil.common.errors import from_grpc_error
from qveil.json_types import JSONObject
from qveil.v1 import admin_service_pb2 as admin_pb
from qveil.v1 import admin_service_pb2_grpc as admin_grpc
from qveil.v1 import audit_service_pb2 as audit_pb
from qveil.v1 import audit_service_pb2_grpc as audit_grpc
from qveil.v1 import value_service_pb2_grpc as value_grpc

__all__ = ["AdminClient", "AuditClient", "ValueClient", "is_flat", "state_fields"]

R = TypeVar("R")
M = TypeVar("M", bound=Message)


class _DefaultTimeout:
    def __repr__(self) -> str:
        return "default_timeout"


#: ``timeout`` not given: the client class's ``default_timeout``
DEFAULT_TIMEOUT = _DefaultTimeout()


class _Base:
    """One gRPC channel to ``target`` (plaintext, or TLS / mutual TLS by ``tls``) with a
    bearer ``token``. ``timeout``: the deadline of one call in seconds, every retry
    included (None: none), by default the class's ``default_timeout``; ``retry``: the
    :class:`RetryPolicy` (default: its defaults)."""

    default_timeout: float = 30.0

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float | None | _DefaultTimeout = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        if isinstance(timeout, _DefaultTimeout):
            timeout = self.default_timeout
        self._conn = Connection.of(target, token=token, tls=tls, timeout=timeout, retry=retry)
        self.target = target
        self._channel = self._conn.channel()

    def _call(
        self,
        method: Callable[..., R],
        request: Message,
        *,
        idempotent: bool = True,
        timeout: float | None = None,
    ) -> R:
        """One call; the channel's retry policy retries RESOURCE_EXHAUSTED and UNAVAILABLE
        (honouring the server's pushback), this loop a call the server reset while shutting
        down. Both within the policy's attempts and one deadline for the whole call."""
        attempts = self._conn.attempts(idempotent)
        deadline = self._conn.deadline(timeout)
        for attempt in range(attempts):
            try:
                return method(
                    request, timeout=self._conn.left(deadline), metadata=self._conn.metadata
                )
            except grpc.RpcError as exc:
                wait = self._conn.reset_wait(exc, attempt, attempts)
                if wait is None:
                    raise from_grpc_error(exc) from None
                time.sleep(wait)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ValueClient(_Base):
    """Query the released values of a qveil server.

    >>> with ValueClient("127.0.0.1:50051") as c:          # doctest: +SKIP
    ...     q = c.values([0.1, 0.5])                        # shape (2, m)
    ...     a = c.best_actions([0.1, 0.5])                  # shape (2,)

    States are an [n, d] array, or for a 1-D release a flat list of n states. A flat list
    of d numbers on a release of d > 1 coordinates is one state: the client learns the
    active release's ``dims`` (one GetRelease) the first time it is given a flat list, and
    keeps it for its lifetime.
    """

    _dims: int | None = None

    def _state_fields(self, states: npt.ArrayLike) -> StateFields:
        if self._dims is None and is_flat(states):
            self._dims = self.release().dims
        return state_fields(states, self._dims or 1)

    @cached_property
    def _stub(self) -> value_grpc.ValueServiceStub:
        return value_grpc.ValueServiceStub(self._channel)

    def _run(self, call: calls.Call[M, R], timeout: float | None) -> R:
        return call.decode(
            self._call(getattr(self._stub, call.method), call.request, timeout=timeout)
        )

    def get_values(
        self,
        states: npt.ArrayLike,
        actions: Sequence[int] | None = None,
        *,
        release_id: str = "",
        timeout: float | None = None,
    ) -> t.Values:
        """Released values with the answering release and the action columns."""
        call = calls.get_values(self._state_fields(states), actions, release_id)
        return self._run(call, timeout)

    def values(
        self,
        states: npt.ArrayLike,
        actions: Sequence[int] | None = None,
        *,
        timeout: float | None = None,
    ) -> npt.NDArray[np.float64]:
        """Array (n_states, n_actions) of released values Q(s, a) + g_a(s) (all actions when
        ``actions`` is None, else those columns in that order)."""
        return self.get_values(states, actions, timeout=timeout).values

    def get_best_actions(
        self, states: npt.ArrayLike, *, release_id: str = "", timeout: float | None = None
    ) -> t.BestActions:
        return self._run(calls.get_best_actions(self._state_fields(states), release_id), timeout)

    def best_actions(
        self, states: npt.ArrayLike, *, timeout: float | None = None
    ) -> npt.NDArray[np.int64]:
        """The argmax action of the released values, one per state."""
        return self.get_best_actions(states, timeout=timeout).actions

    def release(self, *, timeout: float | None = None) -> t.Release:
        """The public card of the active release."""
        return self._run(calls.get_release(), timeout)


class AdminClient(_Base):
    """Admin role: list, activate and retire releases; server stats."""

    default_timeout = 120.0

    @cached_property
    def _stub(self) -> admin_grpc.AdminServiceStub:
        return admin_grpc.AdminServiceStub(self._channel)

    def list_releases(self) -> tuple[list[t.Release], str]:
        resp = self._call(self._stub.ListReleases, admin_pb.ListReleasesRequest())
        return [convert.release_from_proto(r) for r in resp.releases], resp.active_release_id

    def activate(self, release_id: str = "", *, bundle_path: str = "") -> tuple[t.Release, str]:
        """Activate a release; returns (the new active release, the previous release id)."""
        resp = self._call(
            self._stub.ActivateRelease,
            admin_pb.ActivateReleaseRequest(release_id=release_id, bundle_path=bundle_path),
            idempotent=False,
        )
        return convert.release_from_proto(resp.release), resp.previous_release_id

    def retire(self, release_id: str) -> t.Release:
        resp = self._call(
            self._stub.RetireRelease,
            admin_pb.RetireReleaseRequest(release_id=release_id),
            idempotent=False,
        )
        return convert.release_from_proto(resp.release)

    def stats(self) -> t.ServerStats:
        return convert.stats_from_proto(self._call(self._stub.GetStats, admin_pb.GetStatsRequest()))

    def budget(self, dataset_id: str = "") -> list[JSONObject]:
        """Privacy budgets of one dataset (empty: all) from the server's ledger, as
        ``qveil admin budget --json`` prints them (spent, cap, remaining, every event)."""
        resp = self._call(self._stub.GetBudget, admin_pb.GetBudgetRequest(dataset_id=dataset_id))
        return convert.budget_from_proto(resp)

    def admin_card(self, release_id: str = "") -> JSONObject:
        """The admin card of a release (empty id: the active one): ``card_admin.json``, what
        the public card leaves out (weights hash, measured Lipschitz constants, layout, ...)."""

        resp = self._call(
            self._stub.GetAdminCard, admin_pb.GetAdminCardRequest(release_id=release_id)
        )
        card: JSONObject = json.loads(resp.admin_card_json)
        return card


class AuditClient(_Base):
    """Auditor role: stored noise points, integrity verification, statistical report."""

    default_timeout = 300.0

    @cached_property
    def _stub(self) -> audit_grpc.AuditServiceStub:
        return audit_grpc.AuditServiceStub(self._channel)

    def noise_points(self, action: int, *, release_id: str = "") -> Iterator[t.NoisePoint]:
        """Stored points of one action in insertion order (streamed)."""
        req = audit_pb.StreamNoisePointsRequest(release_id=release_id, action=action)
        try:
            for chunk in self._stub.StreamNoisePoints(
                req, timeout=self._conn.timeout, metadata=self._conn.metadata
            ):
                for p in chunk.points:
                    yield convert.noise_point_from_proto(p)
        except grpc.RpcError as exc:
            raise from_grpc_error(exc) from None

    def verify(self, *, release_id: str = "", action: int | None = None) -> t.IntegrityResult:
        req = audit_pb.VerifyIntegrityRequest(release_id=release_id)
        if action is not None:
            req.action = action
        return convert.integrity_from_proto(self._call(self._stub.VerifyIntegrity, req))

    def report(self, *, release_id: str = "", action: int | None = None) -> t.StatisticalReport:
        req = audit_pb.GetStatisticalReportRequest(release_id=release_id)
        if action is not None:
            req.action = action
        return convert.report_from_proto(self._call(self._stub.GetStatisticalReport, req))
