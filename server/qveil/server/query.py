"""The query service: what ValueService answers (and the v2 model through it): validation,
the model's forward, the store's noise, the value grid. Blocking (it calls the store); the
data plane runs it in a thread pool off the event loop. It raises ``qveil.errors``
exceptions only; each transport maps them through its table.

Answer of a query: for state s of release r and action a,

    value(s, a) = grid_round( Q_r(x, a) + sum_j g_{r,a,j}(x_j) ),
    x_j = (clip(s_j, lo_j, hi_j) - lo_j) / (hi_j - lo_j)

for every release, of d >= 1 coordinates: each coordinate is clipped into its public
interval (public post-processing; every card states it), Q_r is the bundle's numpy forward
(clamped to +-q_bound in output mode, inside the bundle) and g_{r,a,j}(x_j) is
``store.get_or_sample_paths`` on path a * d + j (stored value, or an exact OU conditional
draw committed durably before it is returned). Every input is validated BEFORE the store is
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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn

import numpy as np
import numpy.typing as npt

from qveil.common import typing as t
from qveil.errors import FailedPrecondition, bad_argument, echo
from qveil.noise import FEW
from qveil.server import views
from qveil.server.answer_cache import AnswerCache
from qveil.server.state import ActiveRelease, ContextService, ServerContext

__all__ = ["ParsedQuery", "QueryService", "ValuesAsk", "grid_round"]


def grid_round(values: npt.NDArray[np.float64], grid: float) -> npt.NDArray[np.float64]:
    """Round to the nearest multiple of ``grid`` (a power of two: the scaling is exact)."""
    return np.round(values / grid) * grid + 0.0


def _paths(actions: Sequence[int], d: int) -> list[int]:
    """The store's paths of ``actions`` on a release of d coordinates: a * d + j, in action
    then coordinate order (d = 1: path a)."""
    return [a * d + j for a in actions for j in range(d)]


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise TimeoutError("deadline exceeded before the store was queried; nothing stored")


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
    is answered on, its unit states [n, d] and its actions."""

    rel: ActiveRelease
    xs: npt.NDArray[np.float64]
    actions: list[int]


class ValuesAsk(NamedTuple):
    """One GetValues call of a batch (:meth:`QueryService.get_values_many`)."""

    query: ParsedQuery
    deadline: float | None = None
    caller: str = "local"
    #: its states were just looked up in the in-process copies (:meth:`QueryService.
    #: stored_values`) and not all were there: the batch goes to the store without looking
    #: again (a state stored in between is then read from the store, not drawn)
    looked_up: bool = False


@dataclass(slots=True)
class _NewAsk:
    """A call of a batch whose states are not all stored: validated, its model values
    computed, its store paths (``pairs``: path, unique unit values) and, per pair, the index
    of each state's value (``index``)."""

    at: int
    xs: npt.NDArray[np.float64]
    actions: list[int]
    q: npt.NDArray[np.float64]
    pairs: list[tuple[int, npt.NDArray[np.float64]]]
    index: list[npt.NDArray[np.intp]]
    ticket: int = 0


def _pairs(
    xs: npt.NDArray[np.float64], actions: list[int]
) -> tuple[list[tuple[int, npt.NDArray[np.float64]]], list[npt.NDArray[np.intp]]]:
    """The store paths of a request of states ``xs`` [n, d]: (path a * d + j, the unique values
    of coordinate j) for each action a and coordinate j, and per pair the index of each
    state's value among them."""
    n, d = xs.shape
    if n == 1:  # one state: its own unique values (np.unique's work skipped)
        cols = [(xs[:, j].copy(), np.zeros(1, dtype=np.intp)) for j in range(d)]
    else:
        cols = [np.unique(xs[:, j], return_inverse=True) for j in range(d)]
    pairs = [(a * d + j, cols[j][0]) for a in actions for j in range(d)]
    index = [cols[j][1].reshape(-1) for _a in actions for j in range(d)]
    return pairs, index


