"""The accountant of the rigorous `fqi` mode (docs/privacy.md section 2.5): D_T and the
analytic Gaussian mechanism (:func:`qveil.privacy.events.account_params` is the one entry
point that re-accounts any recorded parameter set, a card's or a ledger event's).
:mod:`qveil.privacy.kfqi` is the accountant of new releases; :func:`account_fqi` remains only
to re-account the cards and ledger events of 1-D releases of the retired grid fit (the ledger
replays events from their parameters).

A grid release is f_a = L(Q_T(., a)) + g_a for each of m actions, with Q_T an averager FQI
on a public grid, L the fixed public map of :mod:`qveil.release_map` and g_a independent
GP(0, sigma^2 K_beta) paths. It is ONE Gaussian mechanism in the RKHS of K_beta (the m paths
jointly): with D_T >= sup over neighbouring datasets of ||Q_T - Q_T'||_inf and
kappa >= max_{||v||_inf <= 1} ||L v||_H^2,

    Delta = D_T sqrt(m kappa) (1 + 1e-9)                                                 (1)

bounds the joint RKHS distance, and (epsilon, delta) follows from the analytic Gaussian
mechanism (Balle & Wang 2018) with noise multiplier sigma / Delta, valid for every epsilon.

D_T (per action, uniformly over the grid), by the gamma-contraction of an averager:

* ``user`` (one user's whole data replaced; per-user averager over N users): each step moves
  by at most gamma ||Q_t - Q_t'|| + r0 / (N (1 - gamma)) with r0 = max(hi, 0) - min(lo, 0),
  so D_T = r0 (1 - gamma^T) / (N (1 - gamma)^2).                                         (2)
* ``reward`` (transitions public; each sample's reward the mean of N users' reward functions
  in [lo, hi]; one user's reward function replaced): each reward moves by at most
  (hi - lo) / N, so D_T = (hi - lo) (1 - gamma^T) / (N (1 - gamma)), tight for a constant
  shift of every reward.                                                                 (3)

Pure functions of public parameters: no I/O, no randomness.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Self, TypeVar

from qveil.errors import InvalidArgument
from qveil.json_types import JSONMapping, JSONObject
from qveil.privacy.checks import ONE_KEY
from qveil.privacy.checks import number as _num
from qveil.privacy.gaussian import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
)
from qveil.privacy.record import FieldValue
from qveil.release_map import certified_kappa

__all__ = [
    "check_noise",
    "check_relation",
    "value_scale",
    "accounted",
    "BASIS",
    "FQIPrivacyParams",
    "FQIPrivacyResult",
    "RelationParams",
    "account_fqi",
    "sup_sensitivity",
]

NEIGHBOURS = ("user", "reward")
#: A parameter set of either fqi estimator (the grid or the kernel one).
P = TypeVar("P", bound="RelationParams")
#: Relative slack on Delta for floating point (docs/privacy.md section 2.5).
DELTA_SLACK = 1e-9

BASIS = {
    "user": (
        "fqi mode, user-level relation: neighbouring datasets differ in one user's whole data "
        "replaced (all of that user's states, actions and rewards); N = {users} users. "
        "Averager FQI with per-user averaging (D_T = r0 (1 - gamma^T) / (N (1 - gamma)^2)), a "
        "fixed public linear map into the RKHS of exp(-beta |x - y|) with certified kappa, one "
        "Gaussian mechanism over the m actions jointly (Delta = D_T sqrt(m kappa)), analytic "
        "Gaussian mechanism (Balle & Wang 2018)."
    ),
    "reward": (
        "fqi mode, reward relation: transitions are public (a reward-independent behaviour "
        "policy) and each sample's reward is the mean of N = {users} users' private reward "
        "functions in the declared range; neighbouring datasets differ in one user's reward "
        "function replaced. Averager FQI (D_T = (hi - lo) (1 - gamma^T) / (N (1 - gamma))), a "
        "fixed public linear map into the RKHS of exp(-beta |x - y|) with certified kappa, one "
        "Gaussian mechanism over the m actions jointly (Delta = D_T sqrt(m kappa)), analytic "
        "Gaussian mechanism (Balle & Wang 2018)."
    ),
}


def sup_sensitivity(
    *, neighbour: str, users: int, reward_range: tuple[float, float], gamma: float, iterations: int
) -> float:
    """D_T of equations (2) and (3)."""
    lo, hi = (float(v) for v in reward_range)
    t = int(iterations)
    geo = -math.expm1(t * math.log(gamma)) if gamma > 0 else 1.0  # 1 - gamma^T
    if neighbour == "user":
        r0 = max(hi, 0.0) - min(lo, 0.0)
        return r0 * geo / (users * (1.0 - gamma) ** 2)
    if neighbour == "reward":
        return (hi - lo) * geo / (users * (1.0 - gamma))
    raise InvalidArgument(f"neighbour must be user or reward, got {neighbour!r:.80}")


def check_relation(p: RelationParams, integers: Sequence[str]) -> None:
    """Validate and normalise, on the frozen params ``p`` of either fqi estimator, the fields
    they share: the neighbour relation, the counts ``integers`` (each >= 1), reward_range and
    gamma."""
    if p.neighbour not in NEIGHBOURS:
        raise InvalidArgument(
            f"neighbour must be one of {', '.join(NEIGHBOURS)}, got {p.neighbour!r:.80}"
        )
    for name in integers:
        v = getattr(p, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v or v < 1:
            raise InvalidArgument(f"{name} must be an integer >= 1, got {v!r:.80}")
        object.__setattr__(p, name, int(v))
    rr = p.reward_range
    if not isinstance(rr, list | tuple) or len(rr) != 2:
        raise InvalidArgument(f"reward_range must be [lo, hi], got {rr!r:.80}")
    lo, hi = _num("reward_range[0]", rr[0]), _num("reward_range[1]", rr[1])
    if not lo < hi:
        raise InvalidArgument(f"reward_range must have lo < hi, got [{lo:g}, {hi:g}]")
    object.__setattr__(p, "reward_range", (lo, hi))
    object.__setattr__(p, "gamma", _num("gamma", p.gamma, lo=0.0, lo_open=False, hi=1.0))


def check_noise(p: RelationParams) -> None:
    """Validate delta in [0, 1] and sigma >= 0 (when set) on the frozen params ``p``."""
    object.__setattr__(p, "delta", _num("delta", p.delta, lo=0.0, hi=1.0))
    if p.sigma is not None:
        object.__setattr__(p, "sigma", _num("sigma", p.sigma, lo=0.0))


def value_scale(reward_range: tuple[float, float], gamma: float) -> float:
    """r0 / (1 - gamma): the width of the range [min(lo, 0), max(hi, 0)] / (1 - gamma) every
    Q_t lies in."""
    lo, hi = reward_range
    return (max(hi, 0.0) - min(lo, 0.0)) / (1.0 - gamma)


@dataclass(frozen=True, kw_only=True)
class RelationParams:
    """The recorded fields every fqi parameter set shares (public; JSON round-trippable):
    the neighbour relation, the population and reward range, gamma and T, the number of
    actions, delta and sigma. Each estimator's parameters add their map's fields."""

    mode: str = "fqi"
    neighbour: str
    users: int
    reward_range: tuple[float, float]
    gamma: float
    iterations: int
    actions: int
    delta: float
    sigma: float | None = None

    @property
    def value_scale(self) -> float:
        """r0 / (1 - gamma): the width of the range every Q_t lies in."""
        return value_scale(self.reward_range, self.gamma)

    def replace(self, **changes: FieldValue) -> Self:
        return replace(self, **changes)

    def to_dict(self) -> JSONObject:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True, kw_only=True)
class FQIPrivacyParams(RelationParams):
    """The recorded parameters of a grid release (the retired 1-D fit), re-accounted by
    :func:`account_fqi` (validated). ``kappa`` and ``beta`` are NOT inputs to trust: kappa
    is recomputed from the map's parameters (grid_points, smoother_bandwidth, beta) on every
    accounting."""

    grid_points: int
    smoother_bandwidth: float
    beta: float

    def __post_init__(self) -> None:
        if self.mode != "fqi":
            raise InvalidArgument(f"FQIPrivacyParams is for mode fqi, got {self.mode!r:.80}")
        check_relation(self, ("users", "iterations", "actions", "grid_points"))
        if self.grid_points < 2:
            raise InvalidArgument(f"grid_points must be >= 2, got {self.grid_points}")
        object.__setattr__(
            self,
            "smoother_bandwidth",
            _num("smoother_bandwidth", self.smoother_bandwidth, lo=0.0, lo_open=False),
        )
        object.__setattr__(self, "beta", _num("beta", self.beta, lo=0.0))
        check_noise(self)

    @classmethod
    def from_dict(cls, d: JSONMapping) -> FQIPrivacyParams:
        out: FQIPrivacyParams = params_from_dict(cls, d, "fqi")
        return out


def params_from_dict(cls: type[P], d: JSONMapping, what: str) -> P:
    """``cls(**d)`` for a recorded parameter set; unknown or missing keys are
    InvalidArgument (a card from a newer version must not be silently mis-read)."""
    if not isinstance(d, Mapping):
        raise InvalidArgument(f"{what} privacy params must be a mapping, got {type(d).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise InvalidArgument(f"unknown {what} privacy parameter(s): {', '.join(unknown)[:80]}")
    try:
        return cls(**dict(d))
    except TypeError as exc:
        raise InvalidArgument(f"{what} privacy params: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class FQIPrivacyResult:
    """The fqi accountant's conclusion: the release is (epsilon, delta_total)-DP under
    ``neighbour``; every number here is recomputed from :class:`FQIPrivacyParams`."""

    mode: str
    neighbour: str
    epsilon: float
    delta: float
    delta_total: float
    holds: bool
    sigma: float
    beta: float
    kappa: float
    sup_sensitivity: float
    sensitivity: float
    noise_to_value: float
    basis: str
    reason: str | None
    #: the parameters accounted: a grid release's (:class:`FQIPrivacyParams`) or the kernel
    #: estimator's (:class:`qveil.privacy.kfqi.KernelFQIPrivacyParams`)
    params: RelationParams
    target: JSONObject | None = None

    @property
    def mu(self) -> float:
        """GDP parameter Delta / sigma (exact composition in the ledger)."""
        return self.sensitivity / self.sigma

    def to_dict(self) -> JSONObject:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "params"}
        d["params"] = self.params.to_dict()
        d["mu"] = self.mu
        d["mechanisms"] = 1
        if self.target is None:
            d.pop("target")
        return d


def _kappa(p: FQIPrivacyParams) -> float:
    return certified_kappa(p.grid_points, p.smoother_bandwidth, p.beta)


def joint_sensitivity(p: RelationParams, kappa: float) -> tuple[float, float, float]:
    """(D_T, kappa, Delta) of equation (1) for either estimator's params (grid or kernel:
    the same relation fields), given the map's certified ``kappa``."""
    dt = sup_sensitivity(
        neighbour=p.neighbour,
        users=p.users,
        reward_range=p.reward_range,
        gamma=p.gamma,
        iterations=p.iterations,
    )
    return dt, kappa, dt * math.sqrt(p.actions * kappa) * (1.0 + DELTA_SLACK)


