"""The accountant's three modes and calibration (qveil.privacy.account / calibrate); its
parameters alone: test_privacy_params.py."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qveil.errors import InvalidArgument
from qveil.privacy import (
    E3_SETTINGS,
    PrivacyParams,
    account,
    analytic_gaussian_delta,
    calibrate,
    gdp_epsilon,
)
from qveil.privacy.accountant import (
    lemma8_paper_delta,
    theorem5_beta,
    theorem5_C,
    theorem5_epsilon,
    theorem5_sigma,
)


def e3(mode: str = "paper", sigma: float | None = 0.32, **kw: object) -> PrivacyParams:
    return PrivacyParams(mode=mode, sigma=sigma, **{**E3_SETTINGS, **kw})  # type: ignore[arg-type]


# ------------------------------------------------------------------ closed forms (Theorem 5)
def test_theorem5_closed_forms_at_e3() -> None:
    v = 4 * 3e-4 * 24 / 64  # 4 alpha (k+1) / B = 4.5e-4 (Appendix E.3 prints 6.19e-5: erratum)
    assert v == pytest.approx(4.5e-4)
    assert (
        theorem5_beta(lr=3e-4, k=23, batch_size=64)
        == pytest.approx(1 / v)
        == pytest.approx(2222.2222222)
    )
    assert theorem5_C(lr=3e-4, k=23, batch_size=64, lipschitz=4) == pytest.approx((v * v + v) * 16)
    c = (v * v + v) * 16
    want = math.sqrt(2 * 80 * math.log(math.e + 0.9 / 1e-4) * c) / 0.9
    assert theorem5_sigma(epsilon=0.9, delta=1e-4, mechanisms=80, C=c) == pytest.approx(want)
    assert want == pytest.approx(3.60, abs=0.01)  # not the paper's 0.313


@pytest.mark.parametrize("delta", [1e-8, 1e-5, 1e-4, 1e-2])
def test_theorem5_sigma_eps_sigma_round_trip(delta: float) -> None:
    c = theorem5_C(lr=3e-4, k=23, batch_size=64, lipschitz=4)
    for sigma in (0.01, 0.1, 0.32, 1.0, 3.0, 30.0, 300.0):
        eps = theorem5_epsilon(sigma=sigma, delta=delta, mechanisms=80, C=c)
        # the returned epsilon satisfies the theorem's inequality ...
        assert sigma >= theorem5_sigma(epsilon=eps, delta=delta, mechanisms=80, C=c)
        # ... and is the smallest that does (sigma -> eps -> sigma round trip)
        assert theorem5_sigma(epsilon=eps, delta=delta, mechanisms=80, C=c) == pytest.approx(
            sigma, rel=1e-10
        )
        assert sigma < theorem5_sigma(epsilon=eps * (1 - 1e-9), delta=delta, mechanisms=80, C=c)


def test_lemma8_tight_form() -> None:
    u, j = 3.5, 78
    p = math.exp(-u * u / 2)
    assert lemma8_paper_delta(margin=u, resets=j) == pytest.approx(1 - (1 - p) ** j, rel=1e-12)
    assert lemma8_paper_delta(margin=u, resets=j) < j * p  # tighter than the union bound
    assert lemma8_paper_delta(margin=40.0, resets=78) == pytest.approx(
        78 * math.exp(-800), rel=1e-9
    )


# ------------------------------------------------------------------ paper mode
def test_paper_e3_does_not_hold_and_says_why() -> None:
    """Lemma 8's 2k > 8.68 sqrt(beta) sigma is 46 > 130.9 at E.3: no guarantee, no exception,
    no epsilon (a number here would be a guarantee the theorem does not give)."""
    r = account(e3(sigma=0.32))
    assert r.holds is False and r.epsilon is None and r.delta_total is None
    assert "Lemma 8" in (r.reason or "") and "130.9" in (r.reason or "")
    assert r.lemma8_margin == pytest.approx(46 - 8.68 * math.sqrt(2222.2222) * 0.32, rel=1e-6)
    # for diagnosis: what the formula alone gives at 0.32 is far from the paper's 0.9
    assert r.epsilon_if_conditions_held is not None and r.epsilon_if_conditions_held > 10
    d = r.to_dict()
    json.dumps(d, allow_nan=False)
    for key in (
        "mode",
        "epsilon",
        "delta",
        "delta_total",
        "holds",
        "sigma",
        "beta",
        "k",
        "basis",
        "reason",
        "params",
    ):
        assert key in d
    assert "Theorem 5" in r.basis


def test_paper_holds_when_conditions_hold() -> None:
    r = account(e3(sigma=10.0, k=1000))
    beta = 64 / (4 * 3e-4 * 1001)
    margin = 2000 - 8.68 * math.sqrt(beta) * 10.0
    assert r.holds and r.reason is None and r.lemma8_margin == pytest.approx(margin)
    c = theorem5_C(lr=3e-4, k=1000, batch_size=64, lipschitz=4)
    assert r.epsilon == theorem5_epsilon(sigma=10.0, delta=1e-4, mechanisms=80, C=c)
    assert r.delta_total == pytest.approx(1e-4 + 1 - (1 - math.exp(-(margin**2) / 2)) ** 78)


def test_paper_closed_form_below_exact_gdp_is_refused() -> None:
    """Theorem 5's closed form drops the T'C/(2 sigma^2) term of its own derivation; for
    small sigma it claims less than the exact (tight) epsilon of the very Gaussian mechanisms
    its proof composes. At E.3 (k = 23) Lemma 8 needs sigma < 0.112, exactly where this
    happens: e.g. sigma = 0.05 gives 79.1 against an exact 170.8."""
    r = account(e3(sigma=0.05))
    assert r.lemma8_margin is not None and r.lemma8_margin > 0  # Lemma 8 alone would pass
    assert not r.holds and r.epsilon is None and "below the exact epsilon" in (r.reason or "")
    c = theorem5_C(lr=3e-4, k=23, batch_size=64, lipschitz=4)
    exact = gdp_epsilon(delta=1e-4, mu=math.sqrt(80 * c) / 0.05)
    assert r.epsilon_if_conditions_held == pytest.approx(79.127, rel=1e-4)
    assert exact == pytest.approx(170.82, rel=1e-4)


def test_paper_condition_boundary_is_strict() -> None:
    # sigma with 8.68 sqrt(beta) sigma == 2k exactly (to rounding): no guarantee
    beta = theorem5_beta(lr=3e-4, k=23, batch_size=64)
    sigma = 46 / (8.68 * math.sqrt(beta))
    r = account(e3(sigma=math.nextafter(sigma, 1.0)))
    assert not r.holds and r.epsilon is None


def test_release_counts_and_rounding_is_conservative() -> None:
    assert e3().updates == 79  # ceil(5000 / 64) = ceil(78.125)
    assert account(e3(sigma=0.05)).mechanisms == 80  # + the release
    assert e3(samples=6400).updates == 100
    assert e3(steps=10).updates == 10 and account(e3(sigma=0.05, steps=10)).mechanisms == 11
    # fewer mechanisms never raise epsilon
    for mode in ("paper", "gdp"):
        few = account(e3(mode, sigma=10.0, k=1000, steps=10))
        full = account(e3(mode, sigma=10.0, k=1000))
        assert few.holds and full.holds and few.epsilon < full.epsilon  # type: ignore[operator]


def test_plain_sgd_false_means_no_guarantee_in_paper_and_gdp() -> None:
    for mode in ("paper", "gdp"):
        r = account(e3(mode, sigma=10.0, k=1000, plain_sgd=False))
        assert not r.holds and r.epsilon is None and "SGD" in (r.reason or "")
    r = account(e3("output", sigma=100.0, plain_sgd=False))
    assert r.holds and r.epsilon is not None


def test_reward_sensitivity_is_linear() -> None:
    for mode in ("paper", "gdp"):
        a, b = account(e3(mode, sigma=0.01)), account(e3(mode, sigma=0.01, reward_sensitivity=0.25))
        assert b.sensitivity == pytest.approx(0.25 * a.sensitivity)
    # gdp: mu is linear in it, so (2 Delta_r, 2 sigma) has the same mu
    a = account(e3("gdp", sigma=0.01))
    b = account(e3("gdp", sigma=0.02, reward_sensitivity=2.0))
    assert b.mu == pytest.approx(a.mu)
    # output mode's class bound holds for ANY pair of reward functions: independent of it
    o1, o2 = (
        account(e3("output", sigma=50.0)),
        account(e3("output", sigma=50.0, reward_sensitivity=0.1)),
    )
    assert o1.epsilon == o2.epsilon


# ------------------------------------------------------------------ gdp mode
def test_gdp_composition_formula() -> None:
    r = account(e3("gdp", sigma=0.01))
    c = theorem5_C(lr=3e-4, k=23, batch_size=64, lipschitz=4)
    mu = math.sqrt(80 * c) / 0.01
    assert r.mu == pytest.approx(mu, rel=1e-12)
    assert r.epsilon == gdp_epsilon(delta=1e-4, mu=r.mu)
    assert r.holds and r.delta_total is not None and r.delta_total >= 1e-4
    assert r.delta_noise_bound == pytest.approx(
        1 - (1 - 2 * math.exp(-(r.lemma8_margin**2) / (2 * 0.01**2))) ** 78
    )


def test_gdp_single_mechanism_is_the_analytic_gaussian_mechanism() -> None:
    """steps=0: only the release, one Gaussian process mechanism of sensitivity sqrt(C)."""
    r = account(e3("gdp", sigma=0.01, steps=0))
    assert r.mechanisms == 1
    sens = math.sqrt(theorem5_C(lr=3e-4, k=23, batch_size=64, lipschitz=4))
    assert analytic_gaussian_delta(epsilon=r.epsilon, sensitivity=sens, sigma=0.01) <= 1e-4
    assert (
        analytic_gaussian_delta(epsilon=r.epsilon * (1 - 1e-9), sensitivity=sens, sigma=0.01) > 1e-4
    )


def test_gdp_is_tighter_than_paper_composition() -> None:
    """Where Theorem 5's closed form is sound (sigma > 0.277 at E.3), exact composition of the
    same mechanisms gives a smaller epsilon."""
    for sigma in (0.32, 0.74, 3.0, 30.0):
        p, g = account(e3("paper", sigma=sigma)), account(e3("gdp", sigma=sigma))
        assert g.epsilon_if_conditions_held < p.epsilon_if_conditions_held  # type: ignore[operator]


def test_gdp_e3_noise_bound_fails_too() -> None:
    r = account(e3("gdp", sigma=0.74))
    assert not r.holds and r.epsilon is None and "k = 23" in (r.reason or "")


# ------------------------------------------------------------------ output mode
def test_output_mode_sensitivity_and_beta() -> None:
    r = account(e3("output", sigma=66.0))
    m, lip = 0.5 / (1 - 0.9), 4.0
    assert r.beta == pytest.approx(lip / m)
    assert r.sensitivity == pytest.approx(math.sqrt(2 * (4 * m * m + 4 * m * lip)))
    assert r.bound == pytest.approx(5.0) and r.to_dict()["bound"] == pytest.approx(5.0)
    assert r.holds and r.k is None and r.delta_total == 1e-4 and r.mechanisms == 1
    # any other beta gives a larger sensitivity, so a larger epsilon
    for beta in (0.2, 3.0):
        assert account(e3("output", sigma=66.0, beta=beta)).epsilon > r.epsilon
    # m actions compose jointly: sensitivity grows as sqrt(m)
    r4 = account(e3("output", sigma=66.0, actions=8))
    assert r4.sensitivity == pytest.approx(2 * r.sensitivity)


# ------------------------------------------------------------------ calibration
@pytest.mark.parametrize("mode", ["paper", "gdp", "output"])
@pytest.mark.parametrize("eps", [0.1, 0.45, 0.9, 3.0])
@pytest.mark.parametrize("delta", [1e-6, 1e-4, 1e-2])
def test_calibrate_round_trip_and_minimal(mode: str, eps: float, delta: float) -> None:
    r = calibrate(e3(mode, sigma=None, delta=delta), target_epsilon=eps)
    assert r.holds and r.target == {"epsilon": eps, "delta": delta, "met": True}
    assert r.epsilon is not None and r.delta_total is not None
    assert r.epsilon <= eps and r.epsilon == pytest.approx(eps, rel=1e-9)
    assert r.delta_total <= delta
    again = account(r.params)  # the recorded params reproduce the result exactly
    assert again.epsilon == r.epsilon and again.delta_total == r.delta_total
    smaller = account(r.params.replace(sigma=r.sigma * (1 - 1e-9)))
    worse = smaller.epsilon if smaller.holds else smaller.epsilon_if_conditions_held
    assert worse is not None and worse > eps  # the smallest sigma (at this k / beta)
    if mode != "output":  # the smallest valid k: k - 1 does not meet the delta target
        assert r.k is not None and r.k >= 1
        if r.k > 1:
            prev = calibrate(
                e3(mode, sigma=None, delta=delta, k=r.k - 1), target_epsilon=eps, tune=False
            )
            assert not prev.target["met"]  # type: ignore[index]
            assert prev.sigma < r.sigma  # and a larger k would cost more noise


def test_calibrate_fixed_k_that_fails_gives_holds_false() -> None:
    r = calibrate(e3("paper", sigma=None), target_epsilon=0.9, tune=False)
    assert not r.holds and r.epsilon is None and r.k == 23
    assert r.target is not None and r.target["met"] is False
    assert r.epsilon_if_conditions_held is not None and r.epsilon_if_conditions_held <= 0.9


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from(["paper", "gdp", "output"]),
    eps=st.floats(1e-3, 50.0),
    delta=st.floats(1e-12, 0.5),
    samples=st.integers(1, 10**6),
    batch=st.integers(1, 512),
    lr=st.floats(1e-6, 1.0),
    lip=st.floats(1e-3, 100.0),
    resets=st.integers(1, 1000),
    actions=st.integers(1, 16),
    gamma=st.floats(0.0, 0.999),
    r0=st.floats(1e-3, 100.0),
    dr=st.floats(1e-3, 10.0),
    tune=st.booleans(),
)
def test_calibration_never_overshoots(
    mode: str,
    eps: float,
    delta: float,
    samples: int,
    batch: int,
    lr: float,
    lip: float,
    resets: int,
    actions: int,
    gamma: float,
    r0: float,
    dr: float,
    tune: bool,
) -> None:
    p = PrivacyParams(
        mode=mode,
        sigma=None,
        delta=delta,
        samples=max(samples, batch),
        batch_size=batch,
        lr=lr,
        k=23,
        lipschitz=lip,
        resets=resets,
        actions=actions,
        gamma=gamma,
        reward_bound=r0,
        reward_sensitivity=dr,
    )
    r = calibrate(p, target_epsilon=eps, tune=tune)
    got = account(r.params)
    e = got.epsilon if got.holds else got.epsilon_if_conditions_held
    assert e is not None and e <= eps
    if got.holds and r.target is not None and r.target["met"]:
        assert got.delta_total is not None and got.delta_total <= delta
    if mode == "output":  # paper/gdp may have no valid k (then holds=False, reported)
        assert r.target is not None and r.target["met"]


# ------------------------------------------------------------------ bad calls
def test_bad_calls() -> None:
    with pytest.raises(InvalidArgument, match="needs sigma"):
        account(e3(sigma=None))
    for bad in (0.0, -0.5, float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="target_epsilon"):
            calibrate(e3(sigma=None), target_epsilon=bad)
    with pytest.raises(InvalidArgument, match="delta_split"):
        calibrate(e3(sigma=None), target_epsilon=1.0, delta_split=1.0)
    with pytest.raises(TypeError):
        calibrate(e3(sigma=None), 1.0)  # type: ignore[misc]
    with pytest.raises(InvalidArgument):
        account({"mode": "paper"})  # type: ignore[arg-type]


def test_every_basis_says_one_key_per_release() -> None:
    """The guarantee is for the release's one noise key; the card's basis says so in every
    mode, once: every answer is computed from that key, every copy answers the same values,
    and new noise takes a new, charged release. Nothing of the retired store story is left."""
    from pathlib import Path

    from qveil.kfqi_config import default_config, load_fqi_config, plan_kernel
    from qveil.privacy import E3_SETTINGS
    from qveil.privacy.checks import ONE_KEY

    bases = {}
    for mode in ("paper", "gdp", "output"):
        r = account(PrivacyParams(mode=mode, sigma=2.0, **{**E3_SETTINGS, "actions": 2}))
        bases[mode] = r.basis
    kernel = load_fqi_config(Path(__file__).resolve().parents[3] / "configs/cartpole-private.toml")
    for nb in ("user", "reward"):
        d1 = default_config().replace(neighbour=nb, epsilon=1.0, sigma=None)
        bases[f"fqi d=1 {nb}"] = plan_kernel(
            d1, users=1000, actions=2, dims=1, reward_range=(0.0, 1.0)
        ).basis
        bases[f"kernel {nb}"] = plan_kernel(
            kernel.replace(neighbour=nb), users=1000, actions=2, dims=4, reward_range=(0.0, 1.0)
        ).basis
    for name, basis in bases.items():
        assert basis.endswith(ONE_KEY) and basis.count(ONE_KEY) == 1, (name, basis)
        assert basis.count("one noise key") == 1, (name, basis)
        assert "store" not in basis and "incarnation" not in basis, (name, basis)
    assert "the release's one noise key, drawn once from OS entropy" in ONE_KEY
    assert "Every copy of the release answers the same values" in ONE_KEY
    assert "new noise needs a new release, charged again" in ONE_KEY
