"""The accountant of the private off-policy evaluation (``qveil evaluate --private``).

The estimate (qveil.ope) is the mean over N held-out users of a fitted-Q evaluation of a
public policy pi at each user's first state, clipped into the Q range [q_lo, q_hi]:

    J(D) = (1/N) sum_u clip(Q^pi_T(D)(s0_u, pi(s0_u))),

where Q^pi_T is T steps of the per-user averager of the fqi mode with V_t(s') = Q_t(s', pi(s'))
(the max of the fqi mode replaced by the public policy's action). **Sensitivity** under the
user relation (one user's whole data replaced, N fixed): the averager's argument for D_T
holds unchanged (ranges, convex combinations, one user's own term; docs/privacy.md 2.5), so
||Q^pi_T(D) - Q^pi_T(D')||_inf <= D_T = r0 (1 - gamma^T) / (N (1 - gamma)^2). Each user's term
is a convex combination of anchor values (1-Lipschitz in sup norm) then a clip, so the N - 1
terms of the users both datasets share move by at most D_T each, and the replaced user's own
term by at most q_hi - q_lo:

    |J(D) - J(D')| <= (N - 1)/N D_T + (q_hi - q_lo)/N <= D_T + (q_hi - q_lo) / N = Delta_J.

One Gaussian mechanism on the scalar, sigma from the analytic Gaussian mechanism (Balle & Wang
2018) at (epsilon, delta); it is mu-GDP with mu = Delta_J / sigma, and is charged to the
population's ledger like a release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from qveil.errors import InvalidArgument
from qveil.json_types import JSONMapping, JSONObject
from qveil.kfqi_spec import q_range
from qveil.privacy.fqi import sup_sensitivity
from qveil.privacy.gaussian import (
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
)
from qveil.privacy.params import one_gaussian
from qveil.privacy.record import GaussianResult, Record

__all__ = [
    "OPEPrivacyParams",
    "OPEPrivacyResult",
    "account_ope",
    "calibrate_ope",
    "ope_sensitivity",
]

BASIS = (
    "private off-policy evaluation (fqi mode, estimator ope), user-level relation: one user's "
    "whole held-out data replaced; N = {users} users. The mean over users of a fitted-Q "
    "evaluation of the public policy at each user's first state, clipped into the Q range; "
    "Delta_J = D_T + (q_hi - q_lo) / N; one Gaussian mechanism on the scalar, analytic "
    "Gaussian mechanism (Balle & Wang 2018)."
)


@dataclass(frozen=True, kw_only=True)
class OPEPrivacyParams(Record):
    """Everything the OPE accountant needs (public, validated, JSON round-trippable)."""

    _AS_LISTS = ("reward_range",)

    mode: str = "fqi"
    estimator: str = "ope"
    users: int
    reward_range: tuple[float, float]
    gamma: float
    iterations: int
    delta: float
    sigma: float | None = None

    def __post_init__(self) -> None:
        if self.mode != "fqi" or self.estimator != "ope":
            raise InvalidArgument("OPE privacy params have mode fqi, estimator ope")
        if int(self.users) != self.users or self.users < 1:
            raise InvalidArgument(f"users must be an integer >= 1, got {self.users!r}")
        lo, hi = (float(v) for v in self.reward_range)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise InvalidArgument(f"reward_range must be finite lo < hi, got {self.reward_range}")
        object.__setattr__(self, "reward_range", (lo, hi))
        if not 0.0 <= float(self.gamma) < 1.0:
            raise InvalidArgument(f"gamma must be in [0, 1), got {self.gamma!r}")
        if int(self.iterations) != self.iterations or self.iterations < 1:
            raise InvalidArgument(f"iterations must be an integer >= 1, got {self.iterations!r}")
        if not 0.0 < float(self.delta) < 1.0:
            raise InvalidArgument(f"delta must be in (0, 1), got {self.delta!r}")
        if self.sigma is not None and not (math.isfinite(self.sigma) and self.sigma > 0):
            raise InvalidArgument(f"sigma must be > 0, got {self.sigma!r}")

    @property
    def q_range(self) -> tuple[float, float]:
        """The clip range of each user's term: :func:`qveil.kfqi_spec.q_range`, the same
        ends :func:`qveil.ope.policy_value` clips into."""
        return q_range(self.reward_range, self.gamma)

    @classmethod
    def from_dict(cls, d: JSONMapping) -> OPEPrivacyParams:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in dict(d).items() if k in names})


def ope_sensitivity(p: OPEPrivacyParams) -> float:
    """Delta_J = D_T + (q_hi - q_lo) / N (the module docstring)."""
    qlo, qhi = p.q_range
    dt = sup_sensitivity(
        neighbour="user",
        users=p.users,
        reward_range=p.reward_range,
        gamma=p.gamma,
        iterations=p.iterations,
    )
    return dt + (qhi - qlo) / p.users


@dataclass(frozen=True)
class OPEPrivacyResult(GaussianResult):
    """The OPE accountant's conclusion (the estimate is (epsilon, delta)-DP)."""

    mode: str
    epsilon: float
    delta: float
    delta_total: float
    holds: bool
    sigma: float
    sensitivity: float
    basis: str
    reason: str | None
    params: OPEPrivacyParams
    target: JSONObject | None = None


def account_ope(p: OPEPrivacyParams) -> OPEPrivacyResult:
    """epsilon at ``p.delta`` of the estimate released with noise ``p.sigma``."""
    if p.sigma is None:
        raise InvalidArgument("account_ope needs sigma (calibrate_ope finds one)")
    sens = ope_sensitivity(p)
    return OPEPrivacyResult(
        mode="fqi",
        **one_gaussian(p, sensitivity=sens, sigma=p.sigma),
        sensitivity=sens,
        basis=BASIS.format(users=p.users),
    )


def calibrate_ope(p: OPEPrivacyParams, *, epsilon: float) -> OPEPrivacyResult:
    """The smallest sigma giving (epsilon, p.delta)-DP, and its accounting."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidArgument(f"epsilon must be > 0, got {epsilon!r}")
    sens = ope_sensitivity(p)
    sigma = analytic_gaussian_sigma(epsilon=float(epsilon), delta=p.delta, sensitivity=sens)
    r = account_ope(p.replace(sigma=sigma))
    met = analytic_gaussian_delta(epsilon=epsilon, sensitivity=sens, sigma=sigma) <= p.delta
    return replace(r, target={"epsilon": float(epsilon), "delta": p.delta, "met": bool(met)})