def accounted(
    p: RelationParams,
    *,
    who: str,
    kappa: float,
    beta: float,
    noise_sd: float,
    basis: str,
) -> FQIPrivacyResult:
    """The result of either estimator's params ``p`` (grid or kernel) with noise ``p.sigma``:
    epsilon at ``p.delta`` from Delta = D_T sqrt(m kappa) (equations 1-3). ``beta`` and
    ``noise_sd`` (the marginal noise sd at a state) are the estimator's; ``who`` names the
    accountant in the error for a missing sigma."""
    if p.sigma is None or p.sigma <= 0:
        raise InvalidArgument(f"{who} needs sigma > 0 (calibrating finds one)")
    dt, kappa, sens = joint_sensitivity(p, kappa)
    return FQIPrivacyResult(
        mode="fqi",
        neighbour=p.neighbour,
        epsilon=analytic_gaussian_epsilon(delta=p.delta, sensitivity=sens, sigma=p.sigma),
        delta=p.delta,
        delta_total=p.delta,
        holds=True,
        sigma=p.sigma,
        beta=beta,
        kappa=kappa,
        sup_sensitivity=dt,
        sensitivity=sens,
        noise_to_value=noise_sd / p.value_scale,
        basis=basis + ONE_KEY,
        reason=None,
        params=p,
    )


