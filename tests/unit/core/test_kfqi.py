"""The d-coordinate estimator (qveil.kfqi) and its accountant (qveil.privacy.kfqi).

* kappa = 1 / (4 lam) for the subspace KRR onto the additive RKHS: brute force over every
  vertex of the sup-norm ball (the maximum of a convex quadratic) on small problems, for
  d = 1, 2, 3 and several lam, beta_j and inducing grids; the bound must hold and be nearly
  reached (a wrong bound, e.g. 1 / (4 d lam) or 1 / (4 lam K), is exceeded).
* The averaging operators are averagers: rows of [P | reward weights | default weight] are
  convex, so Q_T stays in the public range, and one user replaced moves Q_T by at most D_T
  (the accountant's formula), measured on adversarial replacements.
  The pooled averager breaks the user-level bound (why the user relation averages per user).
* The accountant's empirical audit: 2000 seeded d = 1 releases per neighbour (a tenth of
  the sigma is caught); its formulas alone: test_privacy_kfqi.py.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from qveil.additive import StateBox
from qveil.errors import InvalidArgument
from qveil.kfqi import (
    Anchors,
    KernelFQISpec,
    additive_mean,
    anchor_grid,
    averaging_operators_nd,
    build_operators_nd,
    episode_votes,
    fitted_q_nd,
    iterate_q_nd,
    kernel_fqi,
    krr_operator,
    krr_quadratic_form_nd,
    krr_result,
    multilinear_weights,
)
from qveil.kfqi_anchors import visitation_points
from qveil.privacy.fqi import sup_sensitivity
from qveil.privacy.kfqi import KernelFQIPrivacyParams, calibrate_kernel_fqi
from qveil.release_map import brute_force_kappa
from qveil.transitions import Transitions


@pytest.mark.parametrize(
    ("d", "g", "m", "lam", "betas"),
    [
        (1, 12, 5, 0.05, (3.0,)),
        (2, 3, 4, 0.01, (1.0, 6.0)),
        (2, 4, 3, 0.1, (2.0, 2.0)),
        (2, 4, 6, 0.002, (0.5, 20.0)),
        (3, 2, 3, 0.02, (2.0, 5.0, 9.0)),
    ],
)
def test_subspace_krr_kappa_bound_by_brute_force(
    d: int, g: int, m: int, lam: float, betas: tuple[float, ...]
) -> None:
    """max over all 2^K vertices of N(L v)^2 <= 1 / (4 lam), and the ratio is reported: a
    bound that ignored the subspace's shape or divided by d or K would be exceeded."""
    fit = anchor_grid(g, d)
    a = krr_quadratic_form_nd(fit, betas=betas, inducing_points=m, lam=lam)
    worst = brute_force_kappa(a)
    bound = 1.0 / (4.0 * lam)
    assert worst <= bound * (1 + 1e-9), (worst, bound)
    assert worst > bound / (4 * d * len(fit)), (worst, bound)  # not vacuous


def test_subspace_krr_bound_is_nearly_reached() -> None:
    """With small lam and a rich subspace the brute-force maximum comes close to
    1 / (4 lam) (the bound is tight, not just valid): ratio > 0.5 here."""
    fit = anchor_grid(4, 2)
    lam = 0.5
    a = krr_quadratic_form_nd(fit, betas=(0.3, 0.3), inducing_points=4, lam=lam)
    ratio = brute_force_kappa(a) * 4 * lam
    assert 0.5 < ratio <= 1.0 + 1e-9, ratio


def test_additive_rkhs_norm_dominates() -> None:
    """N(f)^2 = sum_j alpha_j^T K_j alpha_j >= ||f||_H^2 for the additive kernel: the H norm
    of f = sum_j f_j is the minimum over decompositions; we check N(f)^2 >= the RKHS norm
    computed from the representer alpha on the joint kernel when every block of f lies in
    one coordinate, i.e. f^T K^-1 f at many points (a lower bound of ||f||_H^2)."""
    rng = np.random.default_rng(3)
    betas = (2.0, 5.0)
    u = np.linspace(0, 1, 5)
    alpha = rng.normal(size=(2, 5))
    pts = rng.uniform(size=(40, 2))
    f = additive_mean(pts, alpha=alpha[None], centre=0.0, inducing=u, betas=betas)[:, 0]
    kmat = sum(np.exp(-b * np.abs(pts[:, j, None] - pts[None, :, j])) for j, b in enumerate(betas))
    lower = float(f @ np.linalg.solve(kmat + 1e-10 * np.eye(40), f))
    n2 = sum(
        float(alpha[j] @ np.exp(-b * np.abs(u[:, None] - u[None, :])) @ alpha[j])
        for j, b in enumerate(betas)
    )
    assert lower <= n2 * (1 + 1e-6), (lower, n2)


