"""The server's state: the active release, swapped atomically, and the context the
services share (:class:`ServerContext`).

A call takes one snapshot (:meth:`ReleaseHolder.current`) when it starts and uses only that
snapshot, so an activation never mixes two releases within one response and calls in flight
finish on the release they started with. The swap is a single reference assignment under a
lock (readers need no lock: reading a Python reference is atomic).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qveil.errors import Unavailable
from qveil.server.governance.registry import Registry, open_registry
from qveil.server.serving.limits import Limits
from qveil.server.serving.metrics import Metrics
from qveil.server.serving.quotas import Quotas
from qveil.server.store.base import SamplePathStore
from qveil.server.store.releases import ReleaseRecord, ReleaseRegistry

if TYPE_CHECKING:  # for annotations only
    from qveil.bundle import Bundle

__all__ = ["ActiveRelease", "ContextService", "ReleaseHolder", "ServerContext"]


@dataclass(frozen=True, eq=False)
class ActiveRelease:
    """A loaded, verified bundle together with its registration in the store."""

    bundle: Bundle
    record: ReleaseRecord

    @property
    def release_id(self) -> str:
        return str(self.bundle.bundle_id)


class ReleaseHolder:
    def __init__(self) -> None:
        self._current: ActiveRelease | None = None
        self._lock = threading.Lock()
        #: Serialises whole activations (load + register + swap) against each other.
        self.activation_lock = threading.Lock()
        self.draining = False

    def current(self) -> ActiveRelease:
        """The active release now; Unavailable while none is loaded or while draining."""
        rel = self._current
        if rel is None:
            raise Unavailable("no release is loaded yet (the server is starting)")
        return rel

    def peek(self) -> ActiveRelease | None:
        return self._current

    def swap(self, new: ActiveRelease) -> ActiveRelease | None:
        """Make ``new`` the active release; return the previous one."""
        with self._lock:
            old, self._current = self._current, new
            return old


class ServerContext:
    """What the server's services share: the store (set once it is open), the active
    release, the limits, the metrics, the query quotas and the registry (ledger and receipt
    key; opened from the default location on first use when not given)."""

    def __init__(
        self,
        *,
        store: SamplePathStore | None,  # None until it is open (set .store then)
        holder: ReleaseHolder,
        limits: Limits,
        metrics: Metrics | None = None,
        registry: Registry | None = None,
    ) -> None:
        self._store = store
        self.holder = holder
        self.limits = limits
        self.metrics = metrics or Metrics()
        self.quotas = Quotas(limits.quota_config())
        self.metrics.quotas = self.quotas
        self._registry = registry

    @property
    def store(self) -> SamplePathStore:
        """The store; Unavailable until it is open (the server is starting)."""
        st = self._store
        if st is None:
            raise Unavailable("the store is not open yet (the server is starting)")
        return st

    @store.setter
    def store(self, store: SamplePathStore) -> None:
        self._store = store

    @property
    def opened_store(self) -> SamplePathStore | None:
        """The store, or None when it was never opened."""
        return self._store

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = open_registry(actor="qveil serve")
        return self._registry


class ContextService:
    """A service of the server: one job, on the shared :class:`ServerContext`."""

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    @property
    def store(self) -> SamplePathStore:  # the context's store (see ServerContext)
        return self.ctx.store

    @property
    def releases(self) -> ReleaseRegistry:
        """The store's release registry (``store.releases``)."""
        return self.ctx.store.releases

    @property
    def holder(self) -> ReleaseHolder:
        return self.ctx.holder

    @property
    def limits(self) -> Limits:
        return self.ctx.limits

    @property
    def metrics(self) -> Metrics:
        return self.ctx.metrics

    @property
    def quotas(self) -> Quotas:
        return self.ctx.quotas

    @property
    def registry(self) -> Registry:
        return self.ctx.registry
