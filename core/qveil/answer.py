"""What a release answers: the one function from (release, unit state) to released values.

For unit states x (each coordinate already clipped into its public interval and mapped onto
[0, 1]) and actions a, a release r answers

    value(x, a) = grid_round( Q_r(snap(x), a) + sum_j g_{r, a d + j}(snap(x)_j) )

where ``snap`` puts each coordinate on the dyadic grid i 2^-32 (:func:`qveil.keyed.snap`),
Q_r is the release's model at the SNAPPED state and g is the release's keyed noise
(:class:`qveil.keyed.KeyedPaths`). Evaluating the mean at the snapped state too makes the
release the Gaussian-process mechanism at grid points: two raw states that snap to one grid
point get one answer, so their difference reveals nothing. The server (``qveil serve``),
the in-process evaluations (``qveil evaluate DIR``, ``qveil evaluate --private``) and the
audit all compute it here, so each gets the served bits.

Why the value grid: released values are rounded to multiples of ``value_grid`` (a power of
two, default 2^-20). The low-order bits of a floating-point sum q + g are not uniformly
distributed and depend on q (Mironov 2012, "On significance of the least significant bits
for differential privacy"); rounding to a fixed power-of-two grid coarser than the double
spacing of any served magnitude (|v| < 2^32) removes them. A mitigation, not a proof.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from qveil.additive import validate_unit_points
from qveil.bundle.io import Bundle
from qveil.errors import InvalidArgument
from qveil.keyed import snap, sum_coordinates

__all__ = ["DEFAULT_VALUE_GRID", "Answer", "answer_snapped", "grid_round", "released_values"]

FloatArray = npt.NDArray[np.float64]

#: the default value grid of every answer (``qveil serve --value-grid``)
DEFAULT_VALUE_GRID = 2.0**-20


def grid_round(values: FloatArray, grid: float) -> FloatArray:
    """Round to the nearest multiple of ``grid`` (a power of two: the scaling is exact)."""
    out: FloatArray = np.round(values / grid) * grid + 0.0
    return out


class Answer(NamedTuple):
    """Released ``values`` [n, len(actions)] and each path's noise ``coords``
    [n, len(actions), d] (g_{a d + j} at the snapped coordinate j: what the answer log keeps)."""

    values: FloatArray
    coords: FloatArray


def answer_snapped(
    bundle: Bundle,
    xs: FloatArray,
    idx: npt.NDArray[np.uint64],
    actions: Sequence[int],
    *,
    value_grid: float = DEFAULT_VALUE_GRID,
) -> Answer:
    """The answer at snapped unit states ``xs`` [n, d] with grid indices ``idx`` [n, d]
    (:func:`qveil.keyed.snap`) for ``actions`` of the loaded release ``bundle``."""
    acts = list(actions)
    # xs come from snap (checked, on the grid, no -0.0): the model's forward without
    # Bundle.q_values_unit's second check of them (the same values)
    q = bundle.model.q_values_unit(xs)[:, acts]
    coords = bundle.noise_paths.coordinate_values(idx, acts)
    return Answer(grid_round(q + sum_coordinates(coords), value_grid), coords)


def released_values(
    bundle: Bundle,
    unit_states: npt.ArrayLike,
    actions: Sequence[int] | None = None,
    *,
    value_grid: float = DEFAULT_VALUE_GRID,
) -> FloatArray:
    """The release's answers [n, len(actions)] (all actions by default) at unit states
    [n, d]: what ``qveil serve`` answers for them, bit for bit."""
    u = validate_unit_points(unit_states, int(bundle.dims))  # [n, d]: never re-shaped
    idx, xs = snap(u)
    m = int(bundle.n_actions)
    acts = list(range(m)) if actions is None else [int(a) for a in actions]
    bad = [a for a in acts if not 0 <= a < m]
    if bad:
        raise InvalidArgument(f"action {bad[0]} is not one of the release's 0..{m - 1}")
    return answer_snapped(bundle, xs, idx, acts, value_grid=value_grid).values
