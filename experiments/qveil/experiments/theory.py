"""Numerical checks of Wang & Hegde (2019)'s Lemma 8, Proposition 9 and Proposition 10.

* Lemma 8: for g ~ GP(0, sigma^2 exp(-beta|x - y|)) on [0, 1], E[max g] <= 8.68 sqrt(beta) sigma
  (stated through the tail P(max g >= 8.68 sqrt(beta) sigma + u) <= exp(-u^2/2)). We measure
  E[max g] and E[max |g|] over a range of beta. Paths are drawn exactly on a grid of spacing
  h <= 1/(20 beta) (the OU process is an AR(1) chain on a grid), and the maximum between grid
  points is drawn from the Brownian-bridge law with the OU's local variance rate 2 beta sigma^2
  (exact as h -> 0; the uncorrected grid maximum is reported too, as a lower bound).
* Proposition 10: with J = 1 on a finite MDP, Algorithm 1's value is the optimal value v' of the
  rewards r + z, z ~ N(0, sigma^2) per (state, action) (Appendix D). We measure
  E[(1/n) ||v' - v*||_1] on random MDPs and compare with the stated bound
  2 sqrt(2) sigma / (sqrt(n pi)(1 - gamma)) and the bound the proof supports,
  2 sqrt(2) sigma / (sqrt(pi)(1 - gamma)) (docs/privacy.md section 4, errata).
* Proposition 9: the noised function answers N_q queries in O(N_q ln N_q). We time
  qveil.noise.OUSamplePath: seconds per new query and per repeated query against the number
  n of stored points.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
from scipy.signal import lfilter

from qveil.experiments._util import progress_map, write_csv
from qveil.json_types import JSONObject
from qveil.noise import OUSamplePath

__all__ = [
    "lemma8_bound",
    "ou_path_maxima",
    "prop10_bound",
    "prop10_loss",
    "random_mdp",
    "run",
    "time_noise_path",
    "value_iteration",
]

FloatArray = npt.NDArray[np.float64]

LEMMA8_CONSTANT = 8.68


def lemma8_bound(*, beta: float, sigma: float) -> float:
    """The paper's bound on E[max g]: 8.68 sqrt(beta) sigma."""
    return LEMMA8_CONSTANT * math.sqrt(beta) * sigma


def ou_path_maxima(
    *,
    beta: float,
    sigma: float,
    n_paths: int,
    rng: np.random.Generator,
    points_per_corr: float = 20.0,
    min_points: int = 2000,
    chunk: int = 64,
) -> dict[str, FloatArray]:
    """Per path: ``max`` and ``absmax`` of g on [0, 1] (bridge-corrected), and ``grid_max``.

    Grid: n = max(min_points, points_per_corr * beta) intervals; g_0 ~ N(0, sigma^2),
    g_{i+1} = rho g_i + sigma sqrt(1 - rho^2) z_i with rho = exp(-beta h) (exact). Between two
    grid values a, b the maximum of a Brownian bridge with variance rate s^2 = 2 beta sigma^2
    over length h is (a + b + sqrt((a - b)^2 + 2 s^2 h E)) / 2, E ~ Exp(1).
    """
    n = int(max(min_points, math.ceil(points_per_corr * beta)))
    h = 1.0 / n
    rho = math.exp(-beta * h)
    innov = sigma * math.sqrt(-math.expm1(-2.0 * beta * h))
    s2h = 2.0 * beta * sigma * sigma * h
    out = {k: np.empty(n_paths) for k in ("max", "absmax", "grid_max")}
    done = 0
    while done < n_paths:
        b = min(chunk, n_paths - done)
        g0 = sigma * rng.standard_normal(b)
        e = innov * rng.standard_normal((b, n))
        rest, _ = lfilter([1.0], [1.0, -rho], e, axis=1, zi=(rho * g0)[:, None])
        g = np.concatenate([g0[:, None], rest], axis=1)
        a, c = g[:, :-1], g[:, 1:]
        diff2 = (a - c) ** 2
        up = 0.5 * (a + c + np.sqrt(diff2 + 2.0 * s2h * rng.exponential(size=a.shape)))
        lo = 0.5 * (a + c - np.sqrt(diff2 + 2.0 * s2h * rng.exponential(size=a.shape)))
        mx = up.max(axis=1)
        mn = lo.min(axis=1)
        out["max"][done : done + b] = mx
        out["absmax"][done : done + b] = np.maximum(mx, -mn)
        out["grid_max"][done : done + b] = g.max(axis=1)
        done += b
    return out


