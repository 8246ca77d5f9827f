"""The privacy accountant: epsilon for a sigma (``account``) and sigma for an epsilon
(``calibrate``) in three modes. Pure functions of :class:`PrivacyParams`; no I/O.

Modes (docs/privacy.md has the derivations, assumptions and when to use each):

``paper``  Theorem 5 of Wang & Hegde (2019) exactly as stated, with the release counted as
           one more mechanism: with v = 4 alpha (k+1) / B, beta = 1/v,
           C = (v^2 + v) L^2 (times the reward sensitivity squared) and T' mechanisms,
               sigma >= sqrt(2 T' ln(e + eps/delta) C) / eps                 (Theorem 5)
           and total delta = delta + 1 - (1 - exp(-(2k - 8.68 sqrt(beta) sigma)^2 / 2))^J
           (Appendix E.3's tight form), only when 2k > 8.68 sqrt(beta) sigma (Lemma 8).
``gdp``    The same per-step sensitivity sqrt(C), composed exactly: T' Gaussian mechanisms
           are mu-GDP with mu = sqrt(T' C) / sigma (Dong, Roth & Su 2019, Cor. 3.3), and
           delta(eps) in closed form (DRS19 Cor. 2.13). The bound |g| <= k it rests on uses
           Lemma 8's expectation bound with the correct Borell-TIS tail, two-sided:
           P(sup|g| > k) <= 2 exp(-(k - 8.68 sqrt(beta) sigma)^2 / (2 sigma^2)).
``output`` Strict: one GP mechanism at release on the class the server enforces
           (|Q| <= M = r0/(1-gamma) by clamping, L-Lipschitz in the unit state): per-action
           RKHS sensitivity^2 <= 4 M^2 (1 + beta/2) + 2 L^2 / beta (Lemma 6's inner product),
           m actions jointly (squared sensitivities add), analytic Gaussian mechanism
           (Balle & Wang 2018) for delta(eps); beta = L / M minimises the sensitivity.

T' = (SGD updates) + 1 release, where updates = ``steps`` if given, else ceil(T / B).
"""

from __future__ import annotations

import math
from dataclasses import replace as dc_replace

from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject
from qveil.privacy.checks import positive as _pos
from qveil.privacy.gaussian import analytic_gaussian_sigma, gdp_epsilon, gdp_mu
from qveil.privacy.params import ONE_KEY, PrivacyParams, PrivacyResult, one_gaussian
from qveil.privacy.rkhs import optimal_beta, output_sensitivity_sq

__all__ = [
    "LEMMA8_CONSTANT",
    "account",
    "calibrate",
    "lemma8_borell_delta",
    "lemma8_paper_delta",
    "theorem5_C",
    "theorem5_beta",
    "theorem5_epsilon",
    "theorem5_sigma",
]

LEMMA8_CONSTANT = 8.68
"""Lemma 8: E[max_x g(x)] <= 8.68 sqrt(beta) sigma for g ~ GP(0, sigma^2 exp(-beta|x-y|))."""

_K_MAX = 2**40  # calibration gives up on k beyond ~1e12 (reported as holds=False, never raised)


# ---------------------------------------------------------------------------- formulas


def theorem5_beta(*, lr: float, k: float, batch_size: int) -> float:
    """beta = (4 alpha (k+1) / B)^{-1} (Theorem 5; the proof's choice 1/beta = v)."""
    return 1.0 / (4.0 * _pos("lr", lr) * (_pos("k", k) + 1.0) / _pos("batch_size", batch_size))


def theorem5_C(*, lr: float, k: float, batch_size: int, lipschitz: float) -> float:  # noqa: N802
    """C(alpha, k, L, B) = ((4 alpha (k+1)/B)^2 + 4 alpha (k+1)/B) L^2 (Theorem 5): the squared
    per-step RKHS sensitivity the theorem's proof derives from Lemma 6 with 1/beta = v."""
    v = 4.0 * _pos("lr", lr) * (_pos("k", k) + 1.0) / _pos("batch_size", batch_size)
    lip = _pos("lipschitz", lipschitz)
    return (v * v + v) * lip * lip


def _t5_sigma(eps: float, delta: float, n: float, c: float) -> float:
    return math.sqrt(2.0 * n * math.log(math.e + eps / delta) * c) / eps


