"""Figure 2 of Wang & Hegde (2019): every method at a target epsilon, each by its own accountant.

Targets eps = 0.9 and 0.45, delta = 1e-4, on LineWalk with the paper's settings
(configs/linewalk.toml). Methods and their noise:

* non-private DQN: Algorithm 1's code path with sigma = 0 (no guarantee; reference);
* Algorithm 1 at the paper's sigma (0.32 for eps 0.9, 0.74 for 0.45) with the paper's k = 23
  and beta = 2222: "paper's parameters; guarantee not reproduced" (qveil.privacy says what
  those parameters actually give);
* Algorithm 1 at the sigma each qveil accounting mode needs: ``paper`` (Theorem 5 as stated)
  and ``gdp`` (exact GDP composition of the same per-step sensitivity), both with k chosen by
  the accountant (calibrate_k) so that the Lemma 8 condition holds, and ``output`` (one GP
  mechanism at release on the clamped Lipschitz network; training noise-free);
* DP-SGD and input perturbation (:mod:`qveil.experiments.baselines`, exact GDP accounting).

Besides the two target points: the released function's return against eps over a wide
range (0.1 .. 100) per method, and against the reward sensitivity Delta_r (the scale of
"neighbouring") at eps = 0.9 (docs/privacy.md section 1). On LineWalk the rewards lie in
[0, 0.5], so with Delta_r = 1 ANY two reward functions are neighbours.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qveil.experiments._util import progress_map, write_csv
from qveil.experiments.fig1 import aggregate_curves
from qveil.experiments.linewalk import load_cfg, privacy_row, reference_returns, run_spec
from qveil.json_types import JSONObject
from qveil.privacy.accountant import theorem5_beta

if TYPE_CHECKING:  # for annotations only: loads gymnasium and matplotlib
    from qveil.experiments.baselines import BaselinePrivacy
    from qveil.experiments.plotting import Curve
    from qveil.trainer.config import TrainConfig

__all__ = ["METHODS", "PAPER_SIGMA", "method_spec", "run"]

PAPER_SIGMA = {0.9: 0.32, 0.45: 0.74}
"""Appendix E.3's sigma for each target epsilon (the paper's claim, not reproduced)."""

METHODS = ("non-private", "paper-sigma", "paper", "gdp", "output", "dp-sgd", "input")
LABELS = {
    "non-private": "non-private DQN (sigma=0)",
    "paper-sigma": "Alg.1 paper's sigma (paper's parameters; guarantee not reproduced)",
    "paper": "Alg.1 qveil paper mode",
    "gdp": "Alg.1 qveil gdp mode",
    "output": "Alg.1 qveil output mode",
    "dp-sgd": "DP-SGD (no amplification)",
    "input": "input perturbation",
}
SWEEP_METHODS = ("paper", "gdp", "output", "dp-sgd", "input")
QUICK_CHANGES = {"samples": 320, "resets": 5}  # 5 iterations of B = 64
DPSGD_CLIP = 1.0


def _baseline_row(p: BaselinePrivacy) -> JSONObject:
    """The privacy columns of a baseline calibrated by its own accountant (always holds)."""
    return {
        "epsilon": p.epsilon,
        "delta_total": p.delta,
        "holds": True,
        "noise": p.noise_std,
        "basis": p.basis,
        "reason": None,
        "mu": p.mu,
    }


# long-function: a table of the figure's methods, one branch per method
def method_spec(
    method: str,
    *,
    epsilon: float,
    delta: float,
    cfg: TrainConfig,
    config: str | None,
    changes: JSONObject,
    reward_sensitivity: float = 1.0,
) -> tuple[JSONObject, JSONObject]:
    """(spec for run_spec without the seed, privacy summary) for one method at a target."""
    # here, not at the top: loads gymnasium only when this runs
    from qveil.experiments.baselines import dpsgd_calibrate, input_perturbation_calibrate

    base: JSONObject = {
        "config": config,
        "config_changes": dict(changes),
        "label": LABELS[method],
        "key": method,
        "target_epsilon": epsilon,
    }
    rs = reward_sensitivity
    if method == "non-private":
        spec = {**base, "method": "alg1", "train_sigma": 0.0, "train_beta": 1.0}
        return spec, {
            "epsilon": math.inf,
            "delta_total": 0.0,
            "holds": False,
            "noise": 0.0,
            "basis": "no privacy",
            "reason": "sigma = 0",
        }
    if method == "paper-sigma":
        sigma = PAPER_SIGMA.get(round(epsilon, 4))
        if sigma is None:
            raise ValueError(f"the paper gives sigma only for eps in {sorted(PAPER_SIGMA)}")
        beta = theorem5_beta(lr=cfg.lr, k=cfg.k, batch_size=cfg.batch_size)
        pr, _ = privacy_row(cfg.replace(mode="paper", sigma=sigma, reward_sensitivity=rs))
        spec = {**base, "method": "alg1", "train_sigma": sigma, "train_beta": beta}
        return spec, {
            "epsilon": pr["epsilon"],
            "delta_total": pr["delta_total"],
            "holds": pr["holds"],
            "noise": sigma,
            "basis": pr["basis"],
            "reason": pr["reason"],
            "k": pr["k"],
            "beta": beta,
        }
    if method in ("paper", "gdp", "output"):
        c = cfg.replace(
            mode=method, epsilon=epsilon, delta=delta, reward_sensitivity=rs, calibrate_k=True
        )
        pr, eff = privacy_row(c)
        ch = dict(changes)
        if method != "output":
            ch["k"] = eff.k
        if method == "output":
            spec = {
                **base,
                "config_changes": ch,
                "method": "alg1",
                "train_sigma": 0.0,
                "train_beta": float(pr["beta"]),
                "release_sigma": float(pr["sigma"]),
                "release_beta": float(pr["beta"]),
                "q_bound": cfg.reward_bound / (1.0 - cfg.gamma),
            }
        else:
            spec = {
                **base,
                "config_changes": ch,
                "method": "alg1",
                "train_sigma": float(pr["sigma"]),
                "train_beta": float(pr["beta"]),
            }
        return spec, {
            "epsilon": pr["epsilon"],
            "delta_total": pr["delta_total"],
            "holds": pr["holds"],
            "noise": pr["sigma"],
            "basis": pr["basis"],
            "reason": pr["reason"],
            "k": pr["k"],
            "beta": pr["beta"],
        }
    if method == "dp-sgd":
        p = dpsgd_calibrate(
            epsilon=epsilon,
            delta=delta,
            batch_size=cfg.batch_size,
            clip=DPSGD_CLIP,
            steps=cfg.planned_updates,
        )
        spec = {**base, "method": "dpsgd", "clip": DPSGD_CLIP, "noise_std": p.noise_std}
        return spec, _baseline_row(p)
    if method == "input":
        p = input_perturbation_calibrate(
            epsilon=epsilon, delta=delta, samples=cfg.samples, reward_sensitivity=rs
        )
        spec = {**base, "method": "input", "noise_std": p.noise_std}
        return spec, _baseline_row(p)
    raise ValueError(f"unknown method {method!r}")


def _summarise(results: list[JSONObject], keys: tuple[str, ...]) -> list[JSONObject]:
    groups: dict[tuple[Hashable, ...], list[JSONObject]] = defaultdict(list)
    for r in results:
        groups[tuple(r[k] for k in keys)].append(r)
    rows = []
    for gk, runs in groups.items():
        rel = [r["release_return"] for r in runs]
        fin = [r["final_train_return"] for r in runs]
        first = runs[0]
        row = dict(zip(keys, gk, strict=True))
        row.update(
            {
                "label": first["label"],
                "seeds": len(runs),
                "release_return_mean": float(np.mean(rel)),
                "release_return_sd": float(np.std(rel)),
                "final_train_return_mean": float(np.mean(fin)),
                "final_train_return_sd": float(np.std(fin)),
            }
        )
        row.update({f"privacy_{k}": v for k, v in first["privacy"].items()})
        rows.append(row)
    return rows


# long-function: one figure's experiment top to bottom, in the order its caption describes
def run(
    *,
    out: Path,
    quick: bool = False,
    seeds: int | None = None,
    workers: int = 1,
    config: str | Path | None = None,
    delta: float = 1e-4,
) -> dict[str, Path]:
    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments import plotting

    out.mkdir(parents=True, exist_ok=True)
    changes: JSONObject = dict(QUICK_CHANGES) if quick else {}
    cfg = load_cfg(config, **changes)
    cfg_path = str(config) if config else None
    n_seeds = seeds if seeds is not None else (1 if quick else 10)
    n_sweep = 1 if quick else max(1, min(5, n_seeds))
    eval_eps = 3 if quick else 20

    jobs: list[JSONObject] = []
    # (A) the two target points
    for eps in (0.9, 0.45):
        for method in METHODS:
            if method == "non-private" and eps != 0.9:
                continue  # one set of non-private runs serves both panels
            spec, priv = method_spec(
                method, epsilon=eps, delta=delta, cfg=cfg, config=cfg_path, changes=changes
            )
            for s in range(n_seeds):
                jobs.append(
                    {
                        **spec,
                        "part": "targets",
                        "eps": eps,
                        "reward_sensitivity": 1.0,
                        "seed": s,
                        "eval_episodes": eval_eps,
                        "privacy": priv,
                    }
                )
    # (B) return against epsilon; (C) against the reward sensitivity at eps = 0.9
    sweep_eps = (0.45, 100.0) if quick else (0.1, 0.45, 0.9, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
    sens = (0.01,) if quick else (1.0, 0.1, 0.01, 0.001)
    for part, grid in (
        ("eps_sweep", [(e, 1.0) for e in sweep_eps]),
        ("sensitivity", [(0.9, r) for r in sens]),
    ):
        for eps, rs in grid:
            for method in SWEEP_METHODS:
                spec, priv = method_spec(
                    method,
                    epsilon=eps,
                    delta=delta,
                    cfg=cfg,
                    config=cfg_path,
                    changes=changes,
                    reward_sensitivity=rs,
                )
                for s in range(n_sweep):
                    jobs.append(
                        {
                            **spec,
                            "part": part,
                            "eps": eps,
                            "reward_sensitivity": rs,
                            "seed": 100 + s,
                            "eval_episodes": eval_eps,
                            "privacy": priv,
                        }
                    )
    results = progress_map(run_spec, [(j,) for j in jobs], workers=workers, desc="fig2 runs")

    run_rows = [
        {k: v for k, v in r.items() if k not in ("curve", "privacy", "config_changes")}
        | {f"privacy_{k}": v for k, v in r["privacy"].items()}
        for r in results
    ]
    paths = {"runs_csv": write_csv(out / "fig2_runs.csv", run_rows)}
    targets = [r for r in results if r["part"] == "targets"]
    summ = _summarise(targets, ("key", "eps"))
    nonpriv = [row for row in summ if row["key"] == "non-private"]
    for row in nonpriv:  # the same non-private runs serve the eps = 0.45 panel
        summ.append({**row, "eps": 0.45})
    paths["summary_csv"] = write_csv(out / "fig2_summary.csv", summ)
    ref = reference_returns(cfg)
    paths["png"] = _plot_targets(summ, out / "fig2.png", ref=ref, n_seeds=n_seeds, cfg=cfg)

    curve_panels: dict[str, dict[str, Curve]] = {}
    for eps in (0.9, 0.45):
        panel: dict[str, Curve] = {}
        for key in METHODS:
            runs = [
                r for r in targets if r["key"] == key and (r["eps"] == eps or key == "non-private")
            ]
            if runs:
                panel[LABELS[key]] = aggregate_curves(runs)
        curve_panels[f"target eps = {eps}, delta = {delta:g}"] = panel
    paths["curves_png"] = plotting.plot_curves(
        curve_panels,
        out / "fig2_curves.png",
        title="Fig. 2: training-episode returns on LineWalk (mean +- sd over seeds); output "
        "mode trains without noise, so its curve is the non-private one",
        xlabel="samples",
        ylabel="training episode return",
    )

    np_mean = float(np.mean([row["release_return_mean"] for row in nonpriv]))
    for part, xkey, fname, _xlabel in SWEEPS:
        rows = _summarise([r for r in results if r["part"] == part], ("key", xkey))
        paths[f"{part}_csv"] = write_csv(out / f"{fname}.csv", rows)
        paths[f"{part}_png"] = plot_sweep(
            rows,
            out / f"{fname}.png",
            part=part,
            ref=ref,
            non_private=np_mean,
            delta=delta,
            seeds=n_sweep,
        )
    return paths


SWEEPS = (
    ("eps_sweep", "eps", "fig2_eps_sweep", "target epsilon"),
    (
        "sensitivity",
        "reward_sensitivity",
        "fig2_sensitivity",
        "reward sensitivity Delta_r (eps = 0.9)",
    ),
)


def _truthy(v: object) -> bool:
    return v is True or str(v) == "True"


def plot_sweep(
    rows: list[JSONObject],
    path: Path,
    *,
    part: str,
    ref: dict[str, float],
    non_private: float,
    delta: float,
    seeds: int,
) -> Path:
    """Released return against eps (or Delta_r) per method, mean +- sd; points where the
    accountant gives no guarantee (holds = false) are drawn as crosses."""
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib.pyplot as plt

    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments.plotting import save

    _, xkey, _, xlabel = next(s for s in SWEEPS if s[0] == part)
    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    for i, key in enumerate(SWEEP_METHODS):
        pts = sorted(
            (
                float(r[xkey]),
                float(r["release_return_mean"]),
                float(r["release_return_sd"]),
                _truthy(r["privacy_holds"]),
            )
            for r in rows
            if r["key"] == key
        )
        if not pts:
            continue
        x = np.array([p[0] for p in pts])
        y = np.array([p[1] for p in pts])
        sd = np.array([p[2] for p in pts])
        ok = np.array([p[3] for p in pts])
        ax.plot(x, y, "-", color=f"C{i}", lw=1.2, label=LABELS[key])
        ax.fill_between(x, y - sd, y + sd, color=f"C{i}", alpha=0.12)
        ax.plot(x[ok], y[ok], "o", color=f"C{i}", ms=4)
        ax.plot(x[~ok], y[~ok], "x", color=f"C{i}", ms=7, mew=2)
    xs = sorted({float(r[xkey]) for r in rows})
    ax.plot(xs, [non_private] * len(xs), "--k", lw=1, label="non-private DQN")
    ax.plot(xs, [ref["random"]] * len(xs), ":k", lw=1, label="random policy")
    ax.plot(xs, [ref["towards 0.5"]] * len(xs), "-.k", lw=1, label="'towards 0.5' policy")
    ax.plot([], [], "xk", ms=7, mew=2, label="x = accountant: no guarantee")
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("return of the released function (20 episodes)")
    ax.set_title(
        f"Released return vs {xlabel} (delta = {delta:g}; {seeds} seed(s) per point; mean +- sd)",
        fontsize=8,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6, loc="best")
    return save(fig, path)


def replot(out: Path, *, config: str | Path | None = None, delta: float = 1e-4) -> dict[str, Path]:
    """Redraw fig2.png and the two sweep PNGs from the CSVs in ``out`` (no training; the
    learning-curve PNG needs the runs and is not redrawn)."""

    cfg = load_cfg(config)
    ref = reference_returns(cfg)
    with (out / "fig2_summary.csv").open() as fh:
        summ = list(csv.DictReader(fh))
    np_mean = float(
        np.mean([float(r["release_return_mean"]) for r in summ if r["key"] == "non-private"])
    )
    n_seeds = max(int(r["seeds"]) for r in summ)
    paths = {"png": _plot_targets(summ, out / "fig2.png", ref=ref, n_seeds=n_seeds, cfg=cfg)}
    for part, _xkey, fname, _ in SWEEPS:
        with (out / f"{fname}.csv").open() as fh:
            rows = list(csv.DictReader(fh))
        seeds = int(rows[0]["seeds"]) if rows else 0
        paths[part] = plot_sweep(
            rows,
            out / f"{fname}.png",
            part=part,
            ref=ref,
            non_private=np_mean,
            delta=delta,
            seeds=seeds,
        )
    return paths


def _plot_targets(
    summ: list[JSONObject], path: Path, *, ref: dict[str, float], n_seeds: int, cfg: TrainConfig
) -> Path:
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib.pyplot as plt

    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments.plotting import save

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, eps in zip(axes, (0.9, 0.45), strict=True):
        rows = {r["key"]: r for r in summ if float(r["eps"]) == eps}
        keys = [k for k in METHODS if k in rows]
        ys = [float(rows[k]["release_return_mean"]) for k in keys]
        sds = [float(rows[k]["release_return_sd"]) for k in keys]
        colors = [
            "0.6" if k in ("non-private", "paper-sigma") else f"C{i}" for i, k in enumerate(keys)
        ]
        ax.barh(range(len(keys)), ys, xerr=sds, color=colors, capsize=3)
        labels = []
        for k in keys:
            p = rows[k]
            if k == "non-private":
                tag = "no privacy"
            elif not _truthy(p["privacy_holds"]):
                tag = f"no guarantee; sigma={float(p['privacy_noise']):.3g}"
            else:
                tag = (
                    f"eps={float(p['privacy_epsilon']):.3g}, noise={float(p['privacy_noise']):.3g}"
                )
            labels.append(
                LABELS[k].replace(" (paper's", "\n(paper's").replace("; guarantee", ";\nguarantee")
                + f"\n[{tag}]"
            )
        ax.set_yticks(range(len(keys)))
        ax.set_yticklabels(labels, fontsize=6)
        ax.axvline(ref["random"], color="k", ls=":", lw=1, label="random policy")
        ax.axvline(ref["towards 0.5"], color="k", ls="-.", lw=1, label="'towards 0.5' policy")
        ax.set_xlabel("return of the released function (mean +- sd over seeds)")
        ax.set_title(f"target eps = {eps}, delta = 1e-4", fontsize=9)
        ax.legend(fontsize=6, loc="lower right")
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(
        f"Fig. 2 on LineWalk, T={cfg.samples}, B={cfg.batch_size}, alpha={cfg.lr:g}; "
        f"{n_seeds} seeds",
        fontsize=9,
    )
    return save(fig, path)
