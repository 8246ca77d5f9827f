"""The fqi mode's privacy bounds, three ways (docs/privacy.md has the proofs):

* kappa: every certified bound is >= the brute-force maximum over all 2^K vertices of the
  sup-norm ball (a convex quadratic peaks at a vertex), for grids of K <= 14 points;
* D_T: random and adversarial neighbouring datasets never move Q_T by more than D_T, and for
  the reward relation a constant reward shift reaches D_T to 1e-9 (the bound is tight);
* end to end: the RKHS distance of two neighbouring releases' mean functions (the
  piecewise-linear formula, checked against dense Gram matrices) is <= Delta.
"""

from __future__ import annotations

import numpy as np
import pytest

from qveil.fqi import FQISpec, fitted_q
from qveil.noise import StateInterval
from qveil.privacy.fqi import FQIPrivacyParams, account_fqi, sup_sensitivity
from qveil.privacy.rkhs import gram_norm_sq
from qveil.release_map import (
    brute_force_kappa,
    kappa_certificate,
    krr_quadratic_form,
    pl_gram,
    pl_rkhs_norm_sq,
    release_quadratic_form,
    smoother,
)

UNIT = StateInterval(0.0, 1.0)


@pytest.mark.parametrize("k", [3, 5, 8, 11, 14])
@pytest.mark.parametrize("bandwidth", [0.0, 0.05, 0.2])
@pytest.mark.parametrize("beta", [0.3, 3.0, 30.0, 300.0])
def test_kappa_certificate_bounds_the_vertex_maximum(k: int, bandwidth: float, beta: float) -> None:
    """Brute force over all 2^K vertices. A wrong certificate (e.g. trace(A), or the largest
    eigenvalue times K without the off-diagonal mass) falls below the maximum for some of
    these cases (checked: trace(A) < max at K = 14, b = 0.2, beta = 3)."""
    a = release_quadratic_form(k, bandwidth, beta)
    exact = brute_force_kappa(a)
    cert = kappa_certificate(a)
    assert cert.kappa >= exact
    assert cert.kappa <= cert.row_sum * (1 + 1e-9)  # the SDP read-off never does worse
    assert cert.min_eig >= -1e-9 * cert.kappa


def test_a_too_small_kappa_is_caught_by_brute_force() -> None:
    """The check has teeth: trace(A) (the value at v = e_i summed) is below the vertex max."""
    a = release_quadratic_form(14, 0.2, 3.0)
    assert float(np.trace(a)) < brute_force_kappa(a)


@pytest.mark.parametrize("beta", [0.5, 5.0, 50.0])
def test_pl_gram_is_the_rkhs_norm(beta: float) -> None:
    """u^T G u equals the squared RKHS norm of the piecewise-linear function, computed
    independently as the minimum-norm interpolant on a dense grid (Gram matrix / OU
    innovations), to 1e-5 relative."""
    rng = np.random.default_rng(3)
    u = rng.normal(size=21)
    xs = np.linspace(0, 1, 20001)
    dense = gram_norm_sq(xs, np.interp(xs, np.linspace(0, 1, 21), u), beta=beta)
    assert pl_rkhs_norm_sq(u, beta) == pytest.approx(dense, rel=1e-5)
    assert np.allclose(pl_gram(21, beta), pl_gram(21, beta).T)


def _walk_dataset(users: int, seed: int, steps: int = 20) -> dict[str, np.ndarray]:
    """LineWalk-like episodes (uniform random actions), generated directly: fast and exact."""
    rng = np.random.default_rng(seed)
    n = users * steps
    s = rng.uniform(0, 1, n)
    a = rng.integers(0, 2, n)
    s2 = np.clip(s + np.where(a == 1, 1, -1) * rng.uniform(0, 0.25, n), 0, 1)
    return {
        "states": s,
        "actions": a,
        "rewards": 0.5 - np.abs(s2 - 0.5),
        "next_states": s2,
        "terminal": rng.uniform(size=n) < 0.05,
        "users": np.repeat(np.arange(users), steps),
    }


def _fit(d: dict[str, np.ndarray], spec: FQISpec) -> np.ndarray:
    return fitted_q(**d, n_actions=2, reward_range=(0.0, 0.5), interval=UNIT, spec=spec)


