"""Transport-independent request handlers: validation, the network forward, the store, the
value grid. Blocking (they call the store); the data plane runs them in a thread pool off the
event loop. They raise ``qveil.errors`` exceptions only; each transport maps them through its table.

Answer of a query (issue 6): for state s of release r and action a,

    value(s, a) = grid_round( Q_r(s, a) + g_{r,a}(x) ),   x = (s - lo) / (hi - lo)

where Q_r is the bundle's numpy forward (clamped to +-q_bound in output mode, inside the
bundle) and g_{r,a}(x) is ``store.get_or_sample`` (stored value, or an exact OU conditional draw
committed durably before it is returned). Every input is validated BEFORE the store is
touched, so a rejected request stores nothing.

Why the grid: released values are rounded to multiples of ``value_grid`` (a power of two,
default 2^-20). The low-order bits of a floating-point sum q + g are not uniformly
distributed and depend on q (Mironov 2012, "On significance of the least significant bits
for differential privacy"): an attacker reading exact doubles can learn about q from bits
that the noise does not cover. Rounding to a fixed power-of-two grid coarser than the double
spacing of any served magnitude (|v| < 2^32) removes those bits. It is a mitigation, not a
proof: the noise itself is a double drawn from OS entropy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from qveil.common import typing as t
from qveil.errors import (
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
    bad_argument,
    echo,
)
from qveil.server import views
from qveil.server.binding import bind, check_binding
from qveil.server.metrics import Metrics
from qveil.server.quotas import (
    DEFAULT_MAX_STORED_POINTS,
    DEFAULT_NEW_STATE_RATE,
    QuotaConfig,
    Quotas,
)
from qveil.server.state import ActiveRelease, ReleaseHolder

__all__ = ["DEFAULT_VALUE_GRID", "Handlers", "Limits", "grid_round", "per_caller_bound"]

DEFAULT_VALUE_GRID = 2.0**-20


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch: int = 4096  # states per request
    max_in_flight: int = 64  # concurrent qveil RPCs; more get RESOURCE_EXHAUSTED
    value_grid: float = DEFAULT_VALUE_GRID
    points_chunk: int = 2048  # noise points per streamed audit message
    # concurrent RPCs of ONE caller (token, or connection when anonymous); None -> 3/4 of
    # max_in_flight, so one flooding caller can never take the capacity others need
    max_in_flight_per_caller: int | None = None
    # issue 14 item 7: every value-returning response (GetValues, GetBestActions; errors
    # included) takes at least this long, so latency does not tell stored from new states
    min_latency_ms: float = 0.0
    # storage limits (qveil.server.quotas): stored points per release, and each caller's
    # token bucket of new states per second (burst None: 100 s of the rate); the point
    # bucket (new_point_rate, deprecated) is off unless set
    max_stored_points: int = DEFAULT_MAX_STORED_POINTS
    new_state_rate: float = DEFAULT_NEW_STATE_RATE
    new_state_burst: float | None = None
    new_point_rate: float | None = None
    new_point_burst: float | None = None

    def __post_init__(self) -> None:
        self.quota_config()  # validates
        if not (math.isfinite(self.min_latency_ms) and 0 <= self.min_latency_ms <= 60_000):
            raise InvalidArgument(
                f"min latency {self.min_latency_ms!r} ms must be in [0, 60000] (0: off)"
            )
        if self.max_batch < 1 or self.max_in_flight < 1 or self.points_chunk < 1:
            raise InvalidArgument("limits must be positive")
        if self.max_in_flight_per_caller is not None and not (
            1 <= self.max_in_flight_per_caller <= self.max_in_flight
        ):
            raise InvalidArgument(
                f"max_in_flight_per_caller {self.max_in_flight_per_caller!r} must be in "
                f"[1, max_in_flight = {self.max_in_flight}]"
            )
        g = self.value_grid
        if not (g > 0 and math.isfinite(g) and math.frexp(g)[0] == 0.5):
            raise InvalidArgument(f"value grid {g!r} must be a positive power of two")

    def quota_config(self) -> QuotaConfig:
        return QuotaConfig(
            max_stored_points=self.max_stored_points,
            new_state_rate=self.new_state_rate,
            new_state_burst=self.new_state_burst,
            new_point_rate=self.new_point_rate,
            new_point_burst=self.new_point_burst,
        )


def per_caller_bound(limits: Limits) -> int:
    """The effective per-caller bound (see ``Limits.max_in_flight_per_caller``)."""
    if limits.max_in_flight_per_caller is not None:
        return limits.max_in_flight_per_caller
    return max(1, (3 * limits.max_in_flight) // 4)


def store_params(bundle: Any) -> dict[str, Any]:
    """The store's noise parameters of a bundle (``create_release`` keywords): a 1-D release's
    beta and interval; a d-coordinate release's (issue 16) betas (one per coordinate), with
    beta and interval its first coordinate's."""
    if bundle.kernel:
        betas = [float(b) for b in bundle.betas]
        iv = bundle.box.intervals[0]
        return {"beta": betas[0], "interval": (iv.lo, iv.hi), "betas": betas}
    iv = bundle.interval
    return {"beta": bundle.beta, "interval": (iv.lo, iv.hi), "betas": None}