def _toy(n_users: int, d: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    per = 6
    u = np.repeat(np.arange(n_users), per)
    s = rng.uniform(0, 1, (len(u), d))
    s2 = np.clip(s + rng.normal(0, 0.1, s.shape), 0, 1)
    a = rng.integers(0, 2, len(u))
    r = rng.uniform(0, 1, len(u))
    term = rng.uniform(size=len(u)) < 0.1
    return u, s, a, r, s2, term


#: The anchor layouts: the G^d grid, K Sobol points reached by k nearest anchors, and K
#: given public points (``file``: where simulated public states go, :func:`_layout`).
LAYOUTS = {
    "grid": {"anchor_points": 5},
    "sobol": {"anchors": "sobol", "anchor_count": 64, "neighbours": 6},
    "file": {"anchors": "file", "neighbours": 6},
}


def _public_anchors(d: int) -> np.ndarray:
    """48 visitation anchors in d coordinates: k-means of 3000 states of a public draw
    (seed 2026, concentrated like random-policy visitation), fixed before and independent
    of every dataset a test builds."""
    states = np.random.default_rng(2026).beta(2.0, 3.0, (3000, d))
    return visitation_points(states, 48, seed=3)


def _layout(name: str, d: int) -> dict[str, object]:
    """The spec keywords of layout ``name`` in d coordinates."""
    kw: dict[str, object] = dict(LAYOUTS[name])
    if name == "file":
        kw["anchor_set"] = _public_anchors(d)
    return kw


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_operators_are_averagers(layout: str) -> None:
    u, s, a, r, s2, term = _toy(40, 2, 1)
    for neighbour in ("user", "reward"):
        spec = KernelFQISpec(
            gamma=0.8,
            iterations=5,
            betas=(2.0, 2.0),
            bandwidth=0.15,
            neighbour=neighbour,
            **_layout(layout, 2),  # type: ignore[arg-type]
        )
        m = a == 0
        ones = np.ones(m.sum())
        rows = Transitions(
            user=u[m], s=s[m], a=a[m], r=ones, s2=s2[m], terminal=np.zeros(m.sum(), bool)
        )
        c1, p = averaging_operators_nd(rows, users=40, spec=spec, default=1.0)
        # with every reward 1, default 1 and no terminal: c = 1, and P rows sum to 1 or 0
        # plus the default share; c + P 1 - (P 1) must equal 1 for convex rows
        assert np.allclose(c1, 1.0)
        rows = np.asarray(p.sum(axis=1)).ravel()
        assert (rows >= -1e-12).all() and (rows <= 1 + 1e-12).all()
        assert (p.toarray() >= 0).all()
    w_idx, w = multilinear_weights(np.random.default_rng(0).uniform(size=(50, 3)), 4)
    assert np.allclose(w.sum(axis=1), 1.0) and (w >= 0).all() and w_idx.max() < 64


def _prior(kind: str, spec: KernelFQISpec, seed: int) -> np.ndarray | None:
    """The uncovered users' votes: None (the spec's constant default), or a public (K, 2)
    table in the Q range [0, 1 / (1 - gamma)] of rewards in [0, 1]: half of it at the ends
    of the range (the farthest a covered vote can be from it), half uniform."""
    if kind == "constant":
        return None
    rng = np.random.default_rng(seed)
    qhi = 1.0 / (1.0 - spec.gamma)
    shape = (spec.anchor_total, 2)
    ends = rng.integers(0, 2, shape) * qhi
    return np.where(rng.uniform(size=shape) < 0.5, ends, rng.uniform(0.0, qhi, shape))


#: The vote of a user who does not reach an anchor: the constant default, or a public prior.
PRIORS = ("constant", "table")


@pytest.mark.parametrize("prior", PRIORS)
@pytest.mark.parametrize("d", [1, 2])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("neighbour", ["user", "reward"])
def test_one_user_replaced_moves_q_by_at_most_d_t(
    neighbour: str, layout: str, d: int, prior: str
) -> None:
    """Adversarial replacements of user 0 (all rewards hi or lo, states piled on one anchor,
    every sample terminal or none): sup |Q_T - Q_T'| <= D_T of the accountant, for d = 1 (the
    1-D releases) and d = 2, with the constant default or a public prior table as the vote
    of users who do not reach an anchor (docs/privacy.md 2.6: D_T is the same). Reward
    relation: one user's reward function replaced moves every reward by <= (hi - lo) / N (a
    constant shift, which makes the bound tight)."""
    n_users, gamma, t = 30, 0.7, 8
    u, s, a, r, s2, term = _toy(n_users, d, 2)
    box = StateBox.of([[0.0, 1.0]] * d)
    spec = KernelFQISpec(
        gamma=gamma,
        iterations=t,
        betas=(2.0,) * d,
        bandwidth=0.2,
        neighbour=neighbour,
        **_layout(layout, d),  # type: ignore[arg-type]
    )
    kw = dict(
        n_actions=2, reward_range=(0.0, 1.0), box=box, spec=spec, prior=_prior(prior, spec, d)
    )
    q = fitted_q_nd(Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **kw)
    dt = sup_sensitivity(
        neighbour=neighbour, users=n_users, reward_range=(0.0, 1.0), gamma=gamma, iterations=t
    )
    worst = 0.0
    mine = u == 0
    for k in range(6):
        s_, a_, r_, s2_, term_ = s.copy(), a.copy(), r.copy(), s2.copy(), term.copy()
        if neighbour == "reward":  # one user's reward function: every reward moves <= 1/N
            r_ = np.clip(r + (1.0 if k % 2 else -1.0) / n_users, 0.0, 1.0)
        else:
            r_[mine] = float(k % 2)
        if neighbour == "user":
            s_[mine] = 0.5 if k < 3 else 0.0
            s2_[mine] = 1.0 if k % 3 else 0.5
            a_[mine] = k % 2
            term_[mine] = k >= 3
        q2 = fitted_q_nd(Transitions(s=s_, a=a_, r=r_, s2=s2_, terminal=term_, user=u), **kw)
        worst = max(worst, float(np.abs(q - q2).max()))
    assert worst <= dt * (1 + 1e-9), (worst, dt)
    assert worst > 0.05 * dt, (worst, dt)  # the bound is not vacuous here


def test_pooled_averager_breaks_the_user_bound() -> None:
    """Why the user relation needs per-user averaging (d = 1, the 1-D releases): with pooled
    NW weights (the reward relation's averager), a user whose samples are the only ones near
    an anchor moves Q there by far more than the user-level D_T; the per-user averager stays
    within it on the same replacement (what a wrong implementation would score)."""
    n_users, gamma, t = 30, 0.3, 8
    u, s, a, r, s2, term = _toy(n_users, 1, 1)
    s, s2 = np.clip(s, 0.3, 1.0), np.clip(s2, 0.3, 1.0)  # nobody near x = 0 ...
    s_, r_, s2_ = s.copy(), r.copy(), s2.copy()
    mine = u == 0
    s_[mine], s2_[mine], r_[mine] = 0.0, 0.0, 1.0  # ... except user 0 after replacement
    box = StateBox.of([[0.0, 1.0]])
    bound = sup_sensitivity(
        neighbour="user", users=n_users, reward_range=(0.0, 1.0), gamma=gamma, iterations=t
    )
    moved = {}
    for neighbour in ("reward", "user"):
        spec = KernelFQISpec(
            gamma=gamma, iterations=t, betas=(2.0,), bandwidth=0.05, neighbour=neighbour,
            anchor_points=41,
        )  # fmt: skip
        kw = dict(n_actions=2, reward_range=(0.0, 1.0), box=box, spec=spec)
        q = fitted_q_nd(Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **kw)
        q2 = fitted_q_nd(Transitions(s=s_, a=a, r=r_, s2=s2_, terminal=term, user=u), **kw)
        moved[neighbour] = float(np.abs(q - q2).max())
    assert moved["reward"] > 5 * bound, (moved, bound)
    assert moved["user"] <= bound * (1 + 1e-9), (moved, bound)


def test_kernel_fqi_fits_and_stays_in_range() -> None:
    u, s, a, r, s2, term = _toy(60, 3, 4)
    box = StateBox.of([[0.0, 1.0]] * 3)
    spec = KernelFQISpec(gamma=0.5, iterations=6, betas=(2.0, 2.0, 2.0), anchor_points=4)
    res = kernel_fqi(
        Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u),
        n_actions=2,
        reward_range=(0, 1),
        box=box,
        spec=spec,
    )
    assert res.q_anchors.shape == (64, 2) and res.alpha.shape == (2, 3, spec.inducing_points)
    assert res.q_anchors.min() >= 0.0 and res.q_anchors.max() <= 2.0
    f = additive_mean(
        anchor_grid(4, 3),
        alpha=res.alpha,
        centre=res.centre,
        inducing=res.inducing,
        betas=res.betas,
    )
    assert np.isfinite(f).all() and f.shape == (64, 2)
    # L is linear around the public centre: a constant target gives alpha = 0
    coef = krr_operator(anchor_grid(4, 3), betas=spec.betas, inducing_points=5, lam=0.1)
    assert coef.shape == (15, 64)