def theorem5_sigma(*, epsilon: float, delta: float, mechanisms: int, C: float) -> float:  # noqa: N803
    """Theorem 5's noise level: sigma = sqrt(2 T' ln(e + eps/delta) C) / eps (the form the
    proof derives, end of Section 3.2; the typeset statement misplaces the square root)."""
    return _t5_sigma(
        _pos("epsilon", epsilon), _pos("delta", delta), _pos("mechanisms", mechanisms), _pos("C", C)
    )


def _t5_gap(eps: float, sigma: float, delta: float, n: float, c: float) -> float:
    """sigma - sqrt(2 T' ln(e + eps/delta) C) / eps: >= 0 iff Theorem 5's inequality holds
    (the same expression as :func:`theorem5_sigma`, so the check is exact in floating point).
    Strictly increasing in eps > 0: ln grows slower than eps^2."""
    return sigma - _t5_sigma(eps, delta, n, c)


def theorem5_epsilon(*, sigma: float, delta: float, mechanisms: int, C: float) -> float:  # noqa: N803
    """Smallest eps for which Theorem 5's inequality sigma >= sqrt(2 T' ln(e+eps/delta) C)/eps
    holds. h(eps) = sigma - sqrt(2 T' C ln(e + eps/delta)) / eps is increasing, -> -inf as
    eps -> 0 and -> sigma > 0 as eps -> inf, so it has one root and h >= 0 beyond it.
    Bisection on an adaptive bracket; the upper end is returned (verified h >= 0)."""
    s = _pos("sigma", sigma)
    d = _pos("delta", delta)
    n = _pos("mechanisms", mechanisms)
    c = _pos("C", C)
    lo, hi = 0.0, max(math.sqrt(2.0 * n * c) / s, 1e-300)
    while _t5_gap(hi, s, d, n, c) < 0.0:
        lo, hi = hi, 2.0 * hi
        if hi > 1e300:  # pragma: no cover - h grows linearly, so this cannot happen
            raise InvalidArgument(f"Theorem 5 has no epsilon for sigma={sigma!r}")
    for _ in range(2200):  # to adjacent floats
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _t5_gap(mid, s, d, n, c) < 0.0:
            lo = mid
        else:
            hi = mid
    return hi


def _one_minus_pow(p: float, j: int) -> float:
    """1 - (1 - p)^J, accurate for tiny p (log1p/expm1)."""
    if p >= 1.0:
        return 1.0
    return -math.expm1(j * math.log1p(-p))


def lemma8_paper_delta(*, margin: float, resets: int) -> float:
    """Appendix E.3's tight form of Theorem 5's noise term: 1 - (1 - exp(-u^2/2))^J with
    u = 2k - 8.68 sqrt(beta) sigma > 0 (Lemma 8 as stated: tail exp(-u^2/2))."""
    u = _pos("margin", margin)
    return _one_minus_pow(math.exp(-u * u / 2.0), int(resets))


def lemma8_borell_delta(*, margin: float, sigma: float, resets: int) -> float:
    """P(some of J independent paths has sup|g| > k) with the Borell-TIS tail
    P(sup g >= E sup g + u) <= exp(-u^2 / (2 sigma^2)), E sup g <= 8.68 sqrt(beta) sigma
    (Lemma 8's expectation bound), two-sided: p = min(1, 2 exp(-u^2/(2 sigma^2))),
    u = k - 8.68 sqrt(beta) sigma > 0; result 1 - (1 - p)^J."""
    u = _pos("margin", margin)
    s = _pos("sigma", sigma)
    return _one_minus_pow(min(1.0, 2.0 * math.exp(-u * u / (2.0 * s * s))), int(resets))


# ---------------------------------------------------------------------------- account
def account(params: PrivacyParams) -> PrivacyResult:
    """epsilon (and delta_total) of a release for the given sigma, in ``params.mode``.

    Never raises because a theorem's condition fails: the result then has holds=False, no
    epsilon, and the reason. Raises InvalidArgument only for unusable input (sigma missing).
    """
    if not isinstance(params, PrivacyParams):
        raise InvalidArgument(f"account() needs PrivacyParams, got {type(params).__name__}")
    if params.sigma is None:
        raise InvalidArgument("account() needs sigma; use calibrate() to find one")
    if params.mode == "output":
        return _account_output(params)
    return _account_training(params)


