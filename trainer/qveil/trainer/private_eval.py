"""The private off-policy evaluation of a release (``qveil evaluate --private DIR``).

What the released greedy policy is worth, estimated with differential privacy from held-out
users' data, for a team without a simulator of its users:

1. the policy is the release's greedy policy, computed in process from its bundle exactly
   as the server answers it (:func:`qveil.answer.released_values`: the same bits; post-
   processing of the release, no privacy cost), for any number of held-out users. No
   held-out state is ever sent to a served release, so no store logs it (a store that kept
   held-out users' states would tell who they are);
2. the estimate is :func:`qveil.ope.policy_value` (fitted-Q evaluation with the fqi mode's
   per-user averager, clipped per user) on the held-out data, with the config's public
   estimator parameters;
3. one Gaussian mechanism on the scalar, at the (epsilon, delta) asked for, with the
   sensitivity of :mod:`qveil.privacy.ope` (Delta_J = D_T + (q_hi - q_lo) / N), noise from
   OS entropy;
4. the evaluation is charged to the population's budget in the registry's ledger (refused
   before any data is read when the filter would not let it through) and recorded, with its
   interval, in the registry's audit log under the release id, where the admin card shows it.

The estimate is on the scale of a **discounted value** (gamma the config's): the expected
sum of gamma^t r_t from a held-out user's first state under the served greedy policy, the mean
over users, not an episode's undiscounted return. The interval is the mechanism's: estimate
+- z sigma (95%: z = 1.96) covers the non-private estimate J exactly; it does **not** cover
how far J is from the policy's true value (FQE's bias on one random-policy episode per user,
measured in docs/results.md, not bounded); the report says both (:data:`SCALE`,
:data:`NOT_COVERED`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

import numpy as np

from qveil.additive import StateBox
from qveil.answer import released_values
from qveil.bundle import Bundle
from qveil.dataset import Dataset
from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject
from qveil.kfqi_config import KernelFQIConfig
from qveil.kfqi_spec import KernelFQISpec
from qveil.ope import policy_value
from qveil.privacy.ledger import PrivacyEvent
from qveil.privacy.ope import OPEPrivacyParams, calibrate_ope
from qveil.release_records import ReleaseRecords
from qveil.rng import OSEntropy
from qveil.trainer.kfqi import state_intervals
from qveil.training_data import TrainingData

__all__ = [
    "NOT_COVERED",
    "SCALE",
    "Z95",
    "estimator_of",
    "private_evaluation",
]

#: The two-sided 95% normal quantile.
Z95 = 1.959963984540054

#: What the estimate measures (``{gamma}``: the config's discount).
SCALE = (
    "discounted value (gamma {gamma}): the expected sum of gamma^t r_t from a held-out "
    "user's first state under the served greedy policy, mean over users; not the episode "
    "return"
)
#: What the 95% interval does not cover.
NOT_COVERED = (
    "the bias of the fitted-Q evaluation against the policy's true value: measured, not "
    "bounded, and it can be larger than the interval (docs/results.md section 10: 10% low on "
    "CartPole)"
)


class NormalSource(Protocol):
    """A source of standard normal draws (:class:`qveil.rng.OSEntropy` by default)."""

    def standard_normal(self) -> float: ...


def estimator_of(
    cfg: object, dataset: TrainingData
) -> tuple[KernelFQISpec, StateBox, str, tuple[float, float]]:
    """(spec, box, env_id, reward range) of the evaluation for an fqi config (any d; a 1-D
    ``grid`` config is the kernel config with d = 1): its averager, user relation."""

    if not isinstance(cfg, KernelFQIConfig):
        raise InvalidArgument("the private evaluation takes an fqi config")
    env_id = str(getattr(cfg, "env_id", None) or getattr(dataset, "env_id", None) or "")
    lo, hi = getattr(cfg, "reward_range", None) or dataset.reward_range
    rr = (float(lo), float(hi))
    dims = int(dataset.d)
    spec: KernelFQISpec = cfg.replace(neighbour="user").spec(dims)
    return spec, StateBox.of(state_intervals(cfg, env_id or None, dims)), env_id, rr


def private_evaluation(
    *,
    bundle: Bundle,
    dataset: Dataset,
    config: object,
    epsilon: float,
    delta: float,
    population: str,
    records: ReleaseRecords,
    noise: NormalSource | None = None,
) -> JSONObject:
    """Run steps 1-4 of the module docstring; returns the report (estimate, interval,
    privacy, population spending). ``bundle``: the loaded release (its model and key: the
    policy is computed here, never asked of a server). ``records``: the registry's
    population ledger and audit log. ``noise``: a normal source (default OS entropy)."""

    spec, box, env_id, rr = estimator_of(config, dataset)
    result = calibrate_ope(
        OPEPrivacyParams(
            users=int(dataset.users),
            reward_range=rr,
            gamma=spec.gamma,
            iterations=spec.iterations,
            delta=float(delta),
        ),
        epsilon=float(epsilon),
    )
    rid = str(bundle.bundle_id)
    stamp = datetime.now(UTC).isoformat()
    event = PrivacyEvent.from_result(
        result, dataset_id=population, bundle_id=f"evaluation:{rid}:{stamp}", created_at=stamp
    )
    records.precheck(population, event)  # before any data is used
    j = _policy_value(bundle, dataset, box=box, reward_range=rr, spec=spec)
    src = noise if noise is not None else OSEntropy()
    estimate = float(j + result.sigma * float(src.standard_normal()))
    half = Z95 * result.sigma
    report = {
        "release_id": rid,
        "env_id": env_id,
        "population": population,
        "users": int(dataset.users),
        "estimate": estimate,
        "interval95": [estimate - half, estimate + half],
        "scale": SCALE.format(gamma=f"{spec.gamma:g}"),
        "gamma": spec.gamma,
        "interval_covers": "the non-private estimate (the mechanism's noise only)",
        "interval_does_not_cover": NOT_COVERED,
        "epsilon": result.epsilon,
        "delta": result.delta_total,
        "sigma": result.sigma,
        "sensitivity": result.sensitivity,
        "basis": result.basis,
        "seeded": noise is not None,
        "at": stamp,
    }
    records.record_evaluation(
        population,
        event,
        target=rid,
        params={
            k: report[k]
            for k in ("estimate", "interval95", "epsilon", "delta", "users", "gamma", "scale")
        },
    )
    report["population_budget"] = records.population_report(population)
    return report


def _policy_value(
    bundle: Bundle,
    dataset: Dataset,
    *,
    box: StateBox,
    reward_range: tuple[float, float],
    spec: KernelFQISpec,
) -> float:
    """The non-private estimate J of the release's greedy policy (its released values,
    computed in process) on ``dataset`` (step 2 of the module docstring)."""
    lo = np.array([iv.lo for iv in box.intervals])
    hi = np.array([iv.hi for iv in box.intervals])
    rbox = bundle.box

    def policy(unit: np.ndarray) -> np.ndarray:
        states = lo + unit.reshape(len(unit), -1) * (hi - lo)  # [n, d], d >= 1
        values = released_values(bundle, rbox.to_unit(states, clip=True))
        best: np.ndarray = np.argmax(values, axis=1).astype(np.int64)  # ties: the lowest
        return best

    j, _per_user = policy_value(
        dataset.transitions,
        policy=policy,
        n_actions=int(dataset.n_actions),
        reward_range=reward_range,
        box=box,
        spec=spec,
    )
    return float(j)