def test_pessimistic_default_keeps_d_t() -> None:
    """The bound holds for a default at the end of the range too."""
    d, n_users, gamma, t = 2, 30, 0.7, 8
    u, s, a, r, s2, term = _toy(n_users, d, 5)
    box = StateBox.of([[0.0, 1.0]] * d)
    spec = KernelFQISpec(
        gamma=gamma, iterations=t, betas=(2.0,) * d, anchor_points=5, bandwidth=0.2, default=0.0
    )
    kw = dict(n_actions=2, reward_range=(0.0, 1.0), box=box, spec=spec)
    q = fitted_q_nd(Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **kw)
    s_, a_, r_ = s.copy(), a.copy(), r.copy()
    s_[u == 0], a_[u == 0], r_[u == 0] = 0.5, 0, 1.0
    q2 = fitted_q_nd(Transitions(s=s_, a=a_, r=r_, s2=s2, terminal=term, user=u), **kw)
    dt = sup_sensitivity(
        neighbour="user", users=n_users, reward_range=(0.0, 1.0), gamma=gamma, iterations=t
    )
    assert float(np.abs(q - q2).max()) <= dt * (1 + 1e-9)


def test_operators_built_once_iterate_any_gamma_and_default_bit_for_bit() -> None:
    """build_operators_nd + iterate_q_nd (the lever sweep's path: operators built once,
    then any gamma, T and default) equals a fresh fitted_q_nd bit for bit, for both
    relations; a spec whose anchors, bandwidth, radius or relation differ from the build is
    refused (its operators would be the wrong ones)."""
    u, s, a, r, s2, term = _toy(30, 2, 5)
    box = StateBox.of([[0.0, 1.0], [0.0, 1.0]])
    for neighbour in ("user", "reward"):
        base = KernelFQISpec(
            gamma=0.7, iterations=6, betas=(2.0, 2.0), anchor_points=5, bandwidth=0.15,
            neighbour=neighbour,
        )  # fmt: skip
        kw = {"n_actions": 2, "reward_range": (0.0, 1.0), "box": box}
        ops = build_operators_nd(
            Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), spec=base, **kw
        )
        for gamma, t, default in ((0.7, 6, None), (0.5, 3, 0.0), (0.9, 9, 1.5)):
            spec = dataclasses.replace(base, gamma=gamma, iterations=t, default=default)
            fresh = fitted_q_nd(
                Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), spec=spec, **kw
            )
            assert np.array_equal(iterate_q_nd(ops, spec=spec), fresh)
        for change in ({"bandwidth": 0.2}, {"anchor_points": 4}, {"kernel_radius": 1.5}):
            with pytest.raises(InvalidArgument, match="do not match"):
                iterate_q_nd(ops, spec=dataclasses.replace(base, **change))