def random_mdp(n: int, m: int, rng: np.random.Generator) -> tuple[FloatArray, FloatArray]:
    """Random finite MDP: P[a, s, :] ~ Dirichlet(1, ..., 1) over all n states, r[a, s] ~ U[0, 1]."""
    p = rng.dirichlet(np.ones(n), size=(m, n))
    r = rng.uniform(0.0, 1.0, size=(m, n))
    return p, r


def value_iteration(
    p: FloatArray, r: FloatArray, gamma: float, *, tol: float = 1e-10, max_iter: int = 100_000
) -> FloatArray:
    """Optimal state values v = max_a (r_a + gamma P_a v) to sup-norm accuracy ``tol``."""
    v = np.zeros(p.shape[1])
    for _ in range(max_iter):
        q = r + gamma * np.einsum("asj,j->as", p, v)
        nv = q.max(axis=0)
        if np.max(np.abs(nv - v)) < tol * (1.0 - gamma):
            return np.asarray(nv, dtype=np.float64)
        v = nv
    return v


def prop10_bound(*, sigma: float, n: int, gamma: float, with_sqrt_n: bool = True) -> float:
    """2 sqrt(2) sigma / (sqrt(n pi) (1 - gamma)); without sqrt(n) when ``with_sqrt_n`` is False."""
    nn = n if with_sqrt_n else 1
    return 2.0 * math.sqrt(2.0) * sigma / (math.sqrt(nn * math.pi) * (1.0 - gamma))


def prop10_loss(
    p: FloatArray, r: FloatArray, *, sigma: float, gamma: float, rng: np.random.Generator
) -> float:
    """(1/n) ||v' - v*||_1 for one noise draw: v' optimal for r + z, v* optimal for r."""
    v_star = value_iteration(p, r, gamma)
    v_noisy = value_iteration(p, r + sigma * rng.standard_normal(r.shape), gamma)
    return float(np.mean(np.abs(v_noisy - v_star)))


def time_noise_path(
    checkpoints: tuple[int, ...], *, queries: int, seed: int = 9
) -> list[dict[str, float]]:
    """Grow one OUSamplePath to each n in ``checkpoints`` and time ``queries`` new states and
    ``queries`` repeated states at that size (seconds per query)."""
    rng = np.random.default_rng(seed)
    path = OUSamplePath(beta=100.0, sigma=1.0, rng=np.random.default_rng(seed + 1))
    rows = []
    for n in sorted(checkpoints):
        grow = n - len(path)
        while grow > 0:
            b = min(grow, 100_000)
            path.sample(rng.random(b))
            grow = n - len(path)
        new = rng.random(queries)
        t0 = time.perf_counter()
        path.sample(new)
        t_new = (time.perf_counter() - t0) / queries
        old = new.copy()  # stored now: a repeat answers from the path's points
        t0 = time.perf_counter()
        path.sample(old)
        t_old = (time.perf_counter() - t0) / queries
        rows.append(
            {"n_stored": float(n), "sec_per_new_query": t_new, "sec_per_repeat_query": t_old}
        )
    return rows


# ----------------------------------------------------------------------------- experiment
def _lemma8_job(beta: float, n_paths: int, seed: int) -> JSONObject:
    rng = np.random.default_rng([8, seed, int(beta * 1000)])
    mx = ou_path_maxima(beta=beta, sigma=1.0, n_paths=n_paths, rng=rng)
    se = float(mx["max"].std(ddof=1) / math.sqrt(n_paths))
    bound = lemma8_bound(beta=beta, sigma=1.0)
    return {
        "beta": beta,
        "sigma": 1.0,
        "n_paths": n_paths,
        "mean_max": float(mx["max"].mean()),
        "se_max": se,
        "mean_absmax": float(mx["absmax"].mean()),
        "mean_grid_max": float(mx["grid_max"].mean()),
        "bound_8.68sqrt(beta)sigma": bound,
        "bound_over_measured": bound / mx["max"].mean(),
        "tail_P(max>=bound+1)": float(np.mean(mx["max"] >= bound + 1.0)),
        "tail_exp(-1/2)": math.exp(-0.5),
    }


def _prop10_job(
    n: int, n_mdps: int, n_noise: int, sigma: float, gamma: float, seed: int
) -> JSONObject:
    rng = np.random.default_rng([10, seed, n])
    losses = []
    for _ in range(n_mdps):
        p, r = random_mdp(n, 2, rng)
        v_star = value_iteration(p, r, gamma)
        for _ in range(n_noise):
            v_noisy = value_iteration(p, r + sigma * rng.standard_normal(r.shape), gamma)
            losses.append(float(np.mean(np.abs(v_noisy - v_star))))
    a = np.asarray(losses)
    return {
        "n_states": n,
        "actions": 2,
        "sigma": sigma,
        "gamma": gamma,
        "samples": a.size,
        "mean_loss": float(a.mean()),
        "se_loss": float(a.std(ddof=1) / math.sqrt(a.size)),
        "stated_bound": prop10_bound(sigma=sigma, n=n, gamma=gamma),
        "bound_without_sqrt_n": prop10_bound(sigma=sigma, n=n, gamma=gamma, with_sqrt_n=False),
    }


