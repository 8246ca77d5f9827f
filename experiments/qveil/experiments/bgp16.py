"""Differentially private first-visit Monte Carlo policy evaluation: LSW, LSL, DP-LSW, DP-LSL.

Balle, Gomrokchi & Precup (2016), "Differentially Private Policy Evaluation" (BGP16,
``../shared/seeds/balle-gomrokchi-precup-2016-dp-policy-evaluation.txt``):

* LSW (eq. (8)): theta = (Gamma^1/2 Phi)^+ Gamma^1/2 F_X with fixed weights Gamma = diag(w).
* LSL (eq. (11)): theta = (Phi^T Gamma_X Phi + lambda/(2m) I)^-1 Phi^T Gamma_X F_X,
  Gamma_X = diag(rho_s |X_s| / m).
* DP-LSW (Algorithm 1) and DP-LSL (Algorithm 2) release theta + N(0, sigma_X^2 I) with
      alpha = 5 sqrt(2 ln(2/delta)) / eps,   beta = eps / (4 (d + ln(2/delta)))   (Lemma 1)
  and
      DP-LSW: psi = max_{0<=k<=K_X} e^{-k beta} sum_s w_s / max(|X_s| - k, 1)^2          (eq. 9)
              sigma_X = alpha R_max ||(Gamma^1/2 Phi)^+|| / (1 - gamma) * sqrt(psi)
      DP-LSL: c = ||Phi|| ||rho||_inf / sqrt(2 lambda)
              psi = max_{0<=k<=m} e^{-k beta} (c sqrt(sum_s rho_s min(|X_s| + k, m)) + ||rho||_2)^2
                                                                                         (eq. 12)
              sigma_X = 2 alpha R_max ||Phi|| / ((1 - gamma)(lambda - ||Phi||^2 ||rho||_inf))
                        * sqrt(psi),   needs lambda > ||Phi||^2 ||rho||_inf.
  ||.|| is the spectral norm, K_X = max_s |X_s|. Corollary 8 and Lemma 9 of the paper write
  max{v_s, m} where Algorithm 2 and Appendix E write min{|X_s| + k, m}; min is the one that
  makes sense (no state is visited by more than m trajectories), and is what we use.

R_max / (1 - gamma) may be replaced by any *public* upper bound F_max on the returns (end of
Section 3.1); ``f_max=None`` means the algorithms as written. Pure numpy; the experiment
runner (``run``) lives at the bottom and writes CSV + PNG.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument
from qveil.experiments._util import progress_map, write_csv
from qveil.experiments.chain_mdp import Batch, ChainMDP, pairs_features, tabular_features

__all__ = [
    "SmoothParams",
    "dp_lsl",
    "dp_lsw",
    "lsl_fit",
    "lsl_phi",
    "lsl_psi",
    "lsl_sigma",
    "lsw_fit",
    "lsw_phi",
    "lsw_psi",
    "lsw_sigma",
    "run",
    "smooth_params",
]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SmoothParams:
    """alpha and beta of BGP16 Lemma 1 (smoothed Gaussian perturbation)."""

    alpha: float
    beta: float


def smooth_params(*, epsilon: float, delta: float, d: int) -> SmoothParams:
    """alpha = 5 sqrt(2 ln(2/delta)) / eps and beta = eps / (4 (d + ln(2/delta))) (Lemma 1)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InvalidArgument(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise InvalidArgument(f"delta must be in (0, 1), got {delta!r}")
    if d < 1:
        raise InvalidArgument(f"d must be >= 1, got {d!r}")
    l2 = math.log(2.0 / delta)
    return SmoothParams(alpha=5.0 * math.sqrt(2.0 * l2) / epsilon, beta=epsilon / (4.0 * (d + l2)))


def _return_bound(r_max: float, gamma: float, f_max: float | None) -> float:
    if f_max is not None:
        if not f_max > 0:
            raise InvalidArgument(f"f_max must be > 0, got {f_max!r}")
        return float(f_max)
    if not 0 < gamma < 1:
        raise InvalidArgument(f"gamma must be in (0, 1), got {gamma!r}")
    return float(r_max) / (1.0 - gamma)


# ----------------------------------------------------------------------------- LSW / DP-LSW
def lsw_fit(batch: Batch, phi: FloatArray, w: FloatArray) -> FloatArray:
    """theta_X^w = (Gamma^1/2 Phi)^+ Gamma^1/2 F_X (eq. (8))."""
    sq = np.sqrt(np.asarray(w, dtype=np.float64))
    return np.asarray(
        np.linalg.pinv(sq[:, None] * phi) @ (sq * batch.mean_returns()), dtype=np.float64
    )


def lsw_phi(counts: npt.ArrayLike, w: npt.ArrayLike, k: npt.ArrayLike) -> FloatArray:
    """phi_X^w(k) = sum_s w_s / max(|X_s| - k, 1)^2 (eq. (9)), vectorised over k."""
    c = np.asarray(counts, dtype=np.float64)
    kk = np.atleast_1d(np.asarray(k, dtype=np.float64))
    den = np.maximum(c[None, :] - kk[:, None], 1.0) ** 2
    return np.asarray(
        (np.asarray(w, dtype=np.float64)[None, :] / den).sum(axis=1), dtype=np.float64
    )


def lsw_psi(counts: npt.ArrayLike, w: npt.ArrayLike, *, beta: float) -> float:
    """psi_X^w = max_{0 <= k <= K_X} e^{-k beta} phi_X^w(k), K_X = max_s |X_s|."""
    kmax = int(np.max(counts)) if np.size(counts) else 0
    k = np.arange(kmax + 1, dtype=np.float64)
    return float(np.max(np.exp(-k * beta) * lsw_phi(counts, w, k)))


def lsw_sigma(
    counts: npt.ArrayLike,
    phi: FloatArray,
    w: npt.ArrayLike,
    *,
    epsilon: float,
    delta: float,
    r_max: float,
    gamma: float,
    f_max: float | None = None,
) -> float:
    """sigma_X = alpha F ||(Gamma^1/2 Phi)^+|| sqrt(psi_X^w), F = R_max/(1-gamma) or f_max."""
    sp = smooth_params(epsilon=epsilon, delta=delta, d=phi.shape[1])
    sq = np.sqrt(np.asarray(w, dtype=np.float64))
    pinv_norm = float(np.linalg.norm(np.linalg.pinv(sq[:, None] * phi), 2))
    f = _return_bound(r_max, gamma, f_max)
    return sp.alpha * f * pinv_norm * math.sqrt(lsw_psi(counts, w, beta=sp.beta))


def dp_lsw(
    batch: Batch,
    phi: FloatArray,
    w: FloatArray,
    *,
    epsilon: float,
    delta: float,
    r_max: float,
    gamma: float,
    rng: np.random.Generator,
    f_max: float | None = None,
) -> tuple[FloatArray, float]:
    """Algorithm 1 (DP-LSW): (theta + eta, sigma_X) with eta ~ N(0, sigma_X^2 I)."""
    theta = lsw_fit(batch, phi, w)
    sigma = lsw_sigma(
        batch.counts, phi, w, epsilon=epsilon, delta=delta, r_max=r_max, gamma=gamma, f_max=f_max
    )
    return theta + sigma * rng.standard_normal(theta.shape), sigma


# ----------------------------------------------------------------------------- LSL / DP-LSL
def lsl_fit(batch: Batch, phi: FloatArray, rho: FloatArray, *, lam: float) -> FloatArray:
    """theta_X^lambda = (Phi^T Gamma_X Phi + lambda/(2m) I)^-1 Phi^T Gamma_X F_X (eq. (11))."""
    m = batch.m
    gx = np.asarray(rho, dtype=np.float64) * batch.counts / m
    a = phi.T @ (gx[:, None] * phi) + (lam / (2.0 * m)) * np.eye(phi.shape[1])
    return np.asarray(np.linalg.solve(a, phi.T @ (gx * batch.mean_returns())), dtype=np.float64)


def lsl_phi(
    counts: npt.ArrayLike,
    rho: npt.ArrayLike,
    *,
    m: int,
    lam: float,
    phi_norm: float,
    k: npt.ArrayLike,
) -> FloatArray:
    """phi_X^lambda(k) = (c_lambda sqrt(sum_s rho_s min(|X_s| + k, m)) + ||rho||_2)^2 (eq. 12)."""
    r = np.asarray(rho, dtype=np.float64)
    c_lam = phi_norm * float(np.max(r)) / math.sqrt(2.0 * lam)
    c = np.asarray(counts, dtype=np.float64)
    kk = np.atleast_1d(np.asarray(k, dtype=np.float64))
    s = (r[None, :] * np.minimum(c[None, :] + kk[:, None], float(m))).sum(axis=1)
    return np.asarray((c_lam * np.sqrt(s) + float(np.linalg.norm(r))) ** 2, dtype=np.float64)


def lsl_psi(
    counts: npt.ArrayLike, rho: npt.ArrayLike, *, m: int, lam: float, phi_norm: float, beta: float
) -> float:
    """psi_X^lambda = max_{0 <= k <= m} e^{-k beta} phi_X^lambda(k)."""
    k = np.arange(m + 1, dtype=np.float64)
    return float(
        np.max(np.exp(-k * beta) * lsl_phi(counts, rho, m=m, lam=lam, phi_norm=phi_norm, k=k))
    )


def lsl_sigma(
    counts: npt.ArrayLike,
    phi: FloatArray,
    rho: npt.ArrayLike,
    *,
    m: int,
    lam: float,
    epsilon: float,
    delta: float,
    r_max: float,
    gamma: float,
    f_max: float | None = None,
) -> float:
    """sigma_X = 2 alpha F ||Phi|| / (lambda - ||Phi||^2 ||rho||_inf) sqrt(psi_X^lambda)."""
    sp = smooth_params(epsilon=epsilon, delta=delta, d=phi.shape[1])
    phi_norm = float(np.linalg.norm(phi, 2))
    floor = phi_norm**2 * float(np.max(rho))
    if not lam > floor:
        raise InvalidArgument(
            f"DP-LSL needs lambda > ||Phi||^2 ||rho||_inf = {floor:.6g}, got lambda = {lam!r}"
        )
    f = _return_bound(r_max, gamma, f_max)
    psi = lsl_psi(counts, rho, m=m, lam=lam, phi_norm=phi_norm, beta=sp.beta)
    return 2.0 * sp.alpha * f * phi_norm / (lam - floor) * math.sqrt(psi)


def dp_lsl(
    batch: Batch,
    phi: FloatArray,
    rho: FloatArray,
    *,
    lam: float,
    epsilon: float,
    delta: float,
    r_max: float,
    gamma: float,
    rng: np.random.Generator,
    f_max: float | None = None,
) -> tuple[FloatArray, float]:
    """Algorithm 2 (DP-LSL): (theta + eta, sigma_X) with eta ~ N(0, sigma_X^2 I)."""
    theta = lsl_fit(batch, phi, rho, lam=lam)
    sigma = lsl_sigma(
        batch.counts,
        phi,
        rho,
        m=batch.m,
        lam=lam,
        epsilon=epsilon,
        delta=delta,
        r_max=r_max,
        gamma=gamma,
        f_max=f_max,
    )
    return theta + sigma * rng.standard_normal(theta.shape), sigma


# ----------------------------------------------------------------------------- experiment
def lambda_schedule(m: int, phi: FloatArray, rho: FloatArray) -> float:
    """lambda = ||Phi||^2 ||rho||_inf (1 + sqrt(m)): proportional to sqrt(m), as BGP16 Section 6
    recommends, and always above the floor DP-LSL needs."""
    return float(np.linalg.norm(phi, 2)) ** 2 * float(np.max(rho)) * (1.0 + math.sqrt(m))


FULL_SIZES = (10, 30, 100, 300, 1000, 3000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
QUICK_SIZES = (10, 100, 1000)
STARTS = ("uniform", "first")


def _one_run(
    sizes: tuple[int, ...],
    run_id: int,
    epsilon: float,
    delta: float,
    f_maxes: tuple[float | None, ...],
) -> list[dict[str, object]]:
    """One run of the reproduction as the paper states it: per start distribution, size m
    and feature map, LSW and LSL and their private versions at each F_max."""
    rows: list[dict[str, object]] = []
    for start in STARTS:
        mdp = ChainMDP(start=start)
        rng = np.random.default_rng([16, run_id, STARTS.index(start)])
        v_true = mdp.true_values()
        n = mdp.n_states
        feats = {"tabular": tabular_features(n), "pairs": pairs_features(n)}
        for m in sizes:
            batch = mdp.sample(m, rng)
            for fname, phi in feats.items():
                base = {"start": start, "features": fname, "d": phi.shape[1], "m": m}
                rows += _cell_rows(
                    mdp, batch, phi, v_true, rng, {**base, "run": run_id}, epsilon, delta, f_maxes
                )
    return rows


def _cell_rows(
    mdp: ChainMDP,
    batch: Batch,
    phi: FloatArray,
    v_true: FloatArray,
    rng: np.random.Generator,
    base: dict[str, object],
    epsilon: float,
    delta: float,
    f_maxes: tuple[float | None, ...],
) -> list[dict[str, object]]:
    """The rows of one (start, m, features) cell: LSW and LSL, then DP-LSW and DP-LSL at each
    F_max (their noise drawn from ``rng``)."""
    n = mdp.n_states
    w = np.ones(n)
    rho = np.ones(n)
    lam = lambda_schedule(batch.m, phi, rho)
    th_w = lsw_fit(batch, phi, w)
    th_l = lsl_fit(batch, phi, rho, lam=lam)

    def rmse(theta: FloatArray) -> float:
        return float(np.sqrt(np.mean((phi @ theta - v_true) ** 2)))

    base = {**base, "lambda": lam, "epsilon": epsilon, "delta": delta}
    rows: list[dict[str, object]] = [
        {**base, "method": "LSW", "f_max": "", "sigma_x": 0.0, "rmse": rmse(th_w)},
        {**base, "method": "LSL", "f_max": "", "sigma_x": 0.0, "rmse": rmse(th_l)},
    ]
    for f_max in f_maxes:
        f_label = "R_max/(1-gamma)" if f_max is None else f"{f_max:g}"
        s_w = lsw_sigma(
            batch.counts, phi, w, epsilon=epsilon, delta=delta, r_max=mdp.r_max, gamma=mdp.gamma,
            f_max=f_max,
        )  # fmt: skip
        s_l = lsl_sigma(
            batch.counts, phi, rho, m=batch.m, lam=lam, epsilon=epsilon, delta=delta,
            r_max=mdp.r_max, gamma=mdp.gamma, f_max=f_max,
        )  # fmt: skip
        eta = rng.standard_normal((2, phi.shape[1]))
        rows.append(
            {**base, "method": "DP-LSW", "f_max": f_label, "sigma_x": s_w,
             "rmse": rmse(th_w + s_w * eta[0])}
        )  # fmt: skip
        rows.append(
            {**base, "method": "DP-LSL", "f_max": f_label, "sigma_x": s_l,
             "rmse": rmse(th_l + s_l * eta[1])}
        )  # fmt: skip
    return rows


FIELDS = [
    "start",
    "features",
    "d",
    "method",
    "f_max",
    "m",
    "run",
    "lambda",
    "epsilon",
    "delta",
    "sigma_x",
    "rmse",
]


def run(
    *,
    out: Path,
    quick: bool = False,
    seeds: int | None = None,
    epsilon: float = 0.1,
    delta: float = 0.1,
    workers: int = 1,
) -> dict[str, Path]:
    """RMSE against batch size on the chain (N = 40, p = 0.5, gamma = 0.99, eps = delta = 0.1),
    20 runs, tabular and pairs-aggregated features, both start distributions, DP noise with
    F_max as written (R_max/(1-gamma) = 100) and with F_max = 1 (the public bound on this
    chain's returns). Writes bgp16.csv and bgp16.png."""
    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments import plotting

    out.mkdir(parents=True, exist_ok=True)
    sizes = QUICK_SIZES if quick else FULL_SIZES
    n_runs = seeds if seeds is not None else (3 if quick else 20)
    f_maxes: tuple[float | None, ...] = (None, 1.0)
    jobs = [(sizes, r, epsilon, delta, f_maxes) for r in range(n_runs)]
    rows = [
        row
        for part in progress_map(_one_run, jobs, workers=workers, desc="bgp16 runs")
        for row in part
    ]
    csv_path = write_csv(out / "bgp16.csv", rows, FIELDS)
    png = plotting.plot_bgp16(
        rows,
        out / "bgp16.png",
        title=f"BGP16 chain MDP: N=40, p=0.5, gamma=0.99, eps={epsilon:g}, delta={delta:g}; "
        f"{n_runs} runs (mean +- s.e.)",
    )
    return {"csv": csv_path, "png": png}