def test_inducing_grid_holding_the_anchor_coordinates_gives_the_full_rkhs_fit() -> None:
    """When every anchor coordinate value is an inducing point (M - 1 a multiple of G - 1),
    the subspace holds the representers, so L is the same function for M = 6, 11, 21 at
    G = 6 (docs/privacy.md 2.6: M is then no lever); M = 8 misses them and differs."""
    from qveil.kfqi import additive_features, inducing_grid

    betas = (1024.0, 2.0, 4.0)
    fit = anchor_grid(6, 3)
    v = np.random.default_rng(4).normal(size=len(fit))
    pts = np.random.default_rng(5).uniform(size=(200, 3))

    def values(m: int) -> np.ndarray:
        coef = krr_operator(fit, betas=betas, inducing_points=m, lam=0.2)
        out: np.ndarray = additive_features(pts, betas, inducing_grid(m)) @ (coef @ v)
        return out

    ref = values(6)
    for m in (11, 21):
        assert np.allclose(values(m), ref, atol=1e-8), m
    assert not np.allclose(values(8), ref, atol=1e-4)


@pytest.mark.parametrize("prior", PRIORS)
@pytest.mark.parametrize("d", [1, 2])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_brute_force_every_replacement_of_one_user_on_a_tiny_case(
    layout: str, d: int, prior: str
) -> None:
    """Exhaustive on a tiny case: 6 users of 2 samples, d = 1 (the 1-D releases) and d = 2;
    user 0's data replaced by every combination of states on a lattice of 3 points per
    coordinate, both actions, rewards 0 or 1 and terminal or not for its samples (with the
    next state at the far corner): the largest sup |Q_T - Q_T'| found stays under D_T, and
    reaches a fair part of it; with the constant default 0 or a public prior table as the
    uncovered users' vote."""
    import itertools

    rng = np.random.default_rng(8)
    n_users, per, gamma, t = 6, 2, 0.6, 5
    u = np.repeat(np.arange(n_users), per)
    s = rng.uniform(0, 1, (len(u), d))
    s2 = np.clip(s + rng.normal(0, 0.2, s.shape), 0, 1)
    a = rng.integers(0, 2, len(u))
    r = rng.uniform(0, 1, len(u))
    term = np.zeros(len(u), bool)
    box = StateBox.of([[0.0, 1.0]] * d)
    spec = KernelFQISpec(
        gamma=gamma, iterations=t, betas=(2.0,) * d, bandwidth=0.3, default=0.0,
        **_layout(layout, d),  # type: ignore[arg-type]
    )  # fmt: skip
    kw = dict(
        n_actions=2, reward_range=(0.0, 1.0), box=box, spec=spec, prior=_prior(prior, spec, 9)
    )
    q = fitted_q_nd(Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **kw)
    dt = sup_sensitivity(
        neighbour="user", users=n_users, reward_range=(0.0, 1.0), gamma=gamma, iterations=t
    )
    lattice = [np.array(p) for p in itertools.product((0.0, 0.5, 1.0), repeat=d)]
    worst = 0.0
    mine = np.flatnonzero(u == 0)
    for pos in itertools.product(range(len(lattice)), repeat=per):
        for act, rew, end in itertools.product((0, 1), (0.0, 1.0), (False, True)):
            s_, a_, r_, s2_, t_ = s.copy(), a.copy(), r.copy(), s2.copy(), term.copy()
            s_[mine] = [lattice[i] for i in pos]
            s2_[mine] = 1.0
            a_[mine], r_[mine], t_[mine] = act, rew, end
            q2 = fitted_q_nd(Transitions(s=s_, a=a_, r=r_, s2=s2_, terminal=t_, user=u), **kw)
            worst = max(worst, float(np.abs(q - q2).max()))
    assert worst <= dt * (1 + 1e-9), (worst, dt)
    assert worst > (0.2 if d > 1 else 0.15) * dt, (worst, dt)  # d = 1 sobol: 0.199