def _replace_user(d: dict[str, np.ndarray], user: int, how: str, rng: np.random.Generator):
    """A neighbour: user ``user``'s whole data replaced (``how`` picks an adversary)."""
    e = {k: v.copy() for k, v in d.items()}
    m = e["users"] == user
    n = int(m.sum())
    if how == "random":
        e["states"][m] = rng.uniform(0, 1, n)
        e["next_states"][m] = rng.uniform(0, 1, n)
        e["rewards"][m] = rng.uniform(0, 0.5, n)
        e["actions"][m] = rng.integers(0, 2, n)
        e["terminal"][m] = rng.uniform(size=n) < 0.5
    elif how == "max-reward-one-state":  # all mass at one state, extreme rewards
        e["states"][m] = 0.5
        e["next_states"][m] = 0.5
        e["rewards"][m] = 0.5 - e["rewards"][m].clip(0.0, 0.5)
        e["actions"][m] = 0
        e["terminal"][m] = False
    elif how == "zero-rewards-spread":  # rewards flipped to the far end, states spread
        e["states"][m] = np.linspace(0, 1, n)
        e["next_states"][m] = np.linspace(1, 0, n)
        e["rewards"][m] = 0.0
        e["terminal"][m] = True
    else:
        raise AssertionError(how)
    return e


@pytest.mark.parametrize("gamma", [0.0, 0.3, 0.9])
@pytest.mark.parametrize("how", ["random", "max-reward-one-state", "zero-rewards-spread"])
def test_user_relation_never_exceeds_d_t(gamma: float, how: str) -> None:
    """max |Q_T - Q_T'| <= D_T = r0 (1 - gamma^T) / (N (1 - gamma)^2) for every replaced
    user. Pooled weights (the reward relation's estimator) do NOT obey this bound under user
    replacement: one user can own every sample near a grid point (checked below)."""
    users, t = 30, 8
    d = _walk_dataset(users, seed=1)
    spec = FQISpec(gamma=gamma, iterations=t, grid_points=41, bandwidth=0.05, neighbour="user")
    q = _fit(d, spec)
    bound = sup_sensitivity(
        neighbour="user", users=users, reward_range=(0, 0.5), gamma=gamma, iterations=t
    )
    rng = np.random.default_rng(7)
    worst = 0.0
    for u in range(0, users, 3):
        q2 = _fit(_replace_user(d, u, how, rng), spec)
        worst = max(worst, float(np.abs(q - q2).max()))
    print(f"user relation, gamma {gamma}, {how}: worst {worst / bound:.3f} D_T")
    assert worst <= bound * (1 + 1e-9), (worst, bound)
    assert worst > 0.05 * bound  # the adversaries do move Q (the test is not vacuous)


def test_pooled_estimator_breaks_the_user_bound() -> None:
    """Why the user relation needs per-user averaging: with pooled NW weights, a user whose
    samples are the only ones near a grid point moves Q there by up to r0/(1-gamma), far more
    than the user-level D_T (what a wrong implementation would score)."""
    users, t, gamma = 30, 8, 0.3
    d = _walk_dataset(users, seed=1)
    d["states"] = np.clip(d["states"], 0.2, 1.0)  # nobody near x = 0 ...
    e = {k: v.copy() for k, v in d.items()}
    m = e["users"] == 0
    e["states"][m] = 0.0  # ... except user 0 after replacement
    e["rewards"][m] = 0.5
    pooled = FQISpec(gamma=gamma, iterations=t, grid_points=41, neighbour="reward")
    moved = float(np.abs(_fit(d, pooled) - _fit(e, pooled)).max())
    bound = sup_sensitivity(
        neighbour="user", users=users, reward_range=(0, 0.5), gamma=gamma, iterations=t
    )
    assert moved > 5 * bound


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9])
def test_reward_relation_bound_is_tight_for_a_constant_shift(gamma: float) -> None:
    """Reward relation: every sample's reward moves by at most (hi - lo) / N. Random moves
    stay under D_T; a constant shift of every reward by (hi - lo)/N (no terminals, no
    clipping) moves Q_T by exactly D_T = (hi - lo)(1 - gamma^T) / (N (1 - gamma)), to 1e-9."""
    users, t = 25, 10
    d = _walk_dataset(users, seed=4)
    d["terminal"][:] = False
    d["rewards"] = 0.1 + 0.2 * d["rewards"]  # in [0.1, 0.2]: room for the shift
    spec = FQISpec(gamma=gamma, iterations=t, grid_points=41, neighbour="reward")
    bound = sup_sensitivity(
        neighbour="reward", users=users, reward_range=(0, 0.5), gamma=gamma, iterations=t
    )
    q = _fit(d, spec)
    shifted = dict(d, rewards=d["rewards"] + 0.5 / users)
    assert float(np.abs(_fit(shifted, spec) - q).max()) == pytest.approx(bound, rel=1e-9)
    rng = np.random.default_rng(0)
    for _ in range(5):
        moved = dict(d, rewards=d["rewards"] + rng.uniform(-1, 1, len(d["rewards"])) * 0.5 / users)
        assert float(np.abs(_fit(moved, spec) - q).max()) <= bound * (1 + 1e-9)