def _union(parts: Sequence[npt.NDArray[np.float64]]) -> npt.NDArray[np.float64]:
    """The sorted distinct values of ``parts`` (unit states: no NaN, no -0.0), as np.unique
    gives them. A few values are merged as Python floats: np.unique sorts with a call that
    releases the interpreter lock, and the batch worker calling it while the event loop is
    busy then waits up to a switch interval (5 ms) to get the lock back."""
    if sum(len(u) for u in parts) <= FEW:
        return np.array(sorted({v for u in parts for v in u.tolist()}), dtype=np.float64)
    return np.unique(np.concatenate(parts))


def _positions(
    values: npt.NDArray[np.float64], u: npt.NDArray[np.float64]
) -> npt.NDArray[np.intp] | list[int]:
    """The index in the sorted ``values`` of each of ``u`` (all present): np.searchsorted,
    or, for a few, a dict of Python floats (np.searchsorted on a small array releases the
    interpreter lock, which costs the batch worker a wait behind the event loop)."""
    if len(values) + len(u) <= 2 * FEW:
        pos = {v: i for i, v in enumerate(values.tolist())}
        return [pos[v] for v in u.tolist()]
    return np.searchsorted(values, u)


def _sum_paths(
    n: int, n_actions: int, d: int, gs: Sequence[npt.NDArray[np.float64]], index: Sequence[Any]
) -> npt.NDArray[np.float64]:
    """The noise [n, n_actions] of a request from its pairs' values ``gs`` (in :func:`_pairs`
    order): g_a(x) = sum_j g_{a,j}(x_j), summed in coordinate order (the same bits every time)."""
    noise = np.zeros((n, n_actions), dtype=np.float64)
    k = 0
    for i in range(n_actions):
        for _j in range(d):
            noise[:, i] += gs[k][index[k]]
            k += 1
    return noise