def test_sobol_anchors_reach_k_anchors_per_sample_whatever_d() -> None:
    """The sobol layout's cost is O(samples x k + K x d): at most k pairs per sample, each
    next state a convex combination of exactly k anchors, also at d = 16 where a grid of
    even 3 points per coordinate would hold 43 million anchors."""
    from qveil.kfqi import Anchors

    for d in (2, 8, 16):
        spec = KernelFQISpec(
            gamma=0.5, iterations=1, betas=(2.0,) * d, anchors="sobol", anchor_count=512,
            neighbours=7, bandwidth=0.3,
        )  # fmt: skip
        anc = Anchors(spec)
        assert anc.points.shape == (512, d) and spec.anchor_total == 512
        x = np.random.default_rng(d).uniform(size=(300, d))
        rows, cols, w = anc.pairs(x)
        assert np.bincount(rows, minlength=300).max() <= 7 and (w > 0).all()
        idx, wt = anc.interp(x)
        assert idx.shape == wt.shape == (300, 7)
        assert np.allclose(wt.sum(axis=1), 1.0) and (wt >= 0).all()
    # the anchors are a public constant: the same points every time
    a1 = Anchors(spec).points
    assert np.array_equal(a1, Anchors(spec).points)
    with pytest.raises(InvalidArgument, match="anchors must be one of"):
        KernelFQISpec(gamma=0.5, iterations=1, betas=(1.0,), anchors="random")


def _episodes(n_users: int, k: int, d: int, seed: int) -> tuple[np.ndarray, ...]:
    """n_users users of k continuous episodes each (s of a row = s2 of the row before;
    an episode ends terminal or truncated), then a random walk of 2 actions in [0, 1]^d."""
    rng = np.random.default_rng(seed)
    cols: list[list[np.ndarray]] = [[], [], [], [], [], [], []]
    for u in range(n_users):
        for e in range(k):
            length = int(rng.integers(2, 7))
            s = rng.uniform(0.2, 0.8, d)
            for t in range(length):
                a = int(rng.integers(2))
                s2 = np.clip(s + (0.08 if a else -0.08) + rng.normal(0, 0.03, d), 0, 1)
                last = t == length - 1
                term = last and bool(rng.integers(2))  # else the episode is truncated
                for col, v in zip(cols, (u, u * k + e, s, a, rng.uniform(), s2, term), strict=True):
                    col.append(np.asarray(v))
                s = s2
    user, episode, s, a, r, s2, term = (np.stack(c) for c in cols)
    return user, episode, s, a, r, s2, term.astype(bool)


