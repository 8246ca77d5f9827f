"""Public anchor sets of the kernel fqi estimator's ``file`` layout (docs/privacy.md 2.6,
"Anchors of any public layout"): K points in the unit box [0, 1]^d of the config's
``state_intervals``, for example where simulated random-policy episodes of public dynamics go
(:func:`visitation_points`), so that the anchors sit where the users are.

D_T holds for any public anchors: the points must be public, independent of the private
data and fixed before it is read. Nothing in a file can show that; a file built from private
data would leak it, exactly as a prior would (:mod:`qveil.kfqi_prior`).

The file (``.npz``, :func:`write_anchors`) holds ``points`` (K, d) float64 in [0, 1]^d,
``state_intervals`` (d, 2) float64 (the box the unit coordinates are of), ``origin`` (a
sentence: which public data, which procedure) and ``format`` (``"qveil-anchors/1"``). A file
is used only if its intervals are the config's (:func:`check_anchor_intervals`). ``sha256``
(:func:`qveil.kfqi_spec.points_sha256`) is the hash of the points themselves, not of the
file's bytes; the card records it with the points (:meth:`AnchorSet.record`). Pure
numpy/scipy and file I/O.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument, echo
from qveil.json_types import JSONObject
from qveil.kfqi_spec import points_sha256
from qveil.npz_file import new_npz_path, read_npz_members, write_npz_atomic

__all__ = [
    "FORMAT",
    "AnchorSet",
    "check_anchor_intervals",
    "read_anchors",
    "visitation_points",
    "write_anchors",
]

FloatArray = npt.NDArray[np.float64]
#: The file format tag.
FORMAT = "qveil-anchors/1"
#: Lloyd iterations of :func:`visitation_points` (a public constant of the procedure).
LLOYD_ITERATIONS = 25
#: The public seed of :func:`visitation_points`' subsample and k-means start.
VISITATION_SEED = 7
#: At most this many states enter the k-means (a subsample of the public seed).
VISITATION_STATES = 200_000


@dataclass(frozen=True)
class AnchorSet:
    """An anchor file as read (not yet checked against a config)."""

    points: FloatArray
    state_intervals: tuple[tuple[float, float], ...]
    origin: str

    @property
    def sha256(self) -> str:
        return points_sha256(self.points)

    def record(self) -> JSONObject:
        """What a card records about the anchors (public: the anchors are public): their
        hash, origin, count and the points themselves (K x d numbers, so that the release's
        estimator can be refitted from the card alone, as ``qveil evaluate`` does)."""
        return {
            "sha256": self.sha256,
            "origin": self.origin,
            "anchors": len(self.points),
            "points": self.points.tolist(),
        }


def visitation_points(
    states: npt.ArrayLike,
    count: int,
    *,
    seed: int = VISITATION_SEED,
    max_states: int = VISITATION_STATES,
) -> FloatArray:
    """``count`` anchors where the (n, d) unit ``states`` (of PUBLIC data only) are: k-means
    (Lloyd, :data:`LLOYD_ITERATIONS` steps) of at most ``max_states`` of them (a subsample
    drawn with the public ``seed``), started from ``count`` distinct states drawn with the
    same generator; an empty cluster keeps its centre. Deterministic: the same states and
    seed give the same bits. The points are sorted (lexicographically) so that their order
    does not depend on the draw."""
    from scipy.spatial import cKDTree  # loads only when anchors are built

    x = np.asarray(states, dtype=np.float64)
    if x.ndim != 2 or not np.isfinite(x).all():
        raise InvalidArgument("visitation states must be a finite (n, d) array")
    x = np.clip(x, 0.0, 1.0)
    rng = np.random.default_rng(int(seed))
    if len(x) > max_states:
        x = x[np.sort(rng.choice(len(x), size=int(max_states), replace=False))]
    uniq = np.unique(x, axis=0)
    k = int(count)
    if not 1 <= k <= len(uniq):
        raise InvalidArgument(f"count must lie in [1, {len(uniq)}] (distinct states), got {k}")
    c = uniq[np.sort(rng.choice(len(uniq), size=k, replace=False))]
    for _ in range(LLOYD_ITERATIONS):
        _, lab = cKDTree(c).query(x)
        n = np.bincount(lab, minlength=k).astype(np.float64)
        s = np.stack([np.bincount(lab, weights=x[:, j], minlength=k) for j in range(x.shape[1])])
        c = np.where(n[:, None] > 0, s.T / np.maximum(n, 1.0)[:, None], c)
    c = np.clip(c, 0.0, 1.0)
    out: FloatArray = c[np.lexsort(c.T[::-1])]
    return out


def write_anchors(
    path: str | os.PathLike[str],
    *,
    points: npt.ArrayLike,
    state_intervals: Sequence[Sequence[float]],
    origin: str,
) -> AnchorSet:
    """Write an anchor file (atomically; the file must not exist) and return it as read
    back. Points outside [0, 1]^d, not finite or of another d are refused; nothing is
    written then."""
    out = new_npz_path(path, "anchor file")
    a = AnchorSet(
        points=np.asarray(points, dtype=np.float64),
        state_intervals=tuple((float(lo), float(hi)) for lo, hi in state_intervals),
        origin=str(origin),
    )
    _check(a)
    write_npz_atomic(
        out,
        {
            "format": np.array(FORMAT),
            "points": a.points,
            "state_intervals": np.asarray(a.state_intervals, dtype=np.float64),
            "origin": np.array(a.origin),
        },
    )
    return read_anchors(out)


def read_anchors(path: str | os.PathLike[str]) -> AnchorSet:
    """An anchor file as written by :func:`write_anchors` (InvalidArgument otherwise)."""
    z = read_npz_members(
        path, "anchor file", fmt=FORMAT, required=("points", "state_intervals", "origin")
    )
    try:
        a = AnchorSet(
            points=np.asarray(z["points"], dtype=np.float64),
            state_intervals=_intervals(z["state_intervals"]),
            origin=str(z["origin"].item()),
        )
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"anchor file {echo(path)} is malformed: {str(exc)[:120]}") from None
    _check(a)
    return a


def _intervals(iv: npt.ArrayLike) -> tuple[tuple[float, float], ...]:
    """(lo, hi) per coordinate of a stored (d, 2) array (InvalidArgument for another shape)."""
    a = np.asarray(iv, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 2:
        raise InvalidArgument(f"state intervals must be (d, 2), got shape {a.shape}")
    return tuple((float(lo), float(hi)) for lo, hi in a)


def _check(a: AnchorSet) -> None:
    d = len(a.state_intervals)
    pts = a.points
    if pts.ndim != 2 or pts.shape[1] != d or len(pts) < 1:
        raise InvalidArgument(f"anchor points must be (K, {d}), got shape {pts.shape}")
    if not (np.isfinite(pts).all() and (pts >= 0.0).all() and (pts <= 1.0).all()):
        raise InvalidArgument("anchor points must lie in the unit box [0, 1]^d")
    if not all(math.isfinite(lo) and math.isfinite(hi) and lo < hi for lo, hi in a.state_intervals):
        raise InvalidArgument("an anchor file's state intervals must be finite [lo, hi], lo < hi")


def check_anchor_intervals(a: AnchorSet, state_intervals: Sequence[Sequence[float]]) -> None:
    """The file's unit box must be the config's (the same points mean other states in
    another box): InvalidArgument otherwise."""
    want = tuple((float(lo), float(hi)) for lo, hi in state_intervals)
    if a.state_intervals != want:
        raise InvalidArgument(
            f"the anchor file is for state intervals {list(a.state_intervals)!r:.80}, the "
            f"config's are {list(want)!r:.80}"
        )