def _account_training(p: PrivacyParams) -> PrivacyResult:
    assert p.sigma is not None
    sigma = p.sigma
    n = p.updates + 1  # the release is one more mechanism of the same sensitivity
    beta = theorem5_beta(lr=p.lr, k=p.k, batch_size=p.batch_size)
    c = theorem5_C(lr=p.lr, k=p.k, batch_size=p.batch_size, lipschitz=p.lipschitz)
    c *= p.reward_sensitivity**2  # every sensitivity is linear in ||r - r'||_inf
    sens = math.sqrt(c)
    reasons: list[str] = []
    if not p.plain_sgd:
        reasons.append(
            "the optimiser is not plain SGD with step alpha, so Theorem 5's "
            "per-step sensitivity sqrt(C) does not apply"
        )
    terms = _paper_terms if p.mode == "paper" else _gdp_terms
    eps, mu, margin, dg, basis = terms(p, n=n, c=c, beta=beta, reasons=reasons)
    delta_total = None if dg is None else p.delta + dg
    if delta_total is not None and delta_total >= 1.0:
        reasons.append(f"delta_total = {delta_total:.6g} >= 1: the guarantee is vacuous")
    holds = not reasons
    return PrivacyResult(
        mode=p.mode,
        epsilon=eps if holds else None,
        delta=p.delta,
        delta_total=delta_total if holds else None,
        holds=holds,
        sigma=sigma,
        beta=beta,
        k=p.k,
        basis=basis,
        reason=None if holds else "; ".join(reasons),
        params=p,
        mu=mu,
        sensitivity=sens,
        mechanisms=n,
        delta_noise_bound=dg,
        lemma8_margin=margin,
        epsilon_if_conditions_held=None if holds else eps,
    )


def _paper_terms(
    p: PrivacyParams, *, n: int, c: float, beta: float, reasons: list[str]
) -> tuple[float, float | None, float, float | None, str]:
    """Theorem 5 as stated: (epsilon, mu = None, Lemma 8's margin, its delta term or None, basis);
    a failed condition is appended to ``reasons``."""
    assert p.sigma is not None
    sigma, sens = p.sigma, math.sqrt(c)
    bound_e = LEMMA8_CONSTANT * math.sqrt(beta) * sigma
    eps = theorem5_epsilon(sigma=sigma, delta=p.delta, mechanisms=n, C=c)
    margin = 2.0 * p.k - bound_e
    if margin <= 0.0:
        reasons.append(
            f"Lemma 8's condition 2k > 8.68 sqrt(beta) sigma fails: 2k = {2 * p.k:.6g} "
            f"<= 8.68 * sqrt({beta:.6g}) * {sigma:.6g} = {bound_e:.6g}, so Theorem 5 "
            f"gives no guarantee"
        )
        dg = None
    else:
        dg = lemma8_paper_delta(margin=margin, resets=p.resets)
    # Soundness check: T' Gaussian mechanisms of sensitivity sqrt(C) are exactly
    # mu-GDP, and that curve is tight, so no valid accounting of the proof's own
    # mechanisms can give a smaller epsilon. The closed form drops the T'C/(2 sigma^2)
    # term of the proof's derivation and falls below it when mu is large.
    eps_exact = gdp_epsilon(delta=p.delta, mu=math.sqrt(n) * sens / sigma)
    if eps < eps_exact:
        reasons.append(
            f"Theorem 5's closed form gives epsilon {eps:.6g}, below the exact epsilon "
            f"{eps_exact:.6g} of {n} Gaussian mechanisms with the per-step sensitivity its "
            f"proof assumes (the closed form drops the T'C/(2 sigma^2) term of the proof's "
            f"derivation), so the claim cannot hold here"
        )
    basis = (
        f"Theorem 5 of Wang & Hegde (2019) as stated (its claim; proof has open gaps, "
        f"docs/privacy.md): {n} mechanisms ({p.updates} SGD updates + 1 release) of "
        f"RKHS sensitivity sqrt(C) = {sens:.4g} (||r-r'||_inf <= "
        f"{p.reward_sensitivity:g}, L = {p.lipschitz:g}, plain SGD), delta_total with "
        f"Lemma 8's tail in Appendix E.3's form 1-(1-p)^J, J = {p.resets}." + ONE_KEY
    )
    return eps, None, margin, dg, basis