def test_episode_votes_split_users_at_terminals_and_breaks() -> None:
    user, episode, s, a, r, s2, term = _episodes(7, 3, 2, 4)
    rows = Transitions(user=user, s=s, a=a, r=r, s2=s2, terminal=term)
    vote, weight, votes = episode_votes(rows)
    assert votes == 21
    # the same episodes as the generator, numbered in user order
    assert (
        np.unique(vote, return_inverse=True)[1] == np.unique(episode, return_inverse=True)[1]
    ).all()
    assert np.allclose(weight, 1.0 / 3.0)
    # users' rows interleaved (each user's own rows still in order): the same split, since
    # it depends on each user's own rows in their order only
    keys = np.random.default_rng(0).permutation(len(user))
    for u in np.unique(user):
        keys[user == u] = np.sort(keys[user == u])
    perm = np.argsort(keys)
    v2, w2, n2 = episode_votes(rows.take(perm))
    assert n2 == 21 and np.allclose(w2, 1.0 / 3.0)
    assert (
        np.unique(v2, return_inverse=True)[1] == np.unique(vote[perm], return_inverse=True)[1]
    ).all()
    one = np.zeros(len(user), dtype=np.int64)
    _, w1, n1 = episode_votes(dataclasses.replace(rows, user=one))  # one user, every episode
    assert n1 == 21 and np.allclose(w1, 1.0 / 21)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_several_episodes_per_user_estimate_what_one_episode_users_do(layout: str) -> None:
    """A user's vote is the mean of its episodes' votes, so N users of k episodes each give
    exactly the Q_T of the same N k episodes as N k one-episode users: more episodes per
    user change the variance, never the estimand. (Pooling a user's episodes into one NW
    average fails this: it changes how much of the box a user reaches, which collapsed the
    non-private CartPole policy from 470 to 39 at 1e4 users of 3 episodes.)"""
    user, episode, s, a, r, s2, term = _episodes(12, 3, 2, 5)
    spec = KernelFQISpec(
        gamma=0.7, iterations=6, betas=(2.0, 2.0), bandwidth=0.2, default=0.0,
        **_layout(layout, 2),  # type: ignore[arg-type]
    )  # fmt: skip
    kw = dict(n_actions=2, reward_range=(0.0, 1.0), box=StateBox.of([[0.0, 1.0]] * 2), spec=spec)
    rows = Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=user)
    per_user = fitted_q_nd(rows, **kw)
    per_episode = fitted_q_nd(dataclasses.replace(rows, user=episode), **kw)
    assert np.allclose(per_user, per_episode, rtol=0, atol=1e-12)
    # and a user of 3 episodes is not the same as a user whose one NW average pools them
    pooled_votes = np.zeros(len(user))
    for act in range(2):
        m = a == act
        vote, weight, _ = episode_votes(rows)
        c_ep, _ = averaging_operators_nd(
            rows.take(m), users=12, spec=spec, default=0.0, vote=vote[m], weight=weight[m]
        )
        c_user, _ = averaging_operators_nd(rows.take(m), users=12, spec=spec, default=0.0)
        pooled_votes[act] = np.abs(c_ep - c_user).max()
    assert pooled_votes.max() > 1e-3


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_one_user_of_several_episodes_replaced_moves_q_by_at_most_d_t(layout: str) -> None:
    """Users of 3 episodes; user 0 replaced adversarially by 1 to 12 episodes (all rewards hi
    or lo, piled on one point, terminal or not): sup |Q_T - Q_T'| <= D_T (the user relation
    with N users, whatever the episode counts)."""
    n_users, gamma, t = 10, 0.7, 8
    user, _, s, a, r, s2, term = _episodes(n_users, 3, 2, 6)
    spec = KernelFQISpec(
        gamma=gamma, iterations=t, betas=(2.0, 2.0), bandwidth=0.2, default=0.0,
        **_layout(layout, 2),  # type: ignore[arg-type]
    )  # fmt: skip
    kw = dict(n_actions=2, reward_range=(0.0, 1.0), box=StateBox.of([[0.0, 1.0]] * 2), spec=spec)
    q = fitted_q_nd(Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=user), **kw)
    dt = sup_sensitivity(
        neighbour="user", users=n_users, reward_range=(0.0, 1.0), gamma=gamma, iterations=t
    )
    rest = user != 0
    worst = 0.0
    for case in range(8):
        k = (1, 2, 5, 12)[case % 4]
        rows = 3 * k
        s0 = np.full((rows, 2), 0.5 if case < 4 else 0.1)
        s20 = np.full((rows, 2), 1.0 if case % 2 else 0.5)  # never continuous: each row
        if case % 4 == 3:  # one long continuous episode instead
            s20 = np.vstack([s0[1:], [[0.9, 0.9]]])
        a0 = np.full(rows, case % 2)
        r0 = np.full(rows, float(case % 2))
        t0 = np.full(rows, case >= 4)
        replaced = Transitions(
            s=np.vstack([s[rest], s0]), a=np.r_[a[rest], a0], r=np.r_[r[rest], r0],
            s2=np.vstack([s2[rest], s20]), terminal=np.r_[term[rest], t0],
            user=np.r_[user[rest], np.zeros(rows, np.int64)],
        )  # fmt: skip
        q2 = fitted_q_nd(replaced, **kw)
        worst = max(worst, float(np.abs(q - q2).max()))
    assert worst <= dt * (1 + 1e-9), (worst, dt)
    assert worst > 0.05 * dt, (worst, dt)


def _clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    from scipy.stats import beta as beta_dist

    return 1.0 if k >= n else float(beta_dist.ppf(1 - alpha, k + 1, n - k))


def _empirical_epsilon(
    f: np.ndarray, f2: np.ndarray, xs: np.ndarray, sigma: float, beta: float, *, draws: int
) -> float:
    """A lower bound on epsilon (95 % per Clopper-Pearson side) from ``draws`` seeded
    releases of each neighbour observed at the states ``xs``, distinguished by the optimal
    test: the projection onto the difference direction in the noise's metric
    (Neyman-Pearson). The threshold is chosen on the first half of the draws and evaluated on
    the second."""
    from qveil.noise import OUSamplePath

    cov = np.exp(-beta * np.abs(xs[:, None] - xs[None, :]))
    direction = np.linalg.solve(cov, f - f2)  # K^{-1} d, per action (column)
    rng = np.random.default_rng(12)

    def stats(mean: np.ndarray) -> np.ndarray:
        out = np.empty(draws)
        for i in range(draws):
            y = mean + np.stack(
                [OUSamplePath(sigma=sigma, beta=beta, rng=rng).sample(xs) for _ in range(2)],
                axis=1,
            )
            out[i] = float((y * direction).sum())
        return out

    t1, t2 = stats(f), stats(f2)
    half = draws // 2
    best, best_tau = -np.inf, 0.0
    for tau in np.quantile(t2[:half], [0.5, 0.7, 0.9, 0.99, 0.999]):
        fpr = max((t2[:half] > tau).mean(), 1.0 / half)
        tpr = (t1[:half] > tau).mean()
        if tpr > 0 and math.log(tpr / fpr) > best:
            best, best_tau = math.log(tpr / fpr), float(tau)
    n = draws - half
    a_up = _clopper_pearson_upper(int((t2[half:] > best_tau).sum()), n, 0.025)
    b_up = _clopper_pearson_upper(int((t1[half:] <= best_tau).sum()), n, 0.025)
    return max(0.0, math.log(max(1e-300, 1 - 1e-5 - b_up) / a_up))


