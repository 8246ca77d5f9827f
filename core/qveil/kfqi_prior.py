"""A public prior for the kernel fqi estimator (docs/privacy.md 2.6, "A public prior"): the
vote of a user whose data does not reach an anchor z with action a is the public value
p(z, a) instead of the constant ``default_value``.

The prior is a (K, m) table over the config's public anchors and the m actions, with every
value in the Q range [min(lo, 0), max(hi, 0)] / (1 - gamma). It must be a function of public
data only (for example the non-private kernel fqi of the same config on simulated episodes
of public dynamics: ``qveil train --mode fqi --config C --dataset PUBLIC --write-prior OUT``).
D_T does not change: the proof uses only that the uncovered vote is public and lies in the Q
range.

The file (``.npz``, :func:`write_prior`) holds ``values`` (K, m) float64, ``anchors`` (K, d)
float64 (the unit anchors it was built on), ``state_intervals`` (d, 2) float64, ``reward_range``
(2,) and ``gamma`` (the Q range it was built for), ``origin`` (a sentence: which public data)
and ``format`` (``"qveil-prior/1"``). A prior is used only if its anchors, state intervals and
action count are the config's and every value lies in the config's Q range; otherwise it is
refused (:func:`check_prior`): values are never clipped, so the card's ``sha256`` is that of
the votes the estimator used.

``sha256`` (:func:`values_sha256`) is the hash of the values themselves (float64,
little-endian, C order), not of the file's bytes: rebuilding the prior from the same public
data gives the same hash. Pure numpy and file I/O, no randomness.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument, echo
from qveil.json_types import JSONObject
from qveil.kfqi_spec import Anchors, KernelFQISpec, check_in_q_range
from qveil.npz_file import new_npz_path, read_npz_members, write_npz_atomic

__all__ = [
    "FORMAT",
    "Prior",
    "check_prior",
    "read_prior",
    "values_sha256",
    "write_prior",
]

FloatArray = npt.NDArray[np.float64]
#: The file format tag.
FORMAT = "qveil-prior/1"
#: Anchors of the prior and of the config agree to this (both are computed by Anchors).
_ANCHOR_TOL = 1e-12


def values_sha256(values: npt.ArrayLike) -> str:
    """sha256 of the (K, m) values as little-endian float64 in C order."""
    v = np.ascontiguousarray(np.asarray(values, dtype="<f8"))
    h = hashlib.sha256(f"{v.shape[0]}x{v.shape[1]}:".encode())
    h.update(v.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Prior:
    """A prior as read from its file (not yet checked against a config)."""

    values: FloatArray
    anchors: FloatArray
    state_intervals: tuple[tuple[float, float], ...]
    reward_range: tuple[float, float]
    gamma: float
    origin: str

    @property
    def sha256(self) -> str:
        return values_sha256(self.values)

    def record(self) -> JSONObject:
        """What a card records about the prior (public: the prior is public)."""
        return {
            "sha256": self.sha256,
            "origin": self.origin,
            "anchors": int(self.values.shape[0]),
            "actions": int(self.values.shape[1]),
        }


def write_prior(
    path: str | os.PathLike[str],
    *,
    values: npt.ArrayLike,
    anchors: npt.ArrayLike,
    state_intervals: Sequence[Sequence[float]],
    reward_range: tuple[float, float],
    gamma: float,
    origin: str,
) -> Prior:
    """Write a prior file (atomically; the file must not exist) and return it as read
    back. The values are checked to be finite and within the Q range of (reward_range,
    gamma); the file is refused otherwise and nothing is written."""
    out = new_npz_path(path, "prior file")
    prior = Prior(
        values=np.asarray(values, dtype=np.float64),
        anchors=np.asarray(anchors, dtype=np.float64),
        state_intervals=tuple((float(a), float(b)) for a, b in state_intervals),
        reward_range=(float(reward_range[0]), float(reward_range[1])),
        gamma=float(gamma),
        origin=str(origin),
    )
    _check_shape(prior)
    check_in_q_range(prior.values, reward_range=prior.reward_range, gamma=prior.gamma)
    write_npz_atomic(
        out,
        {
            "format": np.array(FORMAT),
            "values": prior.values,
            "anchors": prior.anchors,
            "state_intervals": np.asarray(prior.state_intervals, dtype=np.float64),
            "reward_range": np.asarray(prior.reward_range, dtype=np.float64),
            "gamma": np.array(prior.gamma),
            "origin": np.array(prior.origin),
        },
    )
    return read_prior(out)


def read_prior(path: str | os.PathLike[str]) -> Prior:
    """A prior file as written by :func:`write_prior` (InvalidArgument for anything else)."""
    z = read_npz_members(
        path,
        "prior file",
        fmt=FORMAT,
        required=("values", "anchors", "state_intervals", "reward_range", "gamma"),
    )
    try:
        iv = np.asarray(z["state_intervals"], dtype=np.float64).reshape(-1, 2)
        rr = np.asarray(z["reward_range"], dtype=np.float64).reshape(2)
        prior = Prior(
            values=np.asarray(z["values"], dtype=np.float64),
            anchors=np.asarray(z["anchors"], dtype=np.float64),
            state_intervals=tuple((float(a), float(b)) for a, b in iv),
            reward_range=(float(rr[0]), float(rr[1])),
            gamma=float(z["gamma"].item()),
            origin=str(z["origin"].item()) if "origin" in z else "",
        )
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"prior file {echo(path)} is malformed: {str(exc)[:120]}") from None
    _check_shape(prior)
    return prior


def _check_shape(prior: Prior) -> None:
    v, z = prior.values, prior.anchors
    if v.ndim != 2 or v.shape[0] < 1 or v.shape[1] < 1:
        raise InvalidArgument(f"prior values must be (anchors, actions), got shape {v.shape}")
    if z.ndim != 2 or z.shape[0] != v.shape[0] or z.shape[1] != len(prior.state_intervals):
        raise InvalidArgument(
            f"prior anchors must be ({v.shape[0]}, {len(prior.state_intervals)}), got "
            f"shape {z.shape}"
        )


def check_prior(
    prior: Prior,
    *,
    spec: KernelFQISpec,
    state_intervals: Sequence[Sequence[float]],
    actions: int,
    reward_range: tuple[float, float],
) -> FloatArray:
    """The prior's (K, m) votes for this config, or InvalidArgument: its anchors must be the
    spec's anchors, its state intervals the config's, its action count ``actions``, and
    every value must lie in the config's Q range [min(lo, 0), max(hi, 0)] / (1 - gamma)
    (the proof of D_T needs the votes there; values outside are refused, not clipped)."""
    want = Anchors(spec).points
    if prior.anchors.shape != want.shape:
        raise InvalidArgument(
            f"the prior was built on {prior.anchors.shape[0]} anchors of "
            f"{prior.anchors.shape[1]} coordinates; the config has {want.shape[0]} of "
            f"{want.shape[1]}"
        )
    if float(np.abs(prior.anchors - want).max()) > _ANCHOR_TOL:
        raise InvalidArgument("the prior's anchors are not the config's (another layout)")
    ivs = [(float(a), float(b)) for a, b in state_intervals]
    if len(ivs) != len(prior.state_intervals) or not all(
        math.isclose(x, y, rel_tol=0.0, abs_tol=1e-12)
        for p, q in zip(ivs, prior.state_intervals, strict=True)
        for x, y in zip(p, q, strict=True)
    ):
        raise InvalidArgument(
            f"the prior's state intervals {list(prior.state_intervals)!s:.80} are not the config's"
        )
    if prior.values.shape[1] != int(actions):
        raise InvalidArgument(
            f"the prior has {prior.values.shape[1]} actions; the data has {int(actions)}"
        )
    check_in_q_range(prior.values, reward_range=reward_range, gamma=spec.gamma)
    return prior.values
