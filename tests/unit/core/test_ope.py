"""The private off-policy estimate (qveil.ope): one user replaced adversarially (its states
moved to every corner, its rewards all high or all low, terminal or not) and by a brute force
over its start state moves the estimate by at most the accountant's Delta_J, and the search
does move it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from qveil.additive import StateBox
from qveil.kfqi import KernelFQISpec
from qveil.ope import policy_value
from qveil.privacy.ope import OPEPrivacyParams, ope_sensitivity
from qveil.transitions import Transitions


def _toy(n_users: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    per = 4
    u = np.repeat(np.arange(n_users), per)
    s = rng.uniform(0, 1, (len(u), 2))
    s2 = np.clip(s + rng.normal(0, 0.15, s.shape), 0, 1)
    return (
        u,
        s,
        rng.integers(0, 2, len(u)),
        rng.uniform(0, 1, len(u)),
        s2,
        rng.uniform(size=len(u)) < 0.1,
    )


def _policy(x: np.ndarray) -> np.ndarray:
    return (x[:, 0] > 0.5).astype(np.int64)  # a fixed public policy


SOBOL = {"anchors": "sobol", "anchor_count": 64, "neighbours": 6}


@pytest.mark.parametrize("anchors", [{"anchor_points": 5}, SOBOL])
def test_one_user_replaced_moves_the_estimate_by_at_most_delta_j(anchors: dict) -> None:
    """Adversarial replacements of user 0 (its first state moved to every corner, rewards
    all high or all low, terminal or not), and a brute force over its start state on a
    3 x 3 lattice: |J - J'| <= Delta_J = D_T + (q_hi - q_lo) / N, and the search does move J
    (on the grid by more than a tenth of the bound)."""
    n_users, gamma, t = 12, 0.6, 6
    u, s, a, r, s2, term = _toy(n_users, 3)
    spec = KernelFQISpec(gamma=gamma, iterations=t, betas=(1.0, 1.0), bandwidth=0.3, **anchors)
    kw = dict(policy=_policy, n_actions=2, reward_range=(0.0, 1.0),
              box=StateBox.of([[0.0, 1.0]] * 2), spec=spec)  # fmt: skip
    j, _ = policy_value(Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **kw)
    bound = ope_sensitivity(
        OPEPrivacyParams(
            users=n_users, reward_range=(0.0, 1.0), gamma=gamma, iterations=t, delta=1e-5
        )  # fmt: skip
    )
    mine = np.flatnonzero(u == 0)
    worst = 0.0
    lattice = list(itertools.product((0.0, 0.5, 1.0), repeat=2))
    for corner, rew, end, act in itertools.product(lattice, (0.0, 1.0), (False, True), (0, 1)):
        s_, r_, t_, a_, s2_ = s.copy(), r.copy(), term.copy(), a.copy(), s2.copy()
        s_[mine] = corner
        s2_[mine] = 1.0 - np.asarray(corner)
        r_[mine], t_[mine], a_[mine] = rew, end, act
        j2, _ = policy_value(Transitions(s=s_, a=a_, r=r_, s2=s2_, terminal=t_, user=u), **kw)
        worst = max(worst, abs(j - j2))
    assert worst <= bound * (1 + 1e-9), (worst, bound)
    assert worst > (0.1 if anchors is not SOBOL else 0.01) * bound, (worst, bound)