def _gdp_terms(
    p: PrivacyParams, *, n: int, c: float, beta: float, reasons: list[str]
) -> tuple[float, float | None, float, float | None, str]:
    """Exact mu-GDP composition: (epsilon, mu, the noise bound's margin, its delta term or None,
    basis); a failed condition is appended to ``reasons``."""
    assert p.sigma is not None
    sigma, sens = p.sigma, math.sqrt(c)
    bound_e = LEMMA8_CONSTANT * math.sqrt(beta) * sigma
    mu = math.sqrt(n) * sens / sigma
    eps = gdp_epsilon(delta=p.delta, mu=mu)
    margin = p.k - bound_e
    if margin <= 0.0:
        reasons.append(
            f"the noise bound |g| <= k needed for the per-step sensitivity fails: k = "
            f"{p.k:.6g} <= 8.68 * sqrt({beta:.6g}) * {sigma:.6g} = {bound_e:.6g} "
            f"(Lemma 8's bound on E[sup g])"
        )
        dg = None
    else:
        dg = lemma8_borell_delta(margin=margin, sigma=sigma, resets=p.resets)
    basis = (
        f"Exact mu-GDP composition (Dong, Roth & Su 2019) of {n} Gaussian process "
        f"mechanisms ({p.updates} SGD updates + 1 release) with Theorem 5's per-step "
        f"RKHS sensitivity sqrt(C) = {sens:.4g} (||r-r'||_inf <= "
        f"{p.reward_sensitivity:g}, L = {p.lipschitz:g}, plain SGD; inherits that "
        f"proof's gaps), plus J = {p.resets} paths bounded by k via Lemma 8's mean "
        f"bound and the Borell-TIS tail." + ONE_KEY
    )
    return eps, mu, margin, dg, basis


def _output_beta(p: PrivacyParams) -> float:
    if p.beta is not None:
        return float(p.beta)
    return float(optimal_beta(sup_bound=2.0 * p.q_bound, lip_bound=2.0 * p.lipschitz))


def _account_output(p: PrivacyParams) -> PrivacyResult:
    assert p.sigma is not None
    beta = _output_beta(p)
    m_bound = p.q_bound
    per_action_sq = output_sensitivity_sq(q_bound=m_bound, lipschitz=p.lipschitz, beta=beta)
    sens = math.sqrt(p.actions * per_action_sq)  # m actions released jointly
    basis = (
        f"One Gaussian process mechanism at release (Hall et al. 2013; analytic Gaussian "
        f"mechanism, Balle & Wang 2018) with RKHS sensitivity {sens:.4g} from Lemma 6's "
        f"inner product for all {p.actions} actions jointly, assuming the served Q is "
        f"clamped to |Q| <= r0/(1-gamma) = {m_bound:.4g} and {p.lipschitz:g}-Lipschitz "
        f"in the unit state; holds for any two reward functions, whatever training did." + ONE_KEY
    )
    return PrivacyResult(
        mode="output",
        **one_gaussian(p, sensitivity=sens, sigma=p.sigma),
        beta=beta,
        k=None,
        basis=basis,
        mu=sens / p.sigma,
        sensitivity=sens,
        mechanisms=1,
        bound=m_bound,
    )


# ---------------------------------------------------------------------------- calibrate
def _target_met(r: PrivacyResult, eps: float, delta: float) -> bool:
    return bool(
        r.holds
        and r.epsilon is not None
        and r.epsilon <= eps
        and r.delta_total is not None
        and r.delta_total <= delta
    )


def _formula_eps(r: PrivacyResult) -> float:
    e = r.epsilon if r.epsilon is not None else r.epsilon_if_conditions_held
    assert e is not None
    return float(e)


def _meet_epsilon(p: PrivacyParams, sigma: float, target: float) -> PrivacyResult:
    """Final check: the smallest sigma' >= sigma (stepping up by tiny relative amounts)
    whose accounted epsilon is <= target. Guards the rounding of closed forms."""
    step = 1e-15
    for _ in range(200):
        r = account(p.replace(sigma=sigma))
        if _formula_eps(r) <= target:
            return r
        sigma *= 1.0 + step
        step *= 2.0
    raise AssertionError("calibration final check failed")  # pragma: no cover


