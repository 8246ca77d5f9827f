"""Trainer speed: the paper's full run (configs/linewalk.toml, T = 5000 samples) and the
authors' recipe (configs/linewalk-dqn.toml), wall time of training and the share spent
drawing GP noise. Writes the "trainer" section of docs/benchmarks.md.

    .venv/bin/python benchmarks/bench_trainer.py [--repeats 3]

Targets: the paper's full run in at most 30 s, noise sampling under 10 %.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _report import load_average, table, write_section  # noqa: E402

from qveil.trainer.algorithm import train_q  # noqa: E402
from qveil.trainer.config import TrainConfig  # noqa: E402
from qveil.trainer.train import make_env, privacy_for, run_training  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _case(name: str, cfg: TrainConfig, repeats: int) -> list[object]:
    result, cfg = privacy_for(cfg, n_actions=2)
    pr = result if isinstance(result, dict) else result.to_dict()
    sigma = 0.0 if cfg.mode == "output" else float(pr["sigma"])
    beta = float(pr["beta"])
    walls, noise, draws = [], [], []
    for r in range(repeats):
        info = make_env(cfg)
        t0 = time.perf_counter()
        res = train_q(cfg, info.env, interval=info.interval, sigma=sigma, beta=beta, seed=r)
        walls.append(time.perf_counter() - t0)
        noise.append(res.noise["seconds"])
        draws.append(res.noise["points"])
        info.env.close()
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        run_training(cfg, Path(d) / "b", seed=0)
        e2e = time.perf_counter() - t0
    w = statistics.median(walls)
    n = statistics.median(noise)
    return [
        name,
        cfg.samples,
        cfg.planned_updates,
        f"{sigma:.4g}",
        f"{beta:.4g}",
        int(statistics.median(draws)),
        w,
        n,
        f"{100 * n / w:.1f} %",
        e2e,
    ]


def _per_call(n: int = 6000) -> tuple[float, float]:
    """us per single-state call (``OUSamplePath.sample_one``, what Algorithm 1 uses) vs the
    bare exact draw (internals, for comparison only), at the paper's beta and sigma on new
    random states."""
    from qveil.noise import OUSamplePath

    xs = np.random.default_rng(0).random(n).tolist()
    best_call = best_draw = float("inf")
    for _ in range(3):
        p = OUSamplePath(beta=2222.0, sigma=3.7, rng=np.random.default_rng(1))
        t0 = time.perf_counter()
        for x in xs:
            p.sample_one(x)
        best_call = min(best_call, (time.perf_counter() - t0) / n * 1e6)
        p = OUSamplePath(beta=2222.0, sigma=3.7, rng=np.random.default_rng(1))
        t0 = time.perf_counter()
        for x in xs:
            if p._get(x) is None:
                p._draw_all([x], p._normals(1))
        best_draw = min(best_draw, (time.perf_counter() - t0) / n * 1e6)
    return best_call, best_draw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=5, help="runs of the paper's case")
    ap.add_argument("--dqn-repeats", type=int, default=1, help="runs of each replay case")
    args = ap.parse_args()
    paper = TrainConfig.from_toml(ROOT / "configs/linewalk.toml")
    dqn = TrainConfig.from_toml(ROOT / "configs/linewalk-dqn.toml")
    rows = [
        _case(
            "paper, literal Algorithm 1 (linewalk.toml, eps 0.9 paper mode)",
            dataclasses.replace(paper, epsilon=0.9, mode="paper"),
            args.repeats,
        ),
        _case(
            "authors' recipe (linewalk-dqn.toml, sigma 0.32 gdp mode)",
            dataclasses.replace(dqn, sigma=0.32, mode="gdp"),
            args.dqn_repeats,
        ),
        _case(
            "authors' recipe (linewalk-dqn.toml, sigma 0)",
            dataclasses.replace(dqn, sigma=0.0, mode="paper"),
            args.dqn_repeats,
        ),
    ]
    load = load_average()
    call_us, draw_us = _per_call()
    body = (
        f"Load average at the end of the run: {load} (2 cores; other work on the machine "
        "inflates these times directly).\n\n"
        f"Median of {args.repeats} (paper) / {args.dqn_repeats} (replay) seeded runs of "
        "`train_q` (the training loop alone), and one "
        "end-to-end `run_training` (calibration, env, training, bundle written and verified). "
        "'noise points' counts GP values drawn over all paths and actions; 'noise s' is the "
        "time spent drawing noise (`OUSamplePath.sample_one`/`sample`). "
        "Targets: paper's run <= 30 s, noise < 10 %.\n\n"
        + table(
            [
                "run",
                "T",
                "updates",
                "train sigma",
                "beta",
                "noise points",
                "train s",
                "noise s",
                "noise share",
                "end-to-end s",
            ],
            rows,
        )
        + "\n\nThe paper's run meets the time target by far. Algorithm 1 is sequential: the "
        "action at s_t needs g_a(s_t) before the step, so every new state costs one "
        "single-state `OUSamplePath.sample_one` call per action (one call per 'noise point'): "
        f"{call_us:.1f} us/call here, against {draw_us:.1f} us for the exact OU draw itself "
        "(measured through the path's internals, for comparison only); the rest is argument "
        "checking and the source's per-call cost. In the replay recipe every update evaluates "
        "the current path at 2 x 128 replayed states per action, most of them new (paths reset "
        "every episode), so noise is a large share there."
    )
    write_section("trainer", "Trainer", ".venv/bin/python benchmarks/bench_trainer.py", body)


if __name__ == "__main__":
    main()