def store_betas(betas: Sequence[float] | None) -> tuple[float, ...]:
    """How the store records ``betas``: () for a 1-D release (its beta is ``beta``)."""
    return () if betas is None or len(betas) == 1 else tuple(float(b) for b in betas)


def grid_round(values: npt.NDArray[np.float64], grid: float) -> npt.NDArray[np.float64]:
    """Round to the nearest multiple of ``grid`` (a power of two: the scaling is exact)."""
    return np.round(values / grid) * grid + 0.0


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError("deadline exceeded before the store was queried; nothing stored")


class Handlers:
    """All operations of the three services, on one store and one release holder."""

    def __init__(
        self,
        *,
        store: Any,
        holder: ReleaseHolder,
        limits: Limits,
        metrics: Metrics | None = None,
        bundle_dirs: Sequence[str | Path] = (),
        budget: float | None = None,
        registry: Any = None,
    ) -> None:
        self.store = store
        #: the registry (qveil.server.registry): lineage, witnessed heads, ledger; opened
        #: from the default location on first use when not given
        self._registry = registry
        #: --budget EPS: refuse a release that would push its dataset past EPS (issue 14)
        self.budget_epsilon = budget
        self.last_ledger: Any = None
        self.holder = holder
        self.limits = limits
        self.metrics = metrics or Metrics()
        self.quotas = Quotas(limits.quota_config())
        self.metrics.quotas = self.quotas
        #: release id -> bundle directory, for activation by id and for cards in listings
        self.known_bundles: dict[str, Path] = {}
        self.bundle_dirs = [Path(d) for d in bundle_dirs]
        self._cards: dict[str, t.Release] = {}

    # ------------------------------------------------------------------ validation helpers
    def _states(self, rel: ActiveRelease, states: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Raw states -> unit states: (n,) for a 1-D release, (n, d) for a release of d
        coordinates (issue 16; see :meth:`_box_states`). Nothing is stored on bad input."""
        if rel.bundle.kernel:
            return self._box_states(rel, states)
        s = np.asarray(states, dtype=np.float64)
        if s.ndim == 2 and s.shape[1] != 1:
            raise bad_argument(
                f"states have {s.shape[1]} coordinates; this release has 1",
                field="states",
                reason="WRONG_DIMS",
            )
        s = s.reshape(-1)
        self._check_batch(s.size)
        finite = np.isfinite(s)
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            raise bad_argument(
                f"state {float(s[i])!r} at index {i} is not a finite number",
                field=f"states[{i}]",
                reason="STATE_NOT_FINITE",
            )
        iv = rel.bundle.interval
        out = (s < iv.lo) | (s > iv.hi)
        if out.any():
            i = int(np.flatnonzero(out)[0])
            raise bad_argument(
                f"state {float(s[i])!r} at index {i} is outside the state interval "
                f"[{iv.lo!r}, {iv.hi!r}]",
                field=f"states[{i}]",
                reason="STATE_OUT_OF_INTERVAL",
            )
        unit: npt.NDArray[np.float64] = iv.to_unit(s)
        return unit

    def _check_batch(self, n: int) -> None:
        """An empty batch, or one over --max-batch, is INVALID_ARGUMENT."""
        if n == 0:
            raise bad_argument(
                "empty batch: give at least one state", field="states", reason="EMPTY_BATCH"
            )
        if n > self.limits.max_batch:
            raise bad_argument(
                f"batch of {n} states exceeds the limit of {self.limits.max_batch}",
                field="states",
                reason="BATCH_TOO_LARGE",
            )

    def _box_states(self, rel: ActiveRelease, states: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """(n, d) raw states of a d-coordinate release -> (n, d) unit states: each coordinate
        clipped into its public interval and mapped onto [0, 1] (``StateBox.to_unit``; the
        clipping is public post-processing and the card says so). A wrong d, an empty or too
        large batch or a non-finite coordinate is INVALID_ARGUMENT."""
        d = rel.bundle.dims
        s = np.asarray(states, dtype=np.float64)
        if s.ndim == 1 and d == 1:
            s = s.reshape(-1, 1)
        if s.ndim != 2 or s.shape[1] != d:
            got = s.shape[1] if s.ndim == 2 else 1
            raise bad_argument(
                f"states have {got} coordinate(s); this release has {d} "
                f"(send a state matrix with dims = {d})",
                field="states",
                reason="WRONG_DIMS",
            )
        self._check_batch(s.shape[0])
        finite = np.isfinite(s).all(axis=1)
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            raise bad_argument(
                f"state at index {i} has a coordinate that is not a finite number",
                field=f"states[{i}]",
                reason="STATE_NOT_FINITE",
            )
        out: npt.NDArray[np.float64] = rel.bundle.box.to_unit(s, clip=True)
        return out

    def _actions(self, rel: ActiveRelease, actions: Sequence[int]) -> list[int]:
        m = rel.bundle.n_actions
        if len(actions) == 0:
            return list(range(m))
        out: list[int] = []
        for j, a in enumerate(actions):
            a = int(a)
            if not 0 <= a < m:
                raise bad_argument(
                    f"unknown action {a} at index {j}: this release has actions 0..{m - 1}",
                    field=f"actions[{j}]",
                    reason="UNKNOWN_ACTION",
                )
            if a in out:
                raise bad_argument(
                    f"action {a} is repeated (index {j})",
                    field=f"actions[{j}]",
                    reason="DUPLICATE_ACTION",
                )
            out.append(a)
        return out

    def _release_for_query(self, release_id: str) -> ActiveRelease:
        """The active release, or the same refusal for any other pinned id, whether the store
        holds it or not: a query caller learns which release is active (GetRelease tells it
        anyway), never whether another release id exists."""
        rel = self.holder.current()  # ONE snapshot for the whole call
        if release_id and release_id != rel.release_id:
            exc = FailedPrecondition(
                f"release {echo(release_id)} is not the active release (active: {rel.release_id!r})"
            )
            exc.reason = "RELEASE_NOT_ACTIVE"
            raise exc
        return rel

    # ------------------------------------------------------------------ ValueService
    def _released(
        self,
        rel: ActiveRelease,
        xs: npt.NDArray[np.float64],
        actions: list[int],
        deadline: float | None,
        caller: str = "local",
    ) -> npt.NDArray[np.float64]:
        q = rel.bundle.q_values_unit(xs)[:, actions]
        _check_deadline(deadline)
        known = self._known_noise(rel, xs, actions)
        if known is not None:  # every state stored: no admission, no database
            self.metrics.answered(int(xs.shape[0]) * len(actions), self.store.points_drawn)
            return grid_round(q + known, self.limits.value_grid)
        if xs.ndim == 2:
            noise = self._box_noise(rel, xs, actions, deadline, caller)
            self.metrics.answered(int(xs.shape[0]) * len(actions), self.store.points_drawn)
            return grid_round(q + noise, self.limits.value_grid)
        ux, inverse = np.unique(xs, return_inverse=True)
        # admission before anything is sampled: one reservation on the store
        ticket = self.store.reserve(
            rel.release_id, [(a, ux) for a in actions], quotas=self.quotas, caller=caller
        )
        try:
            _check_deadline(deadline)
            # all actions' new points in one group-committed transaction (issue 15)
            g = self.store.get_or_sample_actions(rel.release_id, actions, ux)
        finally:
            self.quotas.done(rel.release_id, ticket)
        noise = np.asarray(g, dtype=np.float64)[inverse.reshape(-1)]
        self.metrics.answered(int(xs.size) * len(actions), self.store.points_drawn)
        return grid_round(q + noise, self.limits.value_grid)

    def _known_noise(
        self, rel: ActiveRelease, xs: npt.NDArray[np.float64], actions: list[int]
    ) -> npt.NDArray[np.float64] | None:
        """The noise of a request whose states are all stored (``store.known_values``: the
        in-process copies, no database), summed over a d-coordinate release's paths in
        coordinate order as :meth:`_box_noise` does; None when any state is new."""
        if xs.ndim == 1:
            cols = self.store.known_values(rel.release_id, actions, [xs] * len(actions))
            return None if cols is None else np.stack(cols, axis=1)
        d = xs.shape[1]
        paths = [a * d + j for a in actions for j in range(d)]
        got = self.store.known_values(
            rel.release_id, paths, [xs[:, j] for _a in actions for j in range(d)]
        )
        if got is None:
            return None
        noise = np.zeros((xs.shape[0], len(actions)), dtype=np.float64)
        k = 0
        for i in range(len(actions)):
            for _j in range(d):  # summed in coordinate order: the same bits every time
                noise[:, i] += got[k]
                k += 1
        return noise

    def _box_noise(
        self,
        rel: ActiveRelease,
        xs: npt.NDArray[np.float64],
        actions: list[int],
        deadline: float | None,
        caller: str,
    ) -> npt.NDArray[np.float64]:
        """Additive noise of a d-coordinate release (issue 16): g_a(x) = sum_j g_{a,j}(x_j),
        each g_{a,j} a 1-D OU path of the store (path a * d + j, its own beta_j). Only the
        coordinate values a path has not stored are new points; all of them, every action
        and coordinate, are stored in one durable transaction before anything is answered."""
        d = xs.shape[1]
        cols = [np.unique(xs[:, j], return_inverse=True) for j in range(d)]
        pairs = [(a * d + j, cols[j][0]) for a in actions for j in range(d)]
        index = [cols[j][1].reshape(-1) for _a in actions for j in range(d)]
        ticket = self.store.reserve(  # before anything is sampled
            rel.release_id, pairs, quotas=self.quotas, caller=caller, rows=(xs, index)
        )
        try:
            _check_deadline(deadline)
            gs = self.store.get_or_sample_paths(
                rel.release_id, [p for p, _ in pairs], [u for _, u in pairs]
            )
        finally:
            self.quotas.done(rel.release_id, ticket)
        noise = np.zeros((xs.shape[0], len(actions)), dtype=np.float64)
        k = 0
        for i in range(len(actions)):
            for j in range(d):  # summed in coordinate order: the same bits every time
                noise[:, i] += gs[k][cols[j][1].reshape(-1)]
                k += 1
        return noise

    def get_values(
        self,
        states: npt.ArrayLike,
        actions: Sequence[int] = (),
        *,
        release_id: str = "",
        deadline: float | None = None,
        caller: str = "local",
    ) -> t.Values:
        rel = self._release_for_query(release_id)
        xs = self._states(rel, states)
        acts = self._actions(rel, actions)
        vals = self._released(rel, xs, acts, deadline, caller)
        return t.Values(
            release_id=rel.release_id,
            actions=tuple(acts),
            values=vals,
            value_grid=self.limits.value_grid,
        )

    def get_best_actions(
        self,
        states: npt.ArrayLike,
        *,
        release_id: str = "",
        deadline: float | None = None,
        caller: str = "local",
    ) -> t.BestActions:
        rel = self._release_for_query(release_id)
        xs = self._states(rel, states)
        vals = self._released(rel, xs, list(range(rel.bundle.n_actions)), deadline, caller)
        best = np.argmax(vals, axis=1)  # ties: the lowest action
        return t.BestActions(
            release_id=rel.release_id,
            actions=best.astype(np.int64),
            values=vals[np.arange(vals.shape[0]), best],
            value_grid=self.limits.value_grid,
        )

    def get_action_values(
        self,
        states: npt.ArrayLike,
        actions: npt.ArrayLike,
        *,
        release_id: str = "",
        deadline: float | None = None,
        caller: str = "local",
    ) -> tuple[str, npt.NDArray[np.float64]]:
        """(release id, values[i] = value(states[i], actions[i])): GetValues with one action
        per state (the v2 model's ACTION input, issue 17). Every action is validated before the
        store is touched; each action's states go through ``_released`` (the GetValues path)."""
        rel = self._release_for_query(release_id)
        xs = self._states(rel, states)
        acts = np.asarray(actions, dtype=np.int64).reshape(-1)
        if acts.size != xs.shape[0]:
            raise bad_argument(
                f"{acts.size} actions for {xs.shape[0]} states: give one action per state",
                field="actions",
                reason="WRONG_SHAPE",
            )
        m = rel.bundle.n_actions
        bad = (acts < 0) | (acts >= m)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise bad_argument(
                f"unknown action {int(acts[j])} at index {j}: this release has actions 0..{m - 1}",
                field=f"actions[{j}]",
                reason="UNKNOWN_ACTION",
            )
        out = np.empty(xs.shape[0], dtype=np.float64)
        for a in np.unique(acts):
            idx = np.flatnonzero(acts == a)
            out[idx] = self._released(rel, xs[idx], [int(a)], deadline, caller)[:, 0]
        return rel.release_id, out

    def get_release(self) -> t.Release:
        rel = self.holder.current()
        return views.release_from_bundle(
            rel.bundle, record=rel.record, value_grid=self.limits.value_grid
        )

    # ------------------------------------------------------------------ lifecycle / admin
    def _load(self, path: Path) -> Any:
        from qveil.bundle import load_bundle

        return load_bundle(path, verify=True)

    def _register(self, bundle: Any) -> Any:
        """The store's record of the bundle's release, created (staged) when absent; a
        record with different parameters is refused (a release id names one noise path)."""
        rid = bundle.bundle_id
        sp = store_params(bundle)
        fingerprint = str(bundle.card.get("card_sha256") or bundle.card.get("weights_sha256"))
        try:
            rec = self.store.get_release(rid)
        except NotFound:
            return self.store.create_release(
                release_id=rid,
                fingerprint=fingerprint,
                sigma=bundle.sigma,
                n_actions=bundle.n_actions,
                status="staged",
                **sp,
            )
        mismatch = [
            name
            for name, a, b in (
                ("fingerprint", getattr(rec, "fingerprint", fingerprint), fingerprint),
                ("sigma", float(rec.sigma), bundle.sigma),
                ("beta", float(rec.beta), sp["beta"]),
                ("betas", tuple(getattr(rec, "betas", ())), store_betas(sp["betas"])),
                ("interval", tuple(map(float, rec.interval)), sp["interval"]),
                ("n_actions", int(rec.n_actions), bundle.n_actions),
            )
            if a != b
        ]
        if mismatch:
            raise IntegrityError(
                f"release {echo(rid)} is registered in the store with different "
                f"{', '.join(mismatch)} than the bundle"
            )
        return rec

    @property
    def registry(self) -> Any:
        if self._registry is None:
            from qveil.server.registry import open_registry

            self._registry = open_registry(actor="qveil serve")
        return self._registry

    def _ledger_record(self, bundle: Any) -> Any:
        """Record the release in the registry's privacy ledger (once: ``qveil train`` already
        did for the releases it wrote); BudgetExceeded past ``--budget`` or the population's
        budget: the release is not served."""
        from qveil.server.release_ledger import record_release

        return record_release(
            self.registry.ledger, bundle.card, actor="qveil serve", budget=self.budget_epsilon
        )

    def start(self, bundle_path: str | Path, *, verify_store: bool = True) -> ActiveRelease:
        """Server start: load and verify the bundle, register its release if absent, verify
        the store's record of it, mark it active and make it the served release."""
        return self._activate(Path(bundle_path), expected_id="", verify_store=verify_store)

    def _activate(self, path: Path, *, expected_id: str, verify_store: bool) -> ActiveRelease:
        with self.holder.activation_lock:
            bundle = self._load(path)
            if expected_id and bundle.bundle_id != expected_id:
                raise InvalidArgument(
                    f"bundle {echo(str(path))} holds release {bundle.bundle_id!r}, not "
                    f"{echo(expected_id)}"
                )
            fingerprint, on_file = check_binding(self.store, bundle, path, self.registry)
            rec = self._register(bundle)
            if getattr(rec, "status", "") == "retired":
                raise FailedPrecondition(
                    f"release {bundle.bundle_id!r} is retired; retired "
                    "releases are never answered again"
                )
            if verify_store:
                report = self.store.verify(bundle.bundle_id)
                if not bool(getattr(report, "ok", True)):
                    raise IntegrityError(
                        f"stored noise of release {bundle.bundle_id!r} fails verification: {report}"
                    )
            # charged before it is bound or answered: a refused budget leaves no binding
            self.last_ledger = self._ledger_record(bundle)
            bind(self.store, bundle, path, fingerprint, on_file, self.registry)
            # nothing is answered above the chain heads the registry has witnessed
            self.store.set_witness(self.registry.witness_for(bundle.bundle_id))
            previous = self.holder.peek()
            if previous is None or previous.release_id != bundle.bundle_id:
                self.store.set_release_status(bundle.bundle_id, "active")
            rec = self.store.get_release(bundle.bundle_id)
            new = ActiveRelease(bundle=bundle, record=rec)
            self.holder.swap(new)
            if previous is not None and previous.release_id != new.release_id:
                self.store.set_release_status(previous.release_id, "staged")
            # other releases still marked active (an earlier process) become staged
            for other in self.store.list_releases():
                if other.release_id != new.release_id and other.status == "active":
                    self.store.set_release_status(other.release_id, "staged")
            self.known_bundles[bundle.bundle_id] = path.resolve()
            self._cards.pop(bundle.bundle_id, None)
            return new

    def _find_bundle(self, release_id: str) -> Path:
        if release_id in self.known_bundles:
            return self.known_bundles[release_id]
        import json

        roots = {p.parent for p in self.known_bundles.values()} | set(self.bundle_dirs)
        for root in sorted(roots):
            for card in sorted(root.glob("*/card.json")):
                try:
                    if json.loads(card.read_text()).get("bundle_id") == release_id:
                        self.known_bundles[release_id] = card.parent.resolve()
                        return card.parent
                except (OSError, ValueError):
                    continue
        raise NotFound(
            f"no bundle for release {echo(release_id)} on this server (give "
            "bundle_path, or put the bundle beside the served one)"
        )

    def activate(self, release_id: str = "", bundle_path: str = "") -> tuple[t.Release, str]:
        from qveil.server.admin import server_action  # issue 7: admin audit log

        with server_action(
            self.store,
            "activate",
            release_id or bundle_path,
            release_id=release_id,
            bundle_path=bundle_path,
        ):
            return self._activate_request(release_id, bundle_path)

    def _activate_request(self, release_id: str, bundle_path: str) -> tuple[t.Release, str]:
        if not release_id and not bundle_path:
            raise bad_argument(
                "give release_id or bundle_path", field="release_id", reason="MISSING_RELEASE"
            )
        previous = self.holder.peek()
        path = Path(bundle_path) if bundle_path else self._find_bundle(release_id)
        new = self._activate(path, expected_id=release_id, verify_store=True)
        return (
            views.release_from_bundle(
                new.bundle, record=new.record, value_grid=self.limits.value_grid
            ),
            previous.release_id if previous is not None else "",
        )

    def retire(self, release_id: str) -> t.Release:
        from qveil.server.admin import server_action  # issue 7: admin audit log

        with server_action(self.store, "retire", release_id, release_id=release_id):
            return self._retire_request(release_id)

    def _retire_request(self, release_id: str) -> t.Release:
        if not release_id:
            raise bad_argument(
                "release_id is required", field="release_id", reason="MISSING_RELEASE"
            )
        with self.holder.activation_lock:
            current = self.holder.peek()
            if current is not None and current.release_id == release_id:
                raise FailedPrecondition(
                    f"release {echo(release_id)} is active; activate another release before "
                    "retiring it"
                )
            self.store.get_release(release_id)  # NotFound
            self.store.set_release_status(release_id, "retired")
            self._cards.pop(release_id, None)
            return self._describe(self.store.get_release(release_id))

    def _describe(self, record: Any) -> t.Release:
        rid = str(record.release_id)
        path = self.known_bundles.get(rid)
        if path is None:
            try:
                path = self._find_bundle(rid)
            except NotFound:
                path = None
        if path is not None:
            try:
                from qveil.bundle import load_bundle

                base = self._cards.get(rid)
                if base is None:
                    bundle = load_bundle(path, verify=False)
                    base = views.release_from_bundle(
                        bundle, record=None, value_grid=self.limits.value_grid
                    )
                    self._cards[rid] = base
                from dataclasses import replace

                return replace(base, status=str(record.status))
            except Exception:  # noqa: BLE001 - a listing shows what the store knows
                pass
        return views.release_from_record(record, value_grid=self.limits.value_grid)

    def list_releases(self) -> tuple[list[t.Release], str]:
        current = self.holder.peek()
        return (
            [self._describe(r) for r in self.store.list_releases()],
            current.release_id if current is not None else "",
        )

    def stats(self) -> t.ServerStats:
        current = self.holder.peek()
        stored = {a: n for (_r, a), n in self.stored_points().items()}
        m = self.metrics
        return t.ServerStats(
            active_release_id=current.release_id if current is not None else "",
            uptime_seconds=m.uptime(),
            requests_by_code=dict(m.requests),
            states_answered=m.states_answered,
            new_points=m.new_points,
            in_flight=m.in_flight,
            max_in_flight=self.limits.max_in_flight,
            stored_points=stored,
            max_batch=self.limits.max_batch,
        )

    def budget(self, dataset_id: str = "") -> list[dict[str, object]]:
        """Budgets of one population (or all) in the registry's ledger."""
        from qveil.server.admin import AdminContext, admin_db_for, budget

        ctx = AdminContext(
            store=self.store,
            db=admin_db_for(self.store),
            actor="server (admin role)",
            store_url="",
            owns_store=False,
            _registry=self.registry,
        )
        return [b.to_dict() for b in budget(ctx, dataset_id or None)]

    def admin_card(self, release_id: str = "") -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(release id, public card, admin card) of the active release or of ``release_id``
        (a bundle this server knows): the admin role's view (issue 14 item 3)."""
        current = self.holder.peek()
        if not release_id or (current is not None and current.release_id == release_id):
            rel = self.holder.current()
            bundle = rel.bundle
        else:
            from qveil.bundle import load_bundle

            self.store.get_release(release_id)  # NotFound for an unknown release
            bundle = load_bundle(self._find_bundle(release_id), verify=True)
        admin = bundle.admin_card()
        # the private evaluations of this release (qveil evaluate --private), from the
        # registry's audit log: what the released policy is worth, with its interval
        from qveil.server import audit_log

        evaluations = [
            {"at": e.at, "actor": e.actor, **e.params}
            for e in audit_log.entries(
                self.registry.db, action="private-evaluation", target=bundle.bundle_id
            )
        ]
        if evaluations:
            admin["private_evaluations"] = evaluations
        return bundle.bundle_id, bundle.public_card(), admin

    def stored_points(self) -> dict[tuple[str, int], int]:
        current = self.holder.peek()
        if current is None:
            return {}
        d = int(current.bundle.dims)  # d > 1: an action's points are its d paths' (issue 16)
        return {
            (current.release_id, a): sum(
                int(self.store.count_points(current.release_id, a * d + j)) for j in range(d)
            )
            for a in range(current.bundle.n_actions)
        }

    # ------------------------------------------------------------------ AuditService
    def _audit_release(self, release_id: str, action: int | None) -> Any:
        if not release_id:
            release_id = self.holder.current().release_id
        rec = self.store.get_release(release_id)  # NotFound
        # a release of d > 1 coordinates (issue 16): "action" names the store path
        # action * d + coordinate (the 1-D OU path g_{action, coordinate})
        n = int(getattr(rec, "n_paths", rec.n_actions))
        if action is not None and not 0 <= int(action) < n:
            what = "actions" if n == int(rec.n_actions) else "paths (action * dims + coordinate)"
            raise bad_argument(
                f"unknown action {action}: release {echo(release_id)} has {what} 0..{n - 1}",
                field="action",
                reason="UNKNOWN_ACTION",
            )
        return rec

    def noise_points(
        self, release_id: str, action: int
    ) -> tuple[str, Generator[list[t.NoisePoint], None, None]]:
        """(release id, generator of chunks of stored points in insertion order)."""
        rec = self._audit_release(release_id, action)
        lo, hi = map(float, rec.interval)
        j = int(action) % int(getattr(rec, "dims", 1))
        if j:  # coordinate j of a d > 1 release: its interval is in the bundle's card
            cur = self.holder.peek()
            if cur is not None and cur.release_id == rec.release_id:
                iv = cur.bundle.box.intervals[j]
                lo, hi = float(iv.lo), float(iv.hi)
            else:
                lo = hi = math.nan  # the raw state is unknown here; x and g are exact
        chunk = self.limits.points_chunk

        def chunks() -> Generator[list[t.NoisePoint], None, None]:
            buf: list[t.NoisePoint] = []
            for p in self.store.iter_points(rec.release_id, int(action)):
                buf.append(views.noise_point(p, lo=lo, hi=hi))
                if len(buf) >= chunk:
                    yield buf
                    buf = []
            if buf:
                yield buf

        return str(rec.release_id), chunks()

    def verify(self, release_id: str = "", action: int | None = None) -> t.IntegrityResult:
        rec = self._audit_release(release_id, action)
        report = (
            self.store.verify(rec.release_id)
            if action is None
            else self.store.verify(rec.release_id, int(action))
        )
        return views.integrity_from_report(str(rec.release_id), report)

    def report(self, release_id: str = "", action: int | None = None) -> t.StatisticalReport:
        """The audit of one release (qveil.server.audit.service_report: the same report as
        ``qveil audit --release ID``): integrity, high-water marks, whitened innovations tested
        against N(0, 1) with power against sigma x 1.3, ledger and audit-log chains."""
        from qveil.server.audit import service_report

        rec = self._audit_release(release_id, action)
        report: t.StatisticalReport = service_report(
            self.store, str(rec.release_id), action=action, registry=self.registry
        )
        return report


def new_executor(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="qveil-store")
