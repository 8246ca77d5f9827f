"""The query service: what ValueService answers (and the v2 model through it): validation,
the release's answer, the value grid. Pure computation on the active release (no store, no
lock): the data plane answers a few states on the event loop and more in its thread pool. It
raises ``qveil.errors`` exceptions only; each transport maps them through its table.

Answer of a query: for state s of release r and action a,

    value(s, a) = grid_round( Q_r(x, a) + sum_j g_{r, a d + j}(x_j) ),
    x_j = snap( (clip(s_j, lo_j, hi_j) - lo_j) / (hi_j - lo_j) )

for every release, of d >= 1 coordinates: each coordinate is clipped into its public
interval (public post-processing; every card states it) and snapped to the dyadic grid
i 2^-32 (:func:`qveil.keyed.snap`); Q_r is the bundle's numpy forward at the SNAPPED state
(clamped to +-q_bound in output mode, inside the bundle) and g is the release's keyed noise
(:class:`qveil.keyed.KeyedPaths`, a pure function of its one key). So an answer is a pure
function of (weights, key, snapped state): every copy of the release answers the same bits,
and nothing about earlier queries changes it, its latency included. The arithmetic is
:mod:`qveil.answer`'s, shared with the in-process evaluations. What was answered is handed
to the answer log (:mod:`qveil.server.serving.answer_log`), which writes it to the store off the
answer path, for audit. Every input is validated before anything is answered or logged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import NamedTuple, NoReturn

import numpy as np
import numpy.typing as npt

from qveil.answer import answer_snapped, grid_round
from qveil.common import typing as t
from qveil.errors import FailedPrecondition, bad_argument, echo
from qveil.keyed import snap
from qveil.noise import FEW
from qveil.server.serving import views
from qveil.server.serving.answer_log import AnswerLog
from qveil.server.serving.state import ActiveRelease, ContextService, ServerContext

__all__ = ["ParsedQuery", "QueryService", "grid_round"]

_Floats = npt.NDArray[np.float64]


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError("deadline exceeded before the call was answered")


def _not_finite(i: int) -> NoReturn:
    raise bad_argument(
        f"state at index {i} has a coordinate that is not a finite number",
        field=f"states[{i}]",
        reason="STATE_NOT_FINITE",
    )


def _unit_few(
    s: npt.NDArray[np.float64], lo: list[float], hi: list[float], span: list[float]
) -> npt.NDArray[np.float64]:
    """(n, d) finite states -> unit states, bit for bit as the numpy map of
    :meth:`QueryService._states` (IEEE arithmetic is the same in Python and numpy; a
    signed zero that min/max may pick differently ends as +0.0 after the final + 0.0), for a
    few states; a non-finite coordinate is INVALID_ARGUMENT."""
    out: list[list[float]] = []
    for i, row in enumerate(s.tolist()):
        unit: list[float] = []
        for x, a, b, w in zip(row, lo, hi, span, strict=True):
            if not math.isfinite(x):
                _not_finite(i)
            unit.append(min(max((min(max(x, a), b) - a) / w, 0.0), 1.0) + 0.0)
        out.append(unit)
    return np.array(out, dtype=np.float64)


class ParsedQuery(NamedTuple):
    """A validated GetValues request (:meth:`QueryService.parse`): the release snapshot it
    is answered on, its unit states [n, d] snapped to the release's grid, their grid indices
    [n, d] and its actions."""

    rel: ActiveRelease
    xs: npt.NDArray[np.float64]
    idx: npt.NDArray[np.uint64]
    actions: list[int]


class QueryService(ContextService):
    """GetValues, GetBestActions, GetRelease (and the v2 model's one action per state) on the
    active release."""

    def __init__(self, ctx: ServerContext, log: AnswerLog | None = None) -> None:
        super().__init__(ctx)
        #: where answered values go, off the answer path (None: not logged)
        self.log = log
        #: (release, lo, hi, hi - lo) of the release whose box bounds were last needed
        self._box_bounds: tuple[ActiveRelease, _Floats, _Floats, _Floats] | None = None

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

    def _states(self, rel: ActiveRelease, states: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """(n, d) raw states -> (n, d) unit states, for every release (d = 1 is a box of one
        interval; its states may also come as a flat list [n]): each coordinate clipped into
        its public interval and mapped onto [0, 1] (``StateBox.to_unit``; the clipping is
        public post-processing and every card says so). A wrong d, an empty or too large
        batch or a non-finite coordinate is INVALID_ARGUMENT; nothing is stored."""
        d = rel.bundle.dims
        s = np.asarray(states, dtype=np.float64)
        if s.ndim <= 1 and d == 1:
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
        # StateBox.to_unit(s, clip=True), its arithmetic to the bit: clip(x, lo, hi) of a
        # finite x is min(max(x, lo), hi), so a few states are mapped with Python floats
        # (one numpy call instead of a dozen: on the hot path numpy's per-call cost, not
        # the arithmetic, is what a single state pays), more with numpy; the box's bounds
        # are built once per release instead of from the card on every call
        lo, hi, span = self._bounds(rel)
        if s.size <= FEW:  # coordinates in all
            return _unit_few(s, lo.tolist(), hi.tolist(), span.tolist())
        if not np.isfinite(s).all():
            _not_finite(int(np.flatnonzero(~np.isfinite(s).all(axis=1))[0]))
        out: npt.NDArray[np.float64] = np.minimum(np.maximum(s, lo), hi)
        out -= lo
        out /= span
        np.maximum(out, 0.0, out=out)
        np.minimum(out, 1.0, out=out)
        out += 0.0
        return out

    def _bounds(
        self, rel: ActiveRelease
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(lo, hi, hi - lo) of the release's state box, kept for the active release."""
        got = self._box_bounds
        if got is None or got[0] is not rel:
            box = rel.bundle.box
            lo, hi = box.lo, box.hi
            got = (rel, lo, hi, hi - lo)
            self._box_bounds = got
        return got[1], got[2], got[3]

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

    def _values(
        self, rel: ActiveRelease, acts: list[int], vals: npt.NDArray[np.float64]
    ) -> t.Values:
        """The answer of a values call: released values [n, len(acts)] on the value grid."""
        return t.Values(
            release_id=rel.release_id,
            actions=tuple(acts),
            values=vals,
            value_grid=self.limits.value_grid,
        )

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

    def get_values(
        self,
        states: npt.ArrayLike,
        actions: Sequence[int] = (),
        *,
        release_id: str = "",
        deadline: float | None = None,
        caller: str = "local",
    ) -> t.Values:
        query = self.parse(states, actions, release_id=release_id)
        return self.values(query, deadline=deadline, caller=caller)

    def parse(
        self, states: npt.ArrayLike, actions: Sequence[int] = (), *, release_id: str = ""
    ) -> ParsedQuery:
        """A GetValues request validated on the active release (a pinned other release,
        states or actions that are not valid raise as in :meth:`get_values`), its states
        mapped to unit coordinates and snapped to the release's grid."""
        rel = self._release_for_query(release_id)
        idx, xs = snap(self._states(rel, states))
        return ParsedQuery(rel, xs, idx, self._actions(rel, actions))

    def values(
        self, query: ParsedQuery, *, deadline: float | None = None, caller: str = "local"
    ) -> t.Values:
        """The released values of a parsed request: the caller's quota takes one token per
        state (asked before or not), then mean + keyed noise at the snapped states, on the
        value grid (see the module docstring); what was answered goes to the answer log."""
        _check_deadline(deadline)
        self.quotas.admit(caller, int(query.xs.shape[0]))
        return self._answer(query)

    def _answer(self, query: ParsedQuery) -> t.Values:
        """Mean + keyed noise at the snapped states, on the value grid; counted and handed
        to the answer log (the quota was taken by the caller)."""
        rel, xs, idx, acts = query
        vals, coords = answer_snapped(rel.bundle, xs, idx, acts, value_grid=self.limits.value_grid)
        self.metrics.answered(int(xs.shape[0]) * len(acts))
        if self.log is not None:
            self.log.submit(rel.release_id, xs, acts, coords)
        return self._values(rel, acts, vals)

    def get_best_actions(
        self,
        states: npt.ArrayLike,
        *,
        release_id: str = "",
        deadline: float | None = None,
        caller: str = "local",
    ) -> t.BestActions:
        query = self.parse(states, release_id=release_id)  # every action
        return self.best_actions(self.values(query, deadline=deadline, caller=caller))

    @staticmethod
    def best_actions(values: t.Values) -> t.BestActions:
        """Each state's best action and its value, from the released values of every action
        (in action order); ties: the lowest action."""
        vals = values.values
        best = np.argmax(vals, axis=1)
        return t.BestActions(
            release_id=values.release_id,
            actions=best.astype(np.int64),
            values=vals[np.arange(vals.shape[0]), best],
            value_grid=values.value_grid,
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
        per state (the v2 model's ACTION input). Every action is validated, and the whole
        request takes its quota (one token per state, refused whole), before anything is
        answered; each action's states are answered as GetValues answers them."""
        rel = self._release_for_query(release_id)
        idx, xs = snap(self._states(rel, states))
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
        _check_deadline(deadline)
        self.quotas.admit(caller, int(xs.shape[0]))
        out = np.empty(xs.shape[0], dtype=np.float64)
        for a in np.unique(acts):
            at = np.flatnonzero(acts == a)
            out[at] = self._answer(ParsedQuery(rel, xs[at], idx[at], [int(a)])).values[:, 0]
        return rel.release_id, out

    def get_release(self) -> t.Release:
        rel = self.holder.current()
        return views.release_from_bundle(
            rel.bundle, record=rel.record, value_grid=self.limits.value_grid
        )
