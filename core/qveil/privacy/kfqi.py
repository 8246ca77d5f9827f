"""The accountant of the d-coordinate (kernel) variant of the `fqi` mode
(docs/privacy.md section 2.6): a sibling of :mod:`qveil.privacy.fqi` with the same D_T.

The release is f_a = L(Q_T(., a)) + g_a for each of m actions, with Q_T the per-user (or
pooled) averager FQI of :mod:`qveil.kfqi` on d unit coordinates, L the public subspace KRR
onto the additive RKHS of K(x, y) = sum_j exp(-beta_j |x_j - y_j|), and g_a independent
GP(0, sigma^2 K) paths (:class:`qveil.additive.AdditiveSamplePath`; every coordinate path
carries the full sigma). One Gaussian mechanism in the RKHS of K over the m actions:

    kappa = 1 / (4 lam),   Delta = D_T sqrt(m kappa) (1 + 1e-9),                       (1)

with D_T from :func:`qveil.privacy.fqi.sup_sensitivity` (the same formulas: the averager
argument does not depend on the dimension) and sigma from the analytic Gaussian mechanism.

The parameters are recorded with ``estimator = "kernel"`` so that any reader can tell this
variant from the 1-D grid one (bundles an earlier version wrote);
:func:`qveil.privacy.events.account_params`, the one entry point for any recorded parameter
set, dispatches on it. Pure functions of public parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qveil.errors import InvalidArgument
from qveil.json_types import JSONMapping, JSONObject
from qveil.privacy.checks import number as _num
from qveil.privacy.fqi import (
    FQIPrivacyResult,
    RelationParams,
    accounted,
    calibrated,
    check_noise,
    check_relation,
    joint_sensitivity,
    params_from_dict,
)

__all__ = [
    "KERNEL_BASIS",
    "PRIOR_BASIS",
    "KernelFQIPrivacyParams",
    "account_kernel_fqi",
    "calibrate_kernel_fqi",
]

_COMMON = (
    "a public subspace kernel ridge regression (inducing points on a per-coordinate grid) "
    "onto the additive RKHS of sum_j exp(-beta_j |x_j - y_j|) over {dims} public coordinate "
    "intervals (states outside them are clipped: public post-processing), kappa = "
    "1 / (4 lambda) for any subspace, one Gaussian mechanism over the m actions jointly "
    "(Delta = D_T sqrt(m / (4 lambda))), analytic Gaussian mechanism (Balle & Wang 2018); "
    "the noise is sum_j g_j(x_j) with independent OU paths of the full sigma each."
)

KERNEL_BASIS = {
    "user": (
        "fqi mode (kernel, d = {dims}), user-level relation: neighbouring datasets differ in "
        "one user's whole data replaced (all of that user's states, actions and rewards); "
        "N = {users} users. Averager FQI with per-user Nadaraya-Watson averaging under a "
        "product Gaussian kernel (D_T = r0 (1 - gamma^T) / (N (1 - gamma)^2)), " + _COMMON
    ),
    "reward": (
        "fqi mode (kernel, d = {dims}), reward relation: transitions are public (a "
        "reward-independent behaviour policy) and each sample's reward is the mean of "
        "N = {users} users' private reward functions in the declared range; neighbouring "
        "datasets differ in one user's reward function replaced. Averager FQI with pooled "
        "Nadaraya-Watson averaging (D_T = (hi - lo) (1 - gamma^T) / (N (1 - gamma))), " + _COMMON
    ),
}


#: Appended to the basis of a release whose uncovered users vote a public prior.
PRIOR_BASIS = (
    " Where a user's (or a pooled) average does not reach an anchor, the vote is the public "
    "prior's value there (sha256 {sha256}: a data-independent table in the Q range), not a "
    "constant; D_T is unchanged (docs/privacy.md 2.6)."
)


@dataclass(frozen=True, kw_only=True)
class KernelFQIPrivacyParams(RelationParams):
    """Everything the kernel accountant needs (public; validated; JSON round-trippable)."""

    estimator: str = "kernel"
    dims: int
    betas: tuple[float, ...]
    lam: float
    anchor_points: int
    inducing_points: int
    prior_sha256: str | None = None
    """The sha256 of the public prior the uncovered users vote (:mod:`qveil.kfqi_prior`),
    or None for the constant default. It does not enter any number (D_T is the same); the
    basis names it."""

    def __post_init__(self) -> None:
        if self.mode != "fqi" or self.estimator != "kernel":
            raise InvalidArgument("KernelFQIPrivacyParams is for mode fqi, estimator kernel")
        check_relation(
            self, ("users", "iterations", "actions", "dims", "anchor_points", "inducing_points")
        )
        b = self.betas
        if not isinstance(b, list | tuple) or len(b) != self.dims:
            raise InvalidArgument(f"betas must be {self.dims} numbers, got {b!r:.80}")
        object.__setattr__(
            self, "betas", tuple(_num(f"betas[{j}]", v, lo=0.0) for j, v in enumerate(b))
        )
        object.__setattr__(self, "lam", _num("lam", self.lam, lo=0.0))
        h = self.prior_sha256
        if h is not None and not (
            isinstance(h, str) and len(h) == 64 and all(c in "0123456789abcdef" for c in h)
        ):
            raise InvalidArgument(f"prior_sha256 must be 64 hex digits, got {h!r:.80}")
        check_noise(self)

    @property
    def kappa(self) -> float:
        return 1.0 / (4.0 * self.lam)

    def to_dict(self) -> JSONObject:
        d = super().to_dict()
        if self.prior_sha256 is None:  # a release without a prior records what it always did
            d.pop("prior_sha256")
        return d

    @classmethod
    def from_dict(cls, d: JSONMapping) -> KernelFQIPrivacyParams:
        out: KernelFQIPrivacyParams = params_from_dict(cls, d, "kernel fqi")
        return out


def _sensitivity(p: KernelFQIPrivacyParams) -> tuple[float, float, float]:
    return joint_sensitivity(p, p.kappa)


def account_kernel_fqi(p: KernelFQIPrivacyParams) -> FQIPrivacyResult:
    """epsilon at ``p.delta`` for noise ``p.sigma`` (equation 1). The result's ``beta`` is
    the largest beta_j (the card lists all of them); ``noise_to_value`` is the marginal
    noise sd at a state, sigma sqrt(d), over the value scale."""
    return accounted(
        p,
        who="account_kernel_fqi",
        kappa=p.kappa,
        beta=max(p.betas),
        noise_sd=(p.sigma if p.sigma is not None else 0.0) * math.sqrt(p.dims),
        basis=KERNEL_BASIS[p.neighbour].format(users=p.users, dims=p.dims)
        + ("" if p.prior_sha256 is None else PRIOR_BASIS.format(sha256=p.prior_sha256)),
    )


def calibrate_kernel_fqi(p: KernelFQIPrivacyParams, *, epsilon: float) -> FQIPrivacyResult:
    """The smallest sigma giving (epsilon, p.delta)-DP, and its accounting."""
    return calibrated(p, epsilon, _sensitivity(p)[2], account_kernel_fqi)