def test_empirical_privacy_audit_of_a_d_1_release() -> None:
    """2000 seeded releases (kernel estimator, d = 1) on each of a neighbouring pair (reward
    relation, every reward shifted by (hi - lo) / N: the tight pair), observed at 41 states
    and told apart by the optimal test: the Clopper-Pearson lower bound on epsilon stays
    below the card's epsilon = 1. The same audit scores a mechanism with a tenth of the sigma
    (a 10x under-estimated sensitivity) far above the claimed epsilon: it catches a wrong
    mechanism. Seeded throughout (no false alarms)."""
    users = 50
    rng = np.random.default_rng(5)
    n = users * 20
    s = rng.uniform(0, 1, n)
    a = rng.integers(0, 2, n)
    s2 = np.clip(s + np.where(a == 1, 1, -1) * rng.uniform(0, 0.25, n), 0, 1)
    r = 0.1 + 0.2 * (0.5 - np.abs(s2 - 0.5))
    u = np.repeat(np.arange(users), 20)
    spec = KernelFQISpec(
        gamma=0.5, iterations=10, betas=(2.0,), bandwidth=0.05, neighbour="reward",
        anchor_points=41, lam=0.2, inducing_points=11,
    )  # fmt: skip
    box = StateBox.of([[0.0, 1.0]])
    xs = np.linspace(0.0, 1.0, 41)
    fit = {}
    for name, rew in (("D", r), ("D'", r + 0.5 / users)):
        q = fitted_q_nd(
            Transitions(s=s, a=a, r=rew, s2=s2, terminal=np.zeros(n, bool), user=u),
            n_actions=2, reward_range=(0.0, 0.5), box=box, spec=spec,
        )  # fmt: skip
        k = krr_result(q, spec=spec, reward_range=(0.0, 0.5))
        fit[name] = additive_mean(
            xs[:, None], alpha=k.alpha, centre=k.centre, inducing=k.inducing, betas=k.betas
        )
    card = calibrate_kernel_fqi(
        KernelFQIPrivacyParams(
            neighbour="reward", users=users, reward_range=(0.0, 0.5), gamma=0.5,
            iterations=10, actions=2, dims=1, betas=(2.0,), lam=0.2, anchor_points=41,
            inducing_points=11, delta=1e-5,
        ),
        epsilon=1.0,
    )  # fmt: skip
    scores = {
        frac: _empirical_epsilon(fit["D"], fit["D'"], xs, card.sigma * frac, 2.0, draws=2000)
        for frac in (1.0, 0.1)
    }
    print(f"empirical epsilon lower bounds (card epsilon 1): {scores}")
    assert scores[1.0] < card.epsilon
    assert scores[0.1] > card.epsilon


def _reached(spec: KernelFQISpec, s: np.ndarray, a: np.ndarray, m: int) -> set[tuple[int, int]]:
    """The (anchor, action) pairs the samples (unit states ``s``, actions ``a``) reach."""
    anchors = Anchors(spec)
    out: set[tuple[int, int]] = set()
    for act in range(m):
        if not (a == act).any():
            continue
        _, kk, _ = anchors.pairs(s[a == act])
        out |= {(int(k), act) for k in kk}
    return out


def _spreading_users(reward0: float, terminal0: bool, d: int, n_b: int) -> tuple[np.ndarray, ...]:
    """User 0: one sample at the corner 0 of the unit box (next state the corner, action 0);
    users 1..n_b: one sample at the centre, reward 1, next state the corner (action 0)."""
    n = 1 + n_b
    s = np.array([np.zeros(d)] + [np.full(d, 0.5)] * n_b)
    s2 = np.zeros((n, d))
    r = np.array([reward0] + [1.0] * n_b)
    term = np.array([terminal0] + [False] * n_b)
    return np.arange(n), s, np.zeros(n, dtype=np.int64), r, s2, term


