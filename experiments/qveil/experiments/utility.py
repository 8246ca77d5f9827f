"""``qveil experiments utility``: what the rigorous `fqi` release is worth, measured as served.

**LineWalk control** (docs/results.md section 7). For each seed and number of users N, N
LineWalk users are collected (one random-policy episode each, :func:`qveil.trainer.collect.
collect` with that seed) and the release ``qveil train --mode fqi`` writes is fitted: the
kernel estimator with d = 1 of configs/linewalk-private.toml (:mod:`qveil.kfqi`), for each
public variant (neighbour relation, gamma; the rest from the config). sigma comes from the
kernel accountant (:func:`qveil.kfqi_config.plan_kernel`) at each eps (delta 1e-5), and the
release is evaluated exactly as the server serves it:

    f_a(x) = the served additive mean (:func:`qveil.kfqi.additive_mean`) + g_a(x),
             g_a an :class:`qveil.noise.OUSamplePath`(sigma, beta),

with g_a queried lazily at the states the episodes visit (its exact conditional sampler, of
the served noise's law), the greedy policy argmax_a f_a(x), on real LineWalk episodes
(:func:`qveil.trainer.served_eval.lockstep_returns`). The seeds (data collection, noise
generator, episodes) are the experiment's; a release's noise comes from its key, drawn from
OS entropy.
Beside it: non-private FQI (the same estimator with the pooled averager, no noise: the
ceiling), the uniformly random policy (the floor), and Algorithm 1's ``paper``, ``gdp`` and
``output`` modes at the same eps (:mod:`qveil.experiments.fig2`'s machinery, each by its own
accountant; a point whose accountant finds no guarantee is labelled so).

**Chain policy evaluation** (BGP16's chain MDP, :mod:`qveil.experiments.chain_mdp`): fitted Q
evaluation of the chain's fixed policy with the same private machinery, against DP-LSW and
DP-LSL at the same (eps, delta) and number of users m; see
:mod:`qveil.experiments.chain_fqe`.

Pure numpy except the evaluation (Gymnasium) and Algorithm 1 (torch, imported in its runs).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from qveil.additive import StateBox
from qveil.experiments import plotting
from qveil.experiments._util import mean_se, progress_map, write_csv
from qveil.experiments.chain_fqe import (
    CHAIN_FIELDS,
    CHAIN_SIZES_FULL,
    CHAIN_SIZES_QUICK,
    chain_job,
    summarise_chain,
)
from qveil.fqi_config import REFUSE_RATIO
from qveil.json_types import JSONObject
from qveil.kfqi import KernelFQIResult, additive_mean, fitted_q_nd, krr_result
from qveil.kfqi_config import load_fqi_config, plan_kernel
from qveil.noise import OUSamplePath

__all__ = ["KERNEL_VARIANT", "Variant", "linewalk_job", "run"]

FloatArray = npt.NDArray[np.float64]

ENV_ID = "qveil/LineWalk-v0"
PRIVATE_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "linewalk-private.toml"
ALG1_CONFIG = Path(__file__).resolve().parents[3] / "configs" / "linewalk-quick.toml"
DELTA = 1e-5

USERS_FULL = (30, 100, 300, 1000, 3000)
USERS_QUICK = (30, 300)
EPS_FULL = (0.25, 0.5, 1.0, 2.0, 4.0)
EPS_QUICK = (1.0, 4.0)
GAMMAS = (0.3, 0.5, 0.9)
ALG1_MODES = ("paper", "gdp", "output")
#: Seeds of the (slow, torch) Algorithm 1 runs in the full experiment.
ALG1_SEEDS = 3
#: Episodes each release is scored on (per seed).
EPISODES_FULL = 100
EPISODES_QUICK = 30
#: Environment seeds of the evaluation episodes start here (collection uses the seed itself).
EVAL_SEED0 = 1_000_000


@dataclass(frozen=True)
class Variant:
    """One public configuration of the release (everything else: PRIVATE_CONFIG)."""

    relation: str
    gamma: float

    @property
    def name(self) -> str:
        return f"fqi {self.relation} g={self.gamma:g} kernel d=1"


#: The variant of the served configuration (configs/linewalk-private.toml).
KERNEL_VARIANT = Variant("user", 0.3).name


def _variants(quick: bool) -> tuple[Variant, ...]:
    if quick:
        return (Variant("user", 0.3), Variant("reward", 0.5))
    return tuple(Variant(rel, g) for rel in ("user", "reward") for g in GAMMAS)


# ----------------------------------------------------------------------------- evaluation
def _served_returns(
    fit: KernelFQIResult,
    box: StateBox,
    *,
    sigma: float,
    noise_seed: Sequence[int] | None,
    episodes: int,
    env_seed: int,
) -> list[float]:
    """Returns of argmax_a [served additive mean + g_a] on LineWalk, g_a drawn lazily at the
    visited states by seeded exact OU paths in process (no noise when ``noise_seed`` is None)."""
    # the trainer's modules load gymnasium: only when this runs
    from qveil.trainer.served_eval import lockstep_returns

    paths = (
        [
            OUSamplePath(
                sigma=sigma, beta=fit.betas[0], rng=np.random.default_rng([*noise_seed, act])
            )
            for act in range(2)
        ]
        if noise_seed is not None
        else []
    )

    def policy(states: FloatArray) -> npt.NDArray[np.int64]:
        x = box.to_unit(states[:, :1])
        f = additive_mean(
            x, alpha=fit.alpha, centre=fit.centre, inducing=fit.inducing, betas=fit.betas
        )
        if paths:
            f = f + np.stack([np.asarray(p.sample(x[:, 0])) for p in paths], axis=1)
        return np.asarray(np.argmax(f, axis=1), dtype=np.int64)

    return lockstep_returns(ENV_ID, policy, episodes=episodes, seed=env_seed, env_kwargs={})


def _random_returns(
    n_actions: int, *, seed: Sequence[int], episodes: int, env_seed: int
) -> list[float]:
    # the trainer's modules load gymnasium: only when this runs
    from qveil.trainer.served_eval import lockstep_returns

    rng = np.random.default_rng(list(seed))

    def policy(states: FloatArray) -> npt.NDArray[np.int64]:
        return rng.integers(0, n_actions, size=len(states)).astype(np.int64)

    return lockstep_returns(ENV_ID, policy, episodes=episodes, seed=env_seed, env_kwargs={})


# long-function: one job of the utility experiment (fit, release, evaluate), as docs/results.md
#   section 7 describes it
def linewalk_job(
    seed: int,
    users: int,
    variants: tuple[Variant, ...],
    epsilons: tuple[float, ...],
    episodes: int,
) -> list[JSONObject]:
    """Every fqi variant at every eps, non-private FQI per gamma and random, for one
    (seed, N): one dataset, one set of evaluation episodes."""
    # the trainer's modules load gymnasium: only when this runs
    from qveil.trainer.collect import collect

    base = load_fqi_config(PRIVATE_CONFIG).replace(delta=DELTA)
    rr = base.reward_range or (0.0, 0.5)
    box = StateBox.of(base.state_intervals or [[0.0, 1.0]])
    t0 = time.perf_counter()
    ds = collect(ENV_ID, users, seed, progress=False)
    env_seed = EVAL_SEED0 + 1000 * seed
    fits: dict[tuple[str, float], KernelFQIResult] = {}

    def fit(relation: str, gamma: float) -> KernelFQIResult:
        if (relation, gamma) not in fits:
            spec = base.replace(neighbour=relation, gamma=gamma).spec(1)
            q = fitted_q_nd(
                ds.transitions,
                n_actions=2, reward_range=rr, box=box, spec=spec,
            )  # fmt: skip
            fits[relation, gamma] = krr_result(q, spec=spec, reward_range=rr)
        return fits[relation, gamma]

    common = {"users": users, "seed": seed, "delta": DELTA, "episodes": episodes}
    rows: list[JSONObject] = []
    rnd = _random_returns(2, seed=[seed, users, 5], episodes=episodes, env_seed=env_seed)
    rows.append({**common, "method": "random", "return": float(np.mean(rnd)), "holds": ""})
    for g in sorted({v.gamma for v in variants}):
        ret = _served_returns(
            fit("reward", g), box, sigma=0.0, noise_seed=None, episodes=episodes, env_seed=env_seed
        )
        rows.append(
            {
                **common,
                "method": "non-private FQI",
                "relation": "none",
                "gamma": g,
                "smoother": "",
                "return": float(np.mean(ret)),
                "holds": False,
            }
        )
    for vi, v in enumerate(variants):
        for ei, eps in enumerate(epsilons):
            cfg = base.replace(neighbour=v.relation, gamma=v.gamma, epsilon=eps, sigma=None)
            res = plan_kernel(cfg, users=users, actions=2, dims=1, reward_range=rr)
            ret = _served_returns(
                fit(v.relation, v.gamma),
                box,
                sigma=res.sigma,
                noise_seed=[seed, users, vi, ei, 7],
                episodes=episodes,
                env_seed=env_seed,
            )
            rows.append(
                {
                    **common, "method": "fqi", "variant": v.name, "relation": v.relation,
                    "gamma": v.gamma, "smoother": "", "epsilon": eps,
                    "return": float(np.mean(ret)), "sigma": res.sigma, "beta": res.beta,
                    "kappa": res.kappa, "sup_sensitivity": res.sup_sensitivity,
                    "sensitivity": res.sensitivity, "noise_to_value": res.noise_to_value,
                    "holds": bool(res.holds),
                    "refused_without_force": bool(res.noise_to_value > REFUSE_RATIO),
                }
            )  # fmt: skip
    dt = time.perf_counter() - t0
    for row in rows:
        row["job_seconds"] = round(dt, 2)
    return rows


def alg1_job(mode: str, eps: float, seed: int, quick: bool, episodes: int) -> JSONObject:
    """One Algorithm 1 run (fig2's machinery) at eps, delta 1e-5, its own accountant."""
    # fig2 and linewalk load torch: only for Algorithm 1's runs
    from qveil.experiments.fig2 import QUICK_CHANGES, method_spec
    from qveil.experiments.linewalk import load_cfg, run_spec

    config = None if quick else str(ALG1_CONFIG)
    changes: JSONObject = dict(QUICK_CHANGES) if quick else {}
    cfg = load_cfg(config, **changes)
    spec, priv = method_spec(
        mode, epsilon=eps, delta=DELTA, cfg=cfg, config=config, changes=changes
    )
    res = run_spec({**spec, "seed": seed, "eval_episodes": episodes, "privacy": priv})
    return {
        "method": f"alg1 {mode}",
        "variant": "configs/linewalk.toml (quick changes)"
        if quick
        else "configs/linewalk-quick.toml",
        "relation": f"reward functions within Delta_r = {cfg.reward_sensitivity:g}",
        "gamma": cfg.gamma,
        "epsilon": eps,
        "delta": DELTA,
        "seed": seed,
        "episodes": episodes,
        "return": float(res["release_return"]),
        "sigma": float(priv["noise"]),
        "holds": bool(priv["holds"]),
        "reason": priv.get("reason") or "",
        "job_seconds": round(float(res["seconds"]), 2),
    }


# ----------------------------------------------------------------------------- summaries
SUMMARY_KEYS = ("method", "variant", "relation", "gamma", "smoother", "users", "epsilon")
SUMMARY_FIELDS = [
    *SUMMARY_KEYS,
    "delta",
    "seeds",
    "return_mean",
    "return_se",
    "sigma",
    "noise_to_value",
    "holds",
    "refused_without_force",
    "reason",
]


def summarise(rows: Sequence[JSONObject]) -> list[JSONObject]:
    """Mean and standard error of the return over seeds, per (method, variant, N, eps)."""
    groups: dict[tuple[Hashable, ...], list[JSONObject]] = defaultdict(list)
    for r in rows:
        groups[tuple(r.get(k, "") for k in SUMMARY_KEYS)].append(r)
    out = []
    for key, rs in groups.items():
        mean, se = mean_se([float(r["return"]) for r in rs])
        first = rs[0]
        out.append(
            {
                **dict(zip(SUMMARY_KEYS, key, strict=True)),
                "delta": first.get("delta", ""),
                "seeds": len(rs),
                "return_mean": mean,
                "return_se": se,
                "sigma": first.get("sigma", ""),
                "noise_to_value": first.get("noise_to_value", ""),
                "holds": first.get("holds", ""),
                "refused_without_force": first.get("refused_without_force", ""),
                "reason": first.get("reason", ""),
            }
        )
    return out


def _pm(row: JSONObject | None) -> str:
    if row is None:
        return "-"
    s = f"{row['return_mean']:.1f} +- {row['return_se']:.1f}"
    if row.get("method") == "fqi" and _truthy(row.get("refused_without_force")):
        s += " (r)"
    if row.get("method", "").startswith("alg1") and not _truthy(row.get("holds")):
        s += " (no guarantee)"
    return s


def _truthy(v: object) -> bool:
    return v is True or str(v).lower() == "true"


def markdown_tables(summary: Sequence[JSONObject], chain: Sequence[JSONObject]) -> str:
    """The tables docs/results.md shows: fqi return (mean +- s.e.) by variant and N at each
    eps, the references, Algorithm 1's modes, and the chain RMSE at each m."""
    lines: list[str] = []
    fqi = [r for r in summary if r["method"] == "fqi"]
    users = sorted({int(r["users"]) for r in fqi})
    eps_list = sorted({float(r["epsilon"]) for r in fqi})
    variants = list(dict.fromkeys(str(r["variant"]) for r in fqi))
    idx = {(str(r["variant"]), int(r["users"]), float(r["epsilon"])): r for r in fqi}
    head = "| variant | eps | " + " | ".join(f"N = {n}" for n in users) + " |"
    lines += [head, "|" + "---|" * (2 + len(users))]
    for v in variants:
        for e in eps_list:
            cells = [_pm(idx.get((v, n, e))) for n in users]
            lines.append(f"| {v} | {e:g} | " + " | ".join(cells) + " |")
    refs = [r for r in summary if r["method"] in ("non-private FQI", "random")]
    for r0 in sorted({(r["method"], str(r["gamma"])) for r in refs}):
        byn = {int(r["users"]): r for r in refs if (r["method"], str(r["gamma"])) == r0}
        name = r0[0] if r0[0] == "random" else f"{r0[0]} g={float(r0[1]):g}"
        lines.append(f"| {name} | - | " + " | ".join(_pm(byn.get(n)) for n in users) + " |")
    alg = [r for r in summary if str(r["method"]).startswith("alg1")]
    if alg:
        lines += ["", "| Algorithm 1 mode | " + " | ".join(f"eps {e:g}" for e in eps_list) + " |"]
        lines.append("|" + "---|" * (1 + len(eps_list)))
        for mode in dict.fromkeys(str(r["method"]) for r in alg):
            bye = {float(r["epsilon"]): r for r in alg if r["method"] == mode}
            cells = []
            for e in eps_list:
                r = bye.get(e)
                cells.append("-" if r is None else f"{_pm(r)}; sigma {float(r['sigma']):.3g}")
            lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    if chain:
        lines.append("")
        ms = sorted({int(r["m"]) for r in chain})
        lines += ["| start | method | eps, delta | " + " | ".join(f"m = {m}" for m in ms) + " |"]
        lines.append("|" + "---|" * (3 + len(ms)))
        keys = list(
            dict.fromkeys(
                (r["start"], r["method"], str(r["f_max"]), str(r["epsilon"]), str(r["delta"]))
                for r in chain
            )
        )
        for k in keys:
            bym = {
                int(r["m"]): r
                for r in chain
                if (r["start"], r["method"], str(r["f_max"]), str(r["epsilon"]), str(r["delta"]))
                == k
            }
            name = k[1] + (f" (F_max {k[2]})" if k[2] and k[1].startswith("DP-LS") else "")
            ed = "-" if not k[3] else f"{float(k[3]):g}, {float(k[4]):g}"
            cells = ["-" if m not in bym else f"{bym[m]['rmse_mean']:.3g}" for m in ms]
            lines.append(f"| {k[0]} | {name} | {ed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- run
def run(
    *,
    out: Path,
    quick: bool = False,
    seeds: int | None = None,
    workers: int = 1,
) -> dict[str, Path]:
    """The LineWalk table and plot, Algorithm 1's modes, and the chain variant (see the
    module docstring). Writes utility_runs.csv, utility.csv, utility.md, utility.png,
    utility_chain.csv, utility_chain_runs.csv and utility_chain.png into ``out``."""

    out.mkdir(parents=True, exist_ok=True)
    n_seeds = seeds if seeds is not None else (2 if quick else 10)
    users = USERS_QUICK if quick else USERS_FULL
    epsilons = EPS_QUICK if quick else EPS_FULL
    variants = _variants(quick)
    episodes = EPISODES_QUICK if quick else EPISODES_FULL
    # biggest jobs first, so that the pool's tail is short
    jobs: list[tuple[object, ...]] = [
        (s, n, variants, epsilons, episodes)
        for n in sorted(users, reverse=True)
        for s in range(n_seeds)
    ]
    rows = [
        r
        for part in progress_map(linewalk_job, jobs, workers=workers, desc="utility: fqi")
        for r in part
    ]
    alg1_eps = (1.0,) if quick else epsilons
    alg1_seeds = 1 if quick else min(n_seeds, ALG1_SEEDS)
    a_jobs = [
        (mode, e, 200 + s, quick, 20)
        for e in alg1_eps
        for mode in ALG1_MODES
        for s in range(alg1_seeds)
    ]
    rows += progress_map(alg1_job, a_jobs, workers=workers, desc="utility: Algorithm 1")
    summary = summarise(rows)
    paths = {
        "runs_csv": write_csv(out / "utility_runs.csv", rows),
        "csv": write_csv(out / "utility.csv", summary, SUMMARY_FIELDS),
    }
    sizes = CHAIN_SIZES_QUICK if quick else CHAIN_SIZES_FULL
    c_runs = 2 if quick else 20
    crows = [
        r
        for part in progress_map(
            chain_job, [(sizes, i) for i in range(c_runs)], workers=workers, desc="utility: chain"
        )
        for r in part
    ]
    chain = summarise_chain(crows)
    paths["chain_runs_csv"] = write_csv(out / "utility_chain_runs.csv", crows)
    paths["chain_csv"] = write_csv(out / "utility_chain.csv", chain, CHAIN_FIELDS)
    md = out / "utility.md"
    md.write_text(markdown_tables(summary, chain))
    paths["md"] = md
    paths["png"] = plotting.plot_utility(
        summary,
        out / "utility.png",
        title=f"fqi release on LineWalk, served (OU noise at visited states), delta {DELTA:g}; "
        f"{n_seeds} seeds x {episodes} episodes (mean +- s.e.)",
    )
    paths["chain_png"] = plotting.plot_utility_chain(
        chain,
        out / "utility_chain.png",
        title=f"BGP16 chain (N=40, p=0.5, gamma=0.99): private FQE vs DP-LSW/DP-LSL, tabular; "
        f"{c_runs} runs (mean +- s.e.)",
    )
    return paths