class QueryService(ContextService):
    """GetValues, GetBestActions, GetRelease (and the v2 model's one action per state) on the
    active release."""

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        #: values already answered: answered again by look-ups
        self.answers = AnswerCache()
        #: (release, lo, hi, hi - lo) of the release whose box bounds were last needed
        self._box_bounds: tuple[Any, ...] | None = None

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

    def _release(
        self,
        rel: ActiveRelease,
        parts: Sequence[tuple[npt.NDArray[np.float64], list[int], npt.NDArray[np.float64], Any]],
    ) -> list[npt.NDArray[np.float64]]:
        """The released values of each call's (unit states, actions, model values ``q``,
        noise): on the value grid, counted, and kept for look-ups (:meth:`stored_values`),
        one count and one keeping per set of actions for all the calls together."""
        grid = self.limits.value_grid
        out = [grid_round(q + noise, grid) for _xs, _acts, q, noise in parts]
        self.metrics.answered(
            sum(int(xs.shape[0]) * len(acts) for xs, acts, _q, _n in parts),
            self.store.points_drawn,
        )
        by_actions: dict[tuple[int, ...], list[int]] = {}
        for k, (_xs, acts, _q, _n) in enumerate(parts):
            by_actions.setdefault(tuple(acts), []).append(k)
        for acts_key, ks in by_actions.items():
            xs = np.concatenate([parts[k][0] for k in ks])
            vals = np.concatenate([out[k] for k in ks])
            self.answers.record(rel.release_id, xs, list(acts_key), vals, rel.bundle.n_actions)
        return out

    def _known_noise(
        self,
        rel: ActiveRelease,
        xs: npt.NDArray[np.float64],
        actions: list[int],
        *,
        publish: bool = True,
    ) -> npt.NDArray[np.float64] | None:
        """The noise of a request whose states are all stored (``store.known_values``: the
        in-process copies, no database), summed over a d-coordinate release's paths in
        coordinate order as :func:`_sum_paths` does for new ones; None when any state is new."""
        d = xs.shape[1]
        got = self.store.known_values(
            rel.release_id,
            _paths(actions, d),
            [xs[:, j] for _a in actions for j in range(d)],
            publish=publish,
        )
        if got is None:
            return None
        return _sum_paths(xs.shape[0], len(actions), d, got, [slice(None)] * len(got))

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

    def values(
        self, query: ParsedQuery, *, deadline: float | None = None, caller: str = "local"
    ) -> t.Values:
        """:meth:`get_values` of a parsed request: :meth:`get_values_many` of one call (the
        noise of a d-coordinate release: g_a(x) = sum_j g_{a,j}(x_j), each g_{a,j} a 1-D OU
        path of the store, path a * d + j with its own beta_j; the new points of every action
        and coordinate stored in one durable transaction before anything is answered)."""
        (out,) = self.get_values_many([ValuesAsk(query, deadline, caller)])
        if isinstance(out, Exception):
            raise out
        return out

    def get_values_many(self, asks: Sequence[ValuesAsk]) -> list[t.Values | Exception]:
        """:meth:`get_values` of each call of a batch (each parsed already), in one pass:
        what each would answer or raise alone, but the new points of all of them are stored
        in ONE durable transaction (one store call over the union of their states, one
        refresh of the release for all their reservations). Each call is admitted (its own
        reservation under its own caller's budget) and checked against its own deadline on
        its own; a call refused stores nothing. If the shared store call fails, each
        admitted call then makes its own (so a failure is reported to exactly the calls it
        concerns)."""
        out: list[t.Values | Exception | None] = [None] * len(asks)
        new: dict[int, tuple[ActiveRelease, list[_NewAsk]]] = {}
        for i, ask in enumerate(asks):
            try:
                rel, xs, acts = ask.query.rel, ask.query.xs, ask.query.actions
                q = rel.bundle.q_values_unit(xs)[:, acts]
                _check_deadline(ask.deadline)
                noise = None if ask.looked_up else self._known_noise(rel, xs, acts)
                if noise is not None:
                    (vals,) = self._release(rel, [(xs, acts, q, noise)])
                    out[i] = self._values(rel, acts, vals)
                    continue
                pairs, index = _pairs(xs, acts)
                new.setdefault(id(rel), (rel, []))[1].append(_NewAsk(i, xs, acts, q, pairs, index))
            except Exception as exc:  # noqa: BLE001 - this call's own outcome
                out[i] = exc
        for rel, calls in new.values():
            self._new_many(rel, calls, asks, out)
        return [o if o is not None else RuntimeError("unanswered") for o in out]

    def _new_many(
        self,
        rel: ActiveRelease,
        calls: list[_NewAsk],
        asks: Sequence[ValuesAsk],
        out: list[t.Values | Exception | None],
    ) -> None:
        """The calls of a batch with new states, of one release (see :meth:`get_values_many`)."""
        rid = rel.release_id
        admitted: list[_NewAsk] = []
        try:
            self.store.refresh(rid, wait=False)  # one read for every reservation below
            for c in calls:
                try:
                    c.ticket = self.store.reserve(  # before anything is sampled
                        rid,
                        c.pairs,
                        quotas=self.quotas,
                        caller=asks[c.at].caller,
                        rows=(c.xs, c.index),
                        refresh=False,
                    )
                    admitted.append(c)
                    _check_deadline(asks[c.at].deadline)
                except Exception as exc:  # noqa: BLE001 - this call's own outcome
                    out[c.at] = exc
            live = [c for c in admitted if out[c.at] is None]
            if not live:
                return
            union: dict[int, list[npt.NDArray[np.float64]]] = {}
            for c in live:
                for p, u in c.pairs:
                    union.setdefault(p, []).append(u)
            paths = sorted(union)
            values = [_union(union[p]) for p in paths]
            try:
                gs = dict(
                    zip(paths, self.store.get_or_sample_paths(rid, paths, values), strict=True)
                )
                at = dict(zip(paths, values, strict=True))
                got = {c.at: [gs[p][_positions(at[p], u)] for p, u in c.pairs] for c in live}
            except Exception:  # noqa: BLE001 - each call then learns its own outcome
                if len(live) == 1:  # the call's own store call failed
                    raise
                got = {}
                for c in live:
                    try:
                        got[c.at] = self.store.get_or_sample_paths(
                            rid, [p for p, _ in c.pairs], [u for _, u in c.pairs]
                        )
                    except Exception as exc:  # noqa: BLE001 - this call's own outcome
                        out[c.at] = exc
            done = [c for c in live if c.at in got]
            released = self._release(
                rel,
                [
                    (
                        c.xs,
                        c.actions,
                        c.q,
                        _sum_paths(
                            c.xs.shape[0], len(c.actions), c.xs.shape[1], got[c.at], c.index
                        ),
                    )
                    for c in done
                ],
            )
            for c, vals in zip(done, released, strict=True):
                out[c.at] = self._values(rel, c.actions, vals)
        except Exception as exc:  # noqa: BLE001 - the refresh or a lone call's store call failed
            for c in calls:
                if out[c.at] is None:
                    out[c.at] = exc
        finally:
            for c in admitted:
                self.quotas.done(rid, c.ticket)

    def get_stored_values(
        self,
        states: npt.ArrayLike,
        actions: Sequence[int] = (),
        *,
        release_id: str = "",
        deadline: float | None = None,
    ) -> t.Values | None:
        """:meth:`get_values` for a request whose states are all stored, without blocking:
        the same validation, model and value grid, the noise from the store's in-process
        copies (no admission, no database, no witness write), or None when any state is new
        or its answer needs the witness first (the caller then runs :meth:`get_values`).
        Bad input raises as in :meth:`get_values`; nothing is stored either way."""
        return self.stored_values(
            self.parse(states, actions, release_id=release_id), deadline=deadline
        )

    def parse(
        self, states: npt.ArrayLike, actions: Sequence[int] = (), *, release_id: str = ""
    ) -> ParsedQuery:
        """A GetValues request validated on the active release (a pinned other release,
        states or actions that are not valid raise as in :meth:`get_values`)."""
        rel = self._release_for_query(release_id)
        return ParsedQuery(rel, self._states(rel, states), self._actions(rel, actions))

    def stored_values(
        self, query: ParsedQuery, *, deadline: float | None = None
    ) -> t.Values | None:
        """:meth:`get_stored_values` of a parsed request."""
        rel, xs, acts = query.rel, query.xs, query.actions
        _check_deadline(deadline)
        vals = self.answers.lookup(rel.release_id, xs, acts)  # answered before: look-ups
        if vals is None:
            noise = self._known_noise(rel, xs, acts, publish=False)
            if noise is None:
                return None
            q = rel.bundle.q_values_unit(xs)[:, acts]
            (vals,) = self._release(rel, [(xs, acts, q, noise)])
            return self._values(rel, acts, vals)
        # still refused when a path's log was refused since
        self.store.check_paths(rel.release_id, _paths(acts, int(xs.shape[1])))
        self.metrics.answered(int(xs.shape[0]) * len(acts), self.store.points_drawn)
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
        per state (the v2 model's ACTION input). Every action is validated before the
        store is touched; each action's states go through :meth:`values` (the GetValues path)."""
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
            query = ParsedQuery(rel, xs[idx], [int(a)])
            out[idx] = self.values(query, deadline=deadline, caller=caller).values[:, 0]
        return rel.release_id, out

    def get_release(self) -> t.Release:
        rel = self.holder.current()
        return views.release_from_bundle(
            rel.bundle, record=rel.record, value_grid=self.limits.value_grid
        )