def account_fqi(p: FQIPrivacyParams) -> FQIPrivacyResult:
    """epsilon at ``p.delta`` for a grid release with noise ``p.sigma`` (equations 1-3):
    kept to re-account the cards and ledger events of releases the retired grid fit wrote."""
    return accounted(
        p,
        who="account_fqi",
        kappa=_kappa(p),
        beta=p.beta,
        noise_sd=p.sigma if p.sigma is not None else 0.0,
        basis=BASIS[p.neighbour].format(users=p.users),
    )


def calibrated(
    p: P, epsilon: float, sensitivity: float, account: Callable[[P], FQIPrivacyResult]
) -> FQIPrivacyResult:
    """The smallest sigma giving (epsilon, p.delta)-DP at this L2 ``sensitivity``, accounted
    by ``account`` (the grid or the kernel estimator's), with the target recorded."""
    eps = _num("epsilon", epsilon, lo=0.0)
    sigma = analytic_gaussian_sigma(epsilon=eps, delta=p.delta, sensitivity=sensitivity)
    r = account(p.replace(sigma=sigma))
    met = analytic_gaussian_delta(epsilon=eps, sensitivity=sensitivity, sigma=sigma) <= p.delta
    return replace(r, target={"epsilon": eps, "delta": p.delta, "met": bool(met)})
