"""Blocking clients: :class:`ValueClient` (query role), :class:`AdminClient`,
:class:`AuditClient`. Each is a context manager around one gRPC channel; failed calls raise
the typed exceptions of :mod:`qveil.common.errors`; idempotent calls are retried on
RESOURCE_EXHAUSTED and UNAVAILABLE as the server's pushback says (:class:`RetryPolicy`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Self, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from qveil.client.channel import (
    RetryPolicy,
    TLSConfig,
    auth_metadata,
    channel_credentials,
    channel_options,
)
from qveil.common import serde as convert
from qveil.common import typing as t
from qveil.common.errors import from_grpc_error, is_server_reset
from qveil.v1 import admin_service_pb2 as admin_pb
from qveil.v1 import admin_service_pb2_grpc as admin_grpc
from qveil.v1 import audit_service_pb2 as audit_pb
from qveil.v1 import audit_service_pb2_grpc as audit_grpc
from qveil.v1 import value_service_pb2 as value_pb
from qveil.v1 import value_service_pb2_grpc as value_grpc

__all__ = ["AdminClient", "AuditClient", "ValueClient", "is_flat", "state_fields"]

R = TypeVar("R")


def as_states(states: npt.ArrayLike) -> list[float]:
    """States as a flat list of floats (a scalar is one state)."""
    arr = np.asarray(states, dtype=np.float64)
    return [float(v) for v in arr.reshape(-1)]


def is_flat(states: npt.ArrayLike) -> bool:
    """True when ``states`` is a flat list of more than one number: n states of a 1-D
    release, or one state of a release of that many coordinates (the release's dims says)."""
    return bool(np.ndim(states) == 1 and np.size(states) > 1)


def state_fields(states: npt.ArrayLike, dims: int = 1) -> dict[str, Any]:
    """The request fields of ``states`` for a release of ``dims`` coordinates: an array of
    shape [n, d] with d > 1 goes as a ``state_matrix`` (n states of d coordinates,
    row-major), and so does a flat list of exactly ``dims`` > 1 numbers (one state);
    anything else (a scalar, a list, [n] or [n, 1]) as the 1-D ``states`` list."""
    arr = np.asarray(states, dtype=np.float64)
    if dims > 1 and arr.ndim == 1 and arr.shape[0] == dims:
        arr = arr.reshape(1, dims)
    if arr.ndim == 2 and arr.shape[1] > 1:
        return {
            "state_matrix": value_pb.StateMatrix(
                values=arr.reshape(-1).tolist(), dims=int(arr.shape[1])
            )
        }
    return {"states": as_states(arr)}


class _Base:
    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float | None = 30.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self._retry = retry or RetryPolicy()
        creds = channel_credentials(tls)
        opts = channel_options(tls, self._retry)
        self.target = target
        self._channel = (
            grpc.secure_channel(target, creds, options=opts)
            if creds is not None
            else grpc.insecure_channel(target, options=opts)
        )
        self._metadata = auth_metadata(token)
        self._timeout = timeout

    def _call(
        self,
        method: Callable[..., R],
        request: Any,
        *,
        idempotent: bool = True,
        timeout: float | None = None,
    ) -> R:
        """One call; the channel's retry policy retries RESOURCE_EXHAUSTED and UNAVAILABLE
        (honouring the server's pushback), this loop a call the server reset while shutting
        down. Both within the policy's attempts and one deadline for the whole call."""
        attempts = self._retry.attempts if idempotent else 1
        total = timeout or self._timeout
        deadline = None if total is None else time.monotonic() + total
        for attempt in range(attempts):
            left = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                return method(request, timeout=left, metadata=self._metadata)
            except grpc.RpcError as exc:
                if is_server_reset(exc) and attempt + 1 < attempts:
                    time.sleep(self._retry.delay(attempt))
                    continue
                raise from_grpc_error(exc) from None
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

    def _state_fields(self, states: npt.ArrayLike) -> dict[str, Any]:
        if self._dims is None and is_flat(states):
            self._dims = self.release().dims
        return state_fields(states, self._dims or 1)

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float | None = 30.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(target, token=token, tls=tls, timeout=timeout, retry=retry)
        self._stub = value_grpc.ValueServiceStub(self._channel)

    def get_values(
        self,
        states: npt.ArrayLike,
        actions: Sequence[int] | None = None,
        *,
        release_id: str = "",
        timeout: float | None = None,
    ) -> t.Values:
        """Released values with the answering release and the action columns."""
        req = value_pb.GetValuesRequest(
            **self._state_fields(states), actions=list(actions or ()), release_id=release_id
        )
        return convert.values_from_proto(self._call(self._stub.GetValues, req, timeout=timeout))

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
        req = value_pb.GetBestActionsRequest(**self._state_fields(states), release_id=release_id)
        return convert.best_actions_from_proto(
            self._call(self._stub.GetBestActions, req, timeout=timeout)
        )

    def best_actions(
        self, states: npt.ArrayLike, *, timeout: float | None = None
    ) -> npt.NDArray[np.int64]:
        """The argmax action of the released values, one per state."""
        return self.get_best_actions(states, timeout=timeout).actions

    def release(self, *, timeout: float | None = None) -> t.Release:
        """The public card of the active release."""
        resp = self._call(self._stub.GetRelease, value_pb.GetReleaseRequest(), timeout=timeout)
        return convert.release_from_proto(resp.release)


class AdminClient(_Base):
    """Admin role: list, activate and retire releases; server stats."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float | None = 120.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(target, token=token, tls=tls, timeout=timeout, retry=retry)
        self._stub = admin_grpc.AdminServiceStub(self._channel)

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

    def budget(self, dataset_id: str = "") -> list[dict[str, Any]]:
        """Privacy budgets of one dataset (empty: all) from the server's ledger, as
        ``qveil admin budget --json`` prints them (spent, cap, remaining, every event)."""
        resp = self._call(self._stub.GetBudget, admin_pb.GetBudgetRequest(dataset_id=dataset_id))
        return convert.budget_from_proto(resp)

    def admin_card(self, release_id: str = "") -> dict[str, Any]:
        """The admin card of a release (empty id: the active one): ``card_admin.json``, what
        the public card leaves out (weights hash, measured Lipschitz constants, layout, ...)."""
        import json

        resp = self._call(
            self._stub.GetAdminCard, admin_pb.GetAdminCardRequest(release_id=release_id)
        )
        card: dict[str, Any] = json.loads(resp.admin_card_json)
        return card


class AuditClient(_Base):
    """Auditor role: stored noise points, integrity verification, statistical report."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: TLSConfig | bool | None = None,
        timeout: float | None = 300.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(target, token=token, tls=tls, timeout=timeout, retry=retry)
        self._stub = audit_grpc.AuditServiceStub(self._channel)

    def noise_points(self, action: int, *, release_id: str = "") -> Iterator[t.NoisePoint]:
        """Stored points of one action in insertion order (streamed)."""
        req = audit_pb.StreamNoisePointsRequest(release_id=release_id, action=action)
        try:
            for chunk in self._stub.StreamNoisePoints(
                req, timeout=self._timeout, metadata=self._metadata
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
