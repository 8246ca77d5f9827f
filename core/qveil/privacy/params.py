"""The accountant's inputs and outputs: frozen, keyword-only, validated, JSON round-trippable.

Every field of :class:`PrivacyParams` is checked when the object is built; a bad value raises
:class:`qveil.errors.InvalidArgument` naming the field and repeating the value. The defaults a
user sees in the CLI are the paper's Appendix E.3 settings (:data:`E3_SETTINGS`, each with its
source in :data:`E3_SOURCES`); the dataclass itself has no defaults for the run's parameters,
so a caller cannot silently account for a run it did not describe.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypedDict

from qveil.errors import InvalidArgument
from qveil.json_types import JSONMapping, JSONObject
from qveil.privacy.checks import ONE_KEY as ONE_KEY
from qveil.privacy.checks import number as _num
from qveil.privacy.gaussian import analytic_gaussian_epsilon
from qveil.privacy.record import Record, construct, reject_unknown

__all__ = [
    "E3_SETTINGS",
    "E3_SOURCES",
    "E3Settings",
    "MODES",
    "PrivacyParams",
    "PrivacyResult",
    "one_gaussian",
]

MODES: tuple[str, ...] = ("paper", "gdp", "output")


class E3Settings(TypedDict):
    """The E.3 settings: PrivacyParams' fields of those names (``PrivacyParams(**s)``)."""

    delta: float
    samples: int
    batch_size: int
    lr: float
    k: float
    lipschitz: float
    resets: int
    actions: int
    gamma: float
    reward_bound: float
    reward_sensitivity: float


# The paper's Appendix E.3 settings (Wang & Hegde 2019), and where each value comes from.
E3_SETTINGS: E3Settings = {
    "delta": 1e-4,
    "samples": 5000,
    "batch_size": 64,
    "lr": 3e-4,
    "k": 23.0,
    "lipschitz": 4.0,
    "resets": 78,
    "actions": 2,
    "gamma": 0.9,
    "reward_bound": 0.5,
    "reward_sensitivity": 1.0,
}
E3_SOURCES: dict[str, str] = {
    "delta": "E.3: 'we target 1e-4-approximation'",
    "samples": "E.1/E.3: T = 5000 samples (100 episodes of 50 steps)",
    "batch_size": "E.3: B = 64",
    "lr": "E.3: alpha = 3e-4",
    "k": "E.3: 'k = 23 will be sufficient'",
    "lipschitz": "E.3: L^2 = 16, so L = 4",
    "resets": "E.3: 'we reset the noise on every iteration, J = floor(T/B)' = 78",
    "actions": "E.1: A = {0, 1}, m = 2",
    "gamma": "not stated in the paper; qveil's default discount 0.9",
    "reward_bound": "E.1: reward 0.5 - |s - 0.5| lies in [0, 0.5], so r0 = 0.5",
    "reward_sensitivity": "Theorem 5: neighbours have ||r - r'||_inf <= 1",
}