def _sigma_training(
    p: PrivacyParams, k: float, eps: float, delta_mech: float, mu_star: float | None
) -> float:
    n = p.updates + 1
    c = theorem5_C(lr=p.lr, k=k, batch_size=p.batch_size, lipschitz=p.lipschitz)
    c *= p.reward_sensitivity**2
    if p.mode == "paper":
        return theorem5_sigma(epsilon=eps, delta=delta_mech, mechanisms=n, C=c)
    assert mu_star is not None
    return math.sqrt(n * c) / mu_star


def calibrate(
    params: PrivacyParams, *, target_epsilon: float, tune: bool = True, delta_split: float = 0.5
) -> PrivacyResult:
    """The smallest sigma meeting (target_epsilon, params.delta); params.sigma is ignored.

    * output: beta = L / M (sensitivity-minimising) when ``tune`` or params.beta is None;
      sigma = Delta / mu* with mu* the largest GDP parameter meeting the target (bisection).
    * paper / gdp: the target delta is split as in Appendix E.3: the mechanism gets
      delta' = delta_split * delta (returned as params.delta) and Lemma 8's failure
      probability must be <= the rest, so delta_total <= params.delta. With ``tune`` the
      smallest integer k >= 1 that makes this hold is searched (C and hence sigma grow with
      k, so the smallest valid k gives the smallest sigma); otherwise params.k is kept and
      the result may have holds=False, never an exception.

    Every returned sigma passes a final check through :func:`account`: its epsilon (or, when
    a condition fails, the formula's epsilon) is <= target_epsilon: calibration never
    overshoots. ``result.target`` records the target and whether it was met.
    """
    if not isinstance(params, PrivacyParams):
        raise InvalidArgument(f"calibrate() needs PrivacyParams, got {type(params).__name__}")
    eps = _pos("target_epsilon", target_epsilon)
    if isinstance(delta_split, bool) or not (0.0 < float(delta_split) < 1.0):
        raise InvalidArgument(f"delta_split must be in (0, 1), got {delta_split!r}")
    if not isinstance(tune, bool):
        raise InvalidArgument(f"tune must be true or false, got {tune!r}")
    target_delta = params.delta
    if params.mode == "output":
        p = params.replace(
            beta=_output_beta(params) if (tune or params.beta is None) else params.beta, sigma=None
        )
        beta = _output_beta(p)
        sens = math.sqrt(
            p.actions * output_sensitivity_sq(q_bound=p.q_bound, lipschitz=p.lipschitz, beta=beta)
        )
        sigma = analytic_gaussian_sigma(epsilon=eps, delta=target_delta, sensitivity=sens)
        r = _meet_epsilon(p, sigma, eps)
        return _with_target(r, eps, target_delta)

    delta_mech = target_delta * float(delta_split)
    base = params.replace(delta=delta_mech, sigma=None)

    mu_star = gdp_mu(epsilon=eps, delta=delta_mech) if params.mode == "gdp" else None

    def attempt(k: float) -> PrivacyResult:
        q = base.replace(k=k)
        return _meet_epsilon(q, _sigma_training(q, k, eps, delta_mech, mu_star), eps)

    def valid(r: PrivacyResult) -> bool:
        return r.delta_noise_bound is not None and delta_mech + r.delta_noise_bound <= target_delta

    if not tune:
        return _with_target(attempt(params.k), eps, target_delta)
    # smallest integer k >= 1 with a valid noise bound: doubling, then integer bisection
    # (Python ints: exact at any size)
    lo_bad, k = 0, 1
    r = attempt(float(k))
    while not valid(r):
        lo_bad, k = k, 2 * k
        if k > _K_MAX:  # no k works (e.g. gdp when sigma grows as fast as k): say so
            return _with_target(attempt(params.k), eps, target_delta)
        r = attempt(float(k))
    hi_ok, best = k, r
    while hi_ok - lo_bad > 1:
        mid = (lo_bad + hi_ok) // 2
        rm = attempt(float(mid))
        if valid(rm):
            hi_ok, best = mid, rm
        else:
            lo_bad = mid
    return _with_target(best, eps, target_delta)


def _with_target(r: PrivacyResult, eps: float, delta: float) -> PrivacyResult:

    t: JSONObject = {"epsilon": eps, "delta": delta, "met": _target_met(r, eps, delta)}
    return dc_replace(r, target=t)