# long-function: the three theory checks top to bottom, as docs/results.md section 2 reports them
def run(
    *, out: Path, quick: bool = False, seeds: int | None = None, workers: int = 1
) -> dict[str, Path]:
    """All three checks; writes theory_lemma8.{csv,png}, theory_prop10.{csv,png},
    theory_prop9.{csv,png}."""
    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments import plotting

    out.mkdir(parents=True, exist_ok=True)
    seed = 0 if seeds is None else int(seeds)
    paths: dict[str, Path] = {}

    # Lemma 8
    betas = (
        (0.1, 1.0, 10.0, 100.0)
        if quick
        else (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 2222.0, 10000.0)
    )
    n_paths = 200 if quick else 1000
    l8 = progress_map(
        _lemma8_job, [(b, n_paths, seed) for b in betas], workers=workers, desc="Lemma 8 betas"
    )
    paths["lemma8_csv"] = write_csv(out / "theory_lemma8.csv", l8)
    bs = [r["beta"] for r in l8]
    paths["lemma8_png"] = plotting.plot_lines(
        {
            "measured E[max g]": (bs, [r["mean_max"] for r in l8]),
            "measured E[max |g|]": (bs, [r["mean_absmax"] for r in l8]),
            "Lemma 8 bound 8.68 sqrt(beta) sigma": (
                bs,
                [r["bound_8.68sqrt(beta)sigma"] for r in l8],
            ),
        },
        out / "theory_lemma8.png",
        title=f"Lemma 8: sup of an OU path on [0,1], sigma = 1, {n_paths} paths per beta",
        xlabel="beta",
        ylabel="E[max] / sigma",
        logx=True,
        logy=True,
        styles={"Lemma 8 bound 8.68 sqrt(beta) sigma": "--k"},
    )

    # Proposition 10
    ns = (4, 16, 64) if quick else (4, 16, 64, 256, 1024)
    jobs = []
    for n in ns:
        n_mdps = 3 if quick else (10 if n >= 1024 else 20)
        n_noise = 2 if quick else 5
        jobs.append((n, n_mdps, n_noise, 0.3, 0.9, seed))
    p10 = progress_map(_prop10_job, jobs, workers=workers, desc="Prop 10 MDP sizes")
    paths["prop10_csv"] = write_csv(out / "theory_prop10.csv", p10)
    xs = [r["n_states"] for r in p10]
    paths["prop10_png"] = plotting.plot_lines(
        {
            "measured E[(1/n)||v'-v*||_1]": (xs, [r["mean_loss"] for r in p10]),
            "stated bound 2sqrt2 sigma/(sqrt(n pi)(1-gamma))": (
                xs,
                [r["stated_bound"] for r in p10],
            ),
            "bound without sqrt(n)": (xs, [r["bound_without_sqrt_n"] for r in p10]),
        },
        out / "theory_prop10.png",
        title="Proposition 10: random MDPs (2 actions, Dirichlet(1) rows, r~U[0,1]), "
        "sigma=0.3, gamma=0.9",
        xlabel="number of states n",
        ylabel="utility loss",
        logx=True,
        logy=True,
        styles={
            "stated bound 2sqrt2 sigma/(sqrt(n pi)(1-gamma))": "--r",
            "bound without sqrt(n)": "--k",
        },
    )

    # Proposition 9
    checkpoints = (100, 1000, 10_000) if quick else (100, 1000, 10_000, 100_000, 1_000_000)
    p9 = time_noise_path(checkpoints, queries=500 if quick else 2000)
    paths["prop9_csv"] = write_csv(out / "theory_prop9.csv", p9)
    xs9 = [r["n_stored"] for r in p9]
    paths["prop9_png"] = plotting.plot_lines(
        {
            "new state (exact conditional draw)": (xs9, [1e6 * r["sec_per_new_query"] for r in p9]),
            "stored state (lookup)": (xs9, [1e6 * r["sec_per_repeat_query"] for r in p9]),
        },
        out / "theory_prop9.png",
        title="Proposition 9: qveil.noise.OUSamplePath time per query",
        xlabel="points stored n",
        ylabel="microseconds per query",
        logx=True,
    )
    return paths
