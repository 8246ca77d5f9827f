"""Figure 1 of Wang & Hegde (2019): Algorithm 1's learning curves on LineWalk.

Return against samples (mean and one standard deviation over 10 seeds) for sigma in
{0, 0.1, 0.2, 0.4, 0.8} and J in {1, T/B}, with the paper's settings (configs/linewalk.toml:
T = 5000, B = 64, alpha = 3e-4, k = 23, L = 4; beta = B / (4 alpha (k + 1)) = 2222). Every
sigma's privacy is what qveil.privacy says for it (paper and gdp modes), not what the paper
says. sigma = 0 is the non-private DQN (the same code path) and is the same run for both J.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qveil.experiments._util import progress_map, write_csv
from qveil.experiments.linewalk import load_cfg, privacy_row, reference_returns, run_spec
from qveil.json_types import JSONObject
from qveil.privacy.accountant import theorem5_beta

if TYPE_CHECKING:  # for annotations only: loads matplotlib
    from qveil.experiments.plotting import Curve

__all__ = ["SIGMAS", "aggregate_curves", "run"]

SIGMAS = (0.0, 0.1, 0.2, 0.4, 0.8)
QUICK_CHANGES = {"samples": 320, "resets": 5}  # 5 iterations of B = 64


def aggregate_curves(runs: list[JSONObject]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Align training-episode returns by episode: (samples, mean, std) over runs."""
    n = min(len(r["curve"]) for r in runs)
    steps = np.array([c[0] for c in runs[0]["curve"][:n]], dtype=np.float64)
    mat = np.array([[c[1] for c in r["curve"][:n]] for r in runs])
    return steps, mat.mean(axis=0), mat.std(axis=0)


# long-function: one figure's experiment top to bottom, in the order its caption describes
def run(
    *,
    out: Path,
    quick: bool = False,
    seeds: int | None = None,
    workers: int = 1,
    config: str | Path | None = None,
) -> dict[str, Path]:
    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments import plotting

    out.mkdir(parents=True, exist_ok=True)
    changes = dict(QUICK_CHANGES) if quick else {}
    cfg = load_cfg(config, **changes)
    n_seeds = seeds if seeds is not None else (2 if quick else 10)
    sigmas = (0.0, 0.4) if quick else SIGMAS
    js = (1, cfg.resets)  # the paper: J in {1, T/B}; linewalk.toml has resets = T/B = 78
    beta = theorem5_beta(lr=cfg.lr, k=cfg.k, batch_size=cfg.batch_size)
    specs = []
    for sigma in sigmas:
        for j in js if sigma > 0 else (js[-1],):
            for s in range(n_seeds):
                specs.append(
                    {
                        "method": "alg1",
                        "config": str(config) if config else None,
                        "config_changes": {**changes, "resets": j},
                        "seed": s,
                        "train_sigma": sigma,
                        "train_beta": beta,
                        "sigma": sigma,
                        "J": j,
                        "eval_episodes": 3 if quick else 20,
                    }
                )
    results = progress_map(run_spec, [(sp,) for sp in specs], workers=workers, desc="fig1 runs")
    groups: dict[tuple[float, int], list[JSONObject]] = defaultdict(list)
    for r in results:
        groups[(r["sigma"], r["J"])].append(r)

    curve_rows, summary = [], []
    for r in results:
        for steps, ret in r["curve"]:
            curve_rows.append(
                {
                    "sigma": r["sigma"],
                    "J": r["J"],
                    "seed": r["seed"],
                    "samples": steps,
                    "return": ret,
                }
            )
    panels: dict[str, dict[str, Curve]] = {f"J = {j}": {} for j in js}
    for (sigma, j), runs in sorted(groups.items()):
        acct = {}
        for mode in ("paper", "gdp"):
            if sigma > 0:
                pr, _ = privacy_row(cfg.replace(mode=mode, sigma=sigma, resets=j))
                acct[mode] = pr
        x, mu, sd = aggregate_curves(runs)
        targets = js if sigma == 0 else (j,)
        for jj in targets:
            panels[f"J = {jj}"][f"sigma = {sigma:g}"] = (x, mu, sd)
        fin = [r["final_train_return"] for r in runs]
        rel = [r["release_return"] for r in runs]
        row: JSONObject = {
            "sigma": sigma,
            "J": j if sigma > 0 else "any",
            "beta": beta,
            "seeds": len(runs),
            "final_train_return_mean": float(np.mean(fin)),
            "final_train_return_sd": float(np.std(fin)),
            "release_return_mean": float(np.mean(rel)),
            "release_return_sd": float(np.std(rel)),
        }
        for mode in ("paper", "gdp"):
            acc = acct.get(mode)
            row[f"{mode}_epsilon"] = None if acc is None else acc["epsilon"]
            row[f"{mode}_delta_total"] = None if acc is None else acc["delta_total"]
            row[f"{mode}_holds"] = None if acc is None else acc["holds"]
            row[f"{mode}_reason"] = None if acc is None else acc["reason"]
        summary.append(row)
    ref = reference_returns(cfg)
    paths = {
        "curves_csv": write_csv(out / "fig1_curves.csv", curve_rows),
        "summary_csv": write_csv(out / "fig1_summary.csv", summary),
    }
    paths["png"] = plotting.plot_curves(
        panels,
        out / "fig1.png",
        title=(
            f"Fig. 1: Algorithm 1 on LineWalk (T={cfg.samples}, B={cfg.batch_size}, "
            f"alpha={cfg.lr:g}, k={cfg.k:g}, beta={beta:.4g}); mean +- sd over {n_seeds} "
            f"seeds; random policy {ref['random']:.1f}, 'towards 0.5' {ref['towards 0.5']:.1f}"
        ),
        xlabel="samples",
        ylabel="training episode return",
    )
    return paths