def _int(name: str, value: object, *, lo: int) -> int:
    if isinstance(value, bool):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        fv = float(value)
        if math.isfinite(fv) and fv.is_integer():
            value = int(fv)
    if not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    if value < lo:
        raise InvalidArgument(f"{name} must be >= {lo}, got {value!r}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class PrivacyParams(Record):
    """Everything the accountant needs about one release (keyword-only, validated).

    Symbols are the paper's (Wang & Hegde 2019, Theorem 5 and Algorithm 1). ``to_dict``
    writes notes as a list.
    """

    _AS_LISTS = ("notes",)

    mode: str
    """Accounting mode: "paper" (Theorem 5 as stated), "gdp" (exact mu-GDP composition of the
    paper's per-step sensitivity) or "output" (strict: one GP mechanism at release)."""
    sigma: float | None
    """Noise scale of the GP noise g ~ GP(0, sigma^2 K); None only as input to calibrate()."""
    delta: float
    """delta of the mechanism part of the guarantee (paper/gdp add Lemma 8's failure
    probability on top, reported as delta_total)."""
    samples: int
    """T: number of samples (environment steps) in training (Algorithm 1)."""
    batch_size: int
    """B: minibatch size; one SGD update per B samples (Algorithm 1, line 22)."""
    lr: float
    """alpha: SGD learning rate (plain SGD assumed by Theorem 5's sensitivity)."""
    k: float
    """k: the bound |g| <= k on the training noise used by Theorem 5 (Lemma 8); sets
    beta = B / (4 alpha (k + 1)) in paper/gdp modes."""
    lipschitz: float
    """L: Lipschitz constant of the Q-network in the UNIT state x in [0, 1]."""
    resets: int
    """J: number of independent training sample paths (Algorithm 1, lines 7-9)."""
    actions: int
    """m: number of actions (one released function per action)."""
    gamma: float
    """Discount factor in [0, 1); output mode clamps |Q| <= r0 / (1 - gamma)."""
    reward_bound: float
    """r0: |r(s, a)| <= r0 (output mode's clamp)."""
    reward_sensitivity: float = 1.0
    """Scale of neighbouring: rewards r, r' are neighbours when ||r - r'||_inf <= this.
    paper/gdp sensitivities are linear in it; output mode's bound holds for any pair."""
    steps: int | None = None
    """SGD updates actually taken; None -> ceil(T / B) (rounded up: conservative)."""
    plain_sgd: bool = True
    """False when the optimiser is not plain SGD with step alpha: paper/gdp then do not hold."""
    beta: float | None = None
    """Output mode only: the release kernel rate on [0, 1]; None -> the sensitivity-minimising
    beta* = L / M. paper/gdp derive beta from k and reject a given beta."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Free-form remarks recorded with the parameters (not used in any formula)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.sigma is not None:
            object.__setattr__(self, "sigma", _num("sigma", self.sigma, lo=0.0))
        object.__setattr__(self, "delta", _num("delta", self.delta, lo=0.0, hi=1.0))
        samples = _int("samples", self.samples, lo=1)
        batch = _int("batch_size", self.batch_size, lo=1)
        if batch > samples:
            raise InvalidArgument(
                f"batch_size must be <= samples (B <= T), got batch_size={batch!r} > "
                f"samples={samples!r}"
            )
        object.__setattr__(self, "samples", samples)
        object.__setattr__(self, "batch_size", batch)
        object.__setattr__(self, "lr", _num("lr", self.lr, lo=0.0))
        object.__setattr__(self, "k", _num("k", self.k, lo=0.0))
        object.__setattr__(self, "lipschitz", _num("lipschitz", self.lipschitz, lo=0.0))
        object.__setattr__(self, "resets", _int("resets", self.resets, lo=1))
        object.__setattr__(self, "actions", _int("actions", self.actions, lo=1))
        object.__setattr__(self, "gamma", _num("gamma", self.gamma, lo=0.0, lo_open=False, hi=1.0))
        object.__setattr__(self, "reward_bound", _num("reward_bound", self.reward_bound, lo=0.0))
        object.__setattr__(
            self, "reward_sensitivity", _num("reward_sensitivity", self.reward_sensitivity, lo=0.0)
        )
        if self.steps is not None:
            object.__setattr__(self, "steps", _int("steps", self.steps, lo=0))
        if not isinstance(self.plain_sgd, bool):
            raise InvalidArgument(f"plain_sgd must be true or false, got {self.plain_sgd!r}")
        if self.beta is not None:
            if self.mode != "output":
                raise InvalidArgument(
                    f"beta is derived from k in {self.mode} mode (beta = B / (4 alpha (k+1))); "
                    f"do not pass beta={self.beta!r}"
                )
            object.__setattr__(self, "beta", _num("beta", self.beta, lo=0.0))
        notes = self.notes
        if isinstance(notes, str) or not all(isinstance(n, str) for n in notes):
            raise InvalidArgument(f"notes must be a sequence of strings, got {notes!r}")
        object.__setattr__(self, "notes", tuple(notes))

    # ---- derived quantities -------------------------------------------------------------
    @property
    def updates(self) -> int:
        """SGD updates: ``steps`` if given, else ceil(T / B) (a partial last batch counts as
        an update: rounding up can only add privacy cost)."""
        if self.steps is not None:
            return self.steps
        return -(-self.samples // self.batch_size)

    @property
    def q_bound(self) -> float:
        """M = r0 / (1 - gamma): the clamp on served |Q| (output mode)."""
        return self.reward_bound / (1.0 - self.gamma)

    @classmethod
    def from_dict(cls, d: JSONMapping) -> PrivacyParams:
        """Inverse of :meth:`to_dict`; unknown keys are an error (a card from a newer
        version must not be silently mis-read)."""
        if not isinstance(d, Mapping):
            raise InvalidArgument(f"privacy params must be a mapping, got {type(d).__name__}")
        reject_unknown(cls, d, "privacy parameter(s)")
        kw = dict(d)
        if "notes" in kw and kw["notes"] is not None:
            notes = kw["notes"]
            if isinstance(notes, str):
                raise InvalidArgument(f"notes must be a list of strings, got {notes!r}")
            kw["notes"] = tuple(notes)
        return construct(cls, kw, "privacy params")


@dataclass(frozen=True, kw_only=True)
class PrivacyResult:
    """What the accountant concludes for one :class:`PrivacyParams`.

    ``holds`` is True only when the stated basis actually gives the guarantee; then
    ``epsilon`` and ``delta_total`` are the guarantee: the release is
    (epsilon, delta_total)-DP with respect to neighbouring reward functions. When ``holds``
    is False, ``epsilon`` and ``delta_total`` are None (no number is offered as a guarantee),
    ``reason`` says why, and ``epsilon_if_conditions_held`` keeps what the formula alone would
    give, for diagnosis only.
    """

    mode: str
    epsilon: float | None
    delta: float
    delta_total: float | None
    holds: bool
    sigma: float
    beta: float
    k: float | None
    basis: str
    reason: str | None
    params: PrivacyParams
    mu: float | None = None
    """GDP parameter of the whole release (gdp, output)."""
    sensitivity: float | None = None
    """RKHS sensitivity of one mechanism (per step in paper/gdp, joint over actions in output)."""
    mechanisms: int = 1
    """How many Gaussian(-process) mechanisms are composed (updates + 1 release in paper/gdp)."""
    delta_noise_bound: float | None = None
    """Lemma 8's failure probability over the J training paths (paper/gdp)."""
    lemma8_margin: float | None = None
    """paper: 2k - 8.68 sqrt(beta) sigma; gdp: k - 8.68 sqrt(beta) sigma (must be > 0)."""
    epsilon_if_conditions_held: float | None = None
    bound: float | None = None
    """output mode: the clamp M = r0 / (1 - gamma) the server must enforce on |Q|."""
    target: JSONObject | None = None
    """calibrate() only: {"epsilon", "delta", "met"}."""

    def to_dict(self) -> JSONObject:
        """JSON-ready (no NaN, no inf): the contract keys plus diagnostics."""
        d: JSONObject = {
            "mode": self.mode,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "delta_total": self.delta_total,
            "holds": self.holds,
            "sigma": self.sigma,
            "beta": self.beta,
            "k": self.k,
            "basis": self.basis,
            "reason": self.reason,
            "mu": self.mu,
            "sensitivity": self.sensitivity,
            "mechanisms": self.mechanisms,
            "updates": self.params.updates,
            "reward_sensitivity": self.params.reward_sensitivity,
            "delta_noise_bound": self.delta_noise_bound,
            "lemma8_margin": self.lemma8_margin,
            "epsilon_if_conditions_held": self.epsilon_if_conditions_held,
            "params": self.params.to_dict(),
        }
        if self.mode == "output":
            d["bound"] = self.bound
        if self.target is not None:
            d["target"] = dict(self.target)
        return d


class _Accounted(Protocol):
    """What :func:`one_gaussian` reads of a result's params (PrivacyParams or
    OPEPrivacyParams, kept as given)."""

    @property
    def delta(self) -> float: ...


# the dict is keyword arguments of either result dataclass (fields of several types)
def one_gaussian(p: _Accounted, *, sensitivity: float, sigma: float) -> JSONObject:
    """The result fields that every accountant of one Gaussian mechanism fills alike: noise
    ``sigma`` on a statistic of L2 (or RKHS) sensitivity ``sensitivity``, accounted for the
    params ``p`` at ``p.delta``. epsilon is the analytic Gaussian mechanism's (the mu-GDP
    curve at mu = sensitivity / sigma); the guarantee holds, and with no other term its total
    delta is the mechanism's."""
    return {
        "epsilon": analytic_gaussian_epsilon(delta=p.delta, sensitivity=sensitivity, sigma=sigma),
        "delta": p.delta,
        "delta_total": p.delta,
        "holds": True,
        "sigma": sigma,
        "reason": None,
        "params": p,
    }