@pytest.mark.parametrize("neighbour", ["user", "reward"])
def test_rkhs_distance_of_neighbouring_releases_is_within_delta(neighbour: str) -> None:
    """End to end: the released mean functions of two neighbouring datasets (L applied to
    Q_T, two actions) differ in joint RKHS norm sqrt(sum_a ||L(Q_a - Q'_a)||_H^2) <= Delta,
    the sensitivity the card's sigma is calibrated to."""
    users, t, k, sb, beta = 20, 6, 41, 0.1, 6.0
    d = _walk_dataset(users, seed=9)
    spec = FQISpec(gamma=0.5, iterations=t, grid_points=k, neighbour=neighbour)
    p = FQIPrivacyParams(
        neighbour=neighbour,
        users=users,
        reward_range=(0.0, 0.5),
        gamma=0.5,
        iterations=t,
        actions=2,
        grid_points=k,
        smoother_bandwidth=sb,
        beta=beta,
        delta=1e-5,
        sigma=1.0,
    )
    delta = account_fqi(p).sensitivity
    s = smoother(k, sb)
    q = _fit(d, spec)
    rng = np.random.default_rng(2)
    worst = 0.0
    for u in range(users):
        if neighbour == "user":
            e = _replace_user(d, u, ["random", "max-reward-one-state"][u % 2], rng)
        else:  # one user's reward function: every reward moves by up to r0 / N
            e = dict(d, rewards=np.clip(d["rewards"] + rng.choice([-1, 1]) * 0.5 / users, 0, 0.5))
        diff = s @ (q - _fit(e, spec))
        xs = np.linspace(0, 1, 4001)
        dist = sum(
            gram_norm_sq(xs, np.interp(xs, np.linspace(0, 1, k), diff[:, a]), beta=beta)
            for a in range(2)
        )
        worst = max(worst, float(np.sqrt(dist)))
    print(f"{neighbour}: worst RKHS distance {worst / delta:.3f} Delta")
    assert worst <= delta
    assert worst > 0.01 * delta


@pytest.mark.parametrize("n,p", [(6, 3), (10, 5), (14, 14), (12, 4)])
@pytest.mark.parametrize("beta", [0.5, 5.0, 50.0])
@pytest.mark.parametrize("lam", [1e-3, 0.1, 1.0])
def test_krr_map_kappa_is_one_over_four_lambda(n: int, p: int, beta: float, lam: float) -> None:
    """KRR restricted to any subspace (inducing points z): the brute-force maximum of
    ||L v||_H^2 over all 2^n vertices of the sup-norm ball is <= 1 / (4 lambda). A map
    without the ridge term's 1/4 (kappa = 1/lambda would be safe but 4x loose; 1/(8 lambda)
    is violated: checked below for the full subspace)."""
    rng = np.random.default_rng(n * 100 + p)
    x = np.sort(rng.uniform(0, 1, n))
    z = np.linspace(0, 1, p) if p < n else x
    a = krr_quadratic_form(x, z, beta=beta, lam=lam)
    assert brute_force_kappa(a) <= 1.0 / (4.0 * lam) * (1 + 1e-9)


def test_krr_bound_is_nearly_reached() -> None:
    """With the full subspace (z = x) the bound 1/(4 lambda) is approached (0.99 of it at
    beta = 100, lambda = 0.1; 0.98 at beta = 1, lambda = 0.01): a claimed 1/(8 lambda) would
    be wrong."""
    x = np.linspace(0, 1, 12)
    for beta, lam in ((100.0, 0.1), (1.0, 0.01)):
        a = krr_quadratic_form(x, x, beta=beta, lam=lam)
        assert brute_force_kappa(a) > 0.95 / (4.0 * lam)
