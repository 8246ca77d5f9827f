"""The released values of stored states, kept once answered: a request of states that were
all answered before is answered by look-ups alone (no model forward, no noise sum, no grid
rounding).

A released value is ``grid_round(Q_a(x) + g_a(x))``: the release's mean (fixed by its
bundle) plus the stored noise (fixed once committed) on the server's value grid (fixed for
the process). So the value answered for a unit state x and action a never changes while the
release is active, and keeping it is exact. Only values already answered are kept, after
their answer was computed, so every kept value's noise was committed and witnessed before
it was first answered (the store's rules); answering it again adds nothing new.

Keys: a one-coordinate unit state is its float; a state of d coordinates is the 8 d bytes
of its row (unit states carry no -0.0: the map adds +0.0). At most ``max_entries`` values
are kept per process (a release with more answered states answers the rest by the general
path). A new active release starts an empty cache.
"""

from __future__ import annotations

import math
import threading
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

from qveil.noise import FEW

__all__ = ["AnswerCache", "MAX_ENTRIES"]

FloatArray = npt.NDArray[np.float64]

#: values kept per process (about 100 bytes each)
MAX_ENTRIES = 2_000_000


def _keys(xs: FloatArray) -> list[Any]:
    """One hashable key per unit state: (n,) or (n, 1) -> floats, (n, d) -> row bytes."""
    if xs.ndim == 1 or xs.shape[1] == 1:
        return list(xs.reshape(-1).tolist())
    rows = np.ascontiguousarray(xs, dtype=np.float64)
    return list(rows.view(np.dtype((np.void, 8 * xs.shape[1]))).reshape(-1).tolist())


class AnswerCache:
    """Released values per active release: unit state (:func:`_keys`) -> a row of the
    release's values matrix (one column per action, NaN where that action was not answered;
    see the module docstring). One dict look-up per state, whatever the number of actions.

    Readers take no lock: a look-up reads one snapshot (release, rows, matrix, rows filled)
    and C-level dict look-ups; a row index at or past the snapshot's fill (a state kept
    after the snapshot) is a miss. Writers serialise on a lock, write a row's values before
    its key becomes visible, and fill only NaN cells (a kept value never changes)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._snap: tuple[str, dict[Any, int], FloatArray, int] = ("", {}, np.empty((0, 0)), 0)
        self._lock = threading.Lock()

    def lookup(self, release_id: str, xs: FloatArray, actions: list[int]) -> FloatArray | None:
        """``out[i, j]``: the value answered for unit state ``xs[i]`` ((n,) or (n, d)) and
        ``actions[j]``, or None when any of them was not answered before."""
        rid, rows, vals, filled = self._snap
        if rid != release_id or not filled or max(actions, default=0) >= vals.shape[1]:
            return None
        n = int(xs.shape[0])
        idx: Any
        if n <= FEW:  # a few states: a list (numpy's fixed costs are what a few states pay)
            idx = [rows.get(k, filled) for k in _keys(xs)]
            if max(idx, default=0) >= filled:  # not kept (or kept after this snapshot)
                return None
        else:
            idx = np.fromiter(map(rows.get, _keys(xs), repeat(filled, n)), np.intp, count=n)
            if idx.max(initial=0) >= filled:
                return None
        out: FloatArray = vals.take(idx, axis=0).take(actions, axis=1)
        # released values are finite: NaN marks one not kept (and a sum of finite values
        # is never NaN)
        if math.isnan(out.sum()):
            return None
        return out

    def record(
        self,
        release_id: str,
        xs: FloatArray,
        actions: list[int],
        values: FloatArray,
        n_actions: int,
    ) -> None:
        """Keep ``values[i, j]``, answered for unit state ``xs[i]`` ((n,) or (n, d)) and
        ``actions[j]`` of a release of ``n_actions`` actions."""
        with self._lock:
            rid, rows, vals, filled = self._snap
            if rid != release_id or vals.shape[1] != n_actions:
                rid, rows, vals, filled = release_id, {}, np.empty((0, n_actions)), 0
            keys = _keys(xs)
            idx = np.fromiter(map(rows.get, keys, repeat(-1)), np.intp, count=len(keys))
            fresh = list(dict.fromkeys(k for k, i in zip(keys, idx.tolist(), strict=True) if i < 0))
            if (filled + len(fresh)) * n_actions > self.max_entries:
                fresh = []
            at = dict(zip(fresh, range(filled, filled + len(fresh)), strict=True))
            if filled + len(fresh) > vals.shape[0]:  # grow: a new matrix, the old one intact
                grown = np.full((max(1024, 2 * (filled + len(fresh))), n_actions), np.nan)
                grown[:filled] = vals[:filled]
                vals = grown
            idx = np.fromiter(
                (i if i >= 0 else at.get(k, -1) for k, i in zip(keys, idx.tolist(), strict=True)),
                np.intp,
                count=len(keys),
            )
            keep = idx >= 0
            sub = vals[idx[keep][:, None], actions]
            vals[idx[keep][:, None], actions] = np.where(np.isnan(sub), values[keep], sub)
            self._snap = (rid, rows, vals, filled + len(fresh))
            rows.update(at)  # the keys last: their rows are written