def test_one_user_change_spreads_through_p_so_the_naive_sum_of_squares_bound_fails() -> None:
    """docs/privacy.md 2.6, "The sum of squares": user 0 reaches 32 of the 1024 anchors (the
    grid 4^5 around the corner), yet replacing it (reward 1 -> 0, then terminal) moves Q_T at
    every anchor, because the other users' next states all interpolate at the corner (P's
    corner column sums to about K): ||Q_T - Q_T'||_2 exceeds sqrt(r) D_T, the bound that
    would hold if the change stayed where the user reaches. The accountant's sup bound D_T
    holds, and so does the sound l2 bound sqrt(m K) gamma D_{T-1} + sqrt(r) (q_hi - q_lo) / N
    (only the last step's injection is local)."""
    d, g, gamma, t, n_b = 5, 4, 0.9, 30, 40
    spec = KernelFQISpec(gamma=gamma, iterations=t, betas=(2.0,) * d, anchor_points=g,
                         bandwidth=0.26, default=0.0)  # fmt: skip
    kw = dict(n_actions=2, reward_range=(0.0, 1.0), box=StateBox.of([[0.0, 1.0]] * d), spec=spec)
    before = _spreading_users(1.0, False, d, n_b)
    after = _spreading_users(0.0, True, d, n_b)
    dq = fitted_q_nd(_cols(before), **kw) - fitted_q_nd(_cols(after), **kw)
    n, k_all = 1 + n_b, g**d
    r = len(
        _reached(spec, before[1][:1], before[2][:1], 2)
        | _reached(spec, after[1][:1], after[2][:1], 2)
    )
    assert r == 32
    dt, dt1 = (
        sup_sensitivity(
            neighbour="user", users=n, reward_range=(0.0, 1.0), gamma=gamma, iterations=it
        )  # fmt: skip
        for it in (t, t - 1)
    )
    l2 = float(np.sqrt((dq**2).sum()))
    assert np.count_nonzero(np.abs(dq[:, 0]) > 1e-12) == k_all  # every anchor moved
    assert float(np.abs(dq).max()) <= dt * (1 + 1e-9)  # the accountant's D_T holds
    assert l2 > 3.0 * math.sqrt(r) * dt  # the naive bound fails by a factor above 3
    sound = math.sqrt(2 * k_all) * gamma * dt1 + math.sqrt(r) / ((1 - gamma) * n)
    assert l2 <= sound
    # the spreading: the corner's column of P (action 0) sums to about K n_b / N
    ops = build_operators_nd(_cols(before), **kw)
    col = np.asarray(ops.actions[0].p.sum(axis=0)).ravel()
    assert col.max() > 0.9 * k_all * n_b / n


def _cols(u: tuple[np.ndarray, ...]) -> Transitions:
    """The rows of :func:`_spreading_users`."""
    users, s, a, r, s2, term = u
    return Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=users)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_last_step_l2_bound_holds_for_adversarial_replacements(layout: str) -> None:
    """The sound sum-of-squares bound (docs/privacy.md 2.6): for one user replaced,
    ||Q_T - Q_T'||_2 <= sqrt(m K) gamma D_{T-1} + sqrt(r_u) (q_hi - q_lo) / N, with r_u the
    (anchor, action) pairs the user's samples reach in either dataset."""
    n_users, gamma, t, d = 30, 0.7, 8, 2
    u, s, a, r, s2, term = _toy(n_users, d, 2)
    spec = KernelFQISpec(gamma=gamma, iterations=t, betas=(2.0,) * d, bandwidth=0.1,
                         **_layout(layout, d))  # type: ignore[arg-type]  # fmt: skip
    kw = dict(n_actions=2, reward_range=(0.0, 1.0), box=StateBox.of([[0.0, 1.0]] * d), spec=spec)
    q = fitted_q_nd(Transitions(s=s, a=a, r=r, s2=s2, terminal=term, user=u), **kw)
    dt1 = sup_sensitivity(neighbour="user", users=n_users, reward_range=(0.0, 1.0),
                          gamma=gamma, iterations=t - 1)  # fmt: skip
    k_all = spec.anchor_total
    mine = u == 0
    tight = 0.0
    for k in range(6):
        s_, a_, r_, s2_, term_ = s.copy(), a.copy(), r.copy(), s2.copy(), term.copy()
        r_[mine] = float(k % 2)
        s_[mine] = 0.5 if k < 3 else 0.0
        s2_[mine] = 1.0 if k % 3 else 0.5
        a_[mine] = k % 2
        term_[mine] = k >= 3
        q2 = fitted_q_nd(Transitions(s=s_, a=a_, r=r_, s2=s2_, terminal=term_, user=u), **kw)
        l2 = float(np.sqrt(((q - q2) ** 2).sum()))
        reach = _reached(spec, s[mine], a[mine], 2) | _reached(spec, s_[mine], a_[mine], 2)
        bound = math.sqrt(2 * k_all) * gamma * dt1 + math.sqrt(len(reach)) / ((1 - gamma) * n_users)
        assert l2 <= bound * (1 + 1e-9), (k, l2, bound)
        tight = max(tight, l2 / bound)
    assert tight > 0.01  # not vacuous
