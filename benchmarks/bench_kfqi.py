"""Kernel FQI for d coordinates (issue 16): training time against the number of users, up
to N = 1e5 CartPole-v1 users (one random-policy episode each, about 2.2e6 samples), with the
config configs/cartpole-private.toml.

Per N: collecting the dataset; building the per-action sparse operators (c_a, P_a) of the
per-user averager (qveil.kfqi.averaging_operators_nd); the T iterations; the subspace KRR.
Against a ceiling measured in the same run: one bare pass that enumerates the truncated
product-kernel (sample, anchor) pairs over the same samples (work any truncated-kernel
estimator must do; 'build / pairs' is what the per-user normalisation and the sparse
products add). 'us / sample' shows how the build scales with the sample count.

Writes the "kfqi" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import table, write_section  # noqa: E402

from qveil.additive import StateBox  # noqa: E402
from qveil.kfqi import _nw_pairs, kernel_fqi  # noqa: E402
from qveil.trainer.collect import collect  # noqa: E402

COMMAND = "python benchmarks/bench_kfqi.py [--max-users 100000]"
CONFIG = HERE.parent / "configs" / "cartpole-private.toml"


def _row(users: int, cfg: dict, box: StateBox) -> list[object]:
    from qveil.kfqi_config import KernelFQIConfig

    t0 = time.perf_counter()
    ds = collect("CartPole-v1", users, 1, reward_range=(0.0, 1.0))
    t_collect = time.perf_counter() - t0
    spec = KernelFQIConfig.from_dict(cfg).spec(len(cfg["state_intervals"]))
    stamps: list[float] = []
    t0 = time.perf_counter()
    from qveil import kfqi

    orig = kfqi.fitted_q_nd

    def timed(*a: object, **k: object) -> np.ndarray:
        k["on_build"] = lambda _a: stamps.append(time.perf_counter())
        k["on_iteration"] = lambda _d: stamps.append(time.perf_counter())
        return orig(*a, **k)  # type: ignore[arg-type]

    kfqi.fitted_q_nd = timed  # type: ignore[assignment]
    try:
        kernel_fqi(
            ds.s,
            ds.a,
            ds.r,
            ds.s2,
            ds.terminal,
            ds.user,
            n_actions=int(ds.n_actions),
            reward_range=(0.0, 1.0),
            box=box,
            spec=spec,
        )
    finally:
        kfqi.fitted_q_nd = orig  # type: ignore[assignment]
    t_end = time.perf_counter()
    m = int(ds.n_actions)
    t_build = stamps[m - 1] - t0
    t_iter = stamps[-1] - stamps[m - 1]
    t_krr = t_end - stamps[-1]
    # ceiling: the bare (sample, anchor) pair enumeration over the same samples
    x = box.to_unit(ds.s)
    t0 = time.perf_counter()
    pairs = 0
    for lo in range(0, len(x), 1 << 16):
        pairs += len(
            _nw_pairs(
                x[lo : lo + (1 << 16)], spec.anchor_points, spec.bandwidth, spec.kernel_radius
            )[0]
        )
    t_pairs = time.perf_counter() - t0
    total = t_build + t_iter + t_krr
    print(f"N={users}: {ds.n} samples, build {t_build:.1f} s, total {total:.1f} s", flush=True)
    return [
        users,
        ds.n,
        round(t_collect, 1),
        round(t_build, 2),
        round(t_iter, 3),
        round(t_krr, 3),
        round(total, 2),
        round(t_pairs, 2),
        round(t_build / t_pairs, 2),
        pairs // ds.n,
        round(1e6 * t_build / ds.n, 2),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-users", type=int, default=100_000)
    args = ap.parse_args()
    with CONFIG.open("rb") as fh:
        cfg = tomllib.load(fh)
    box = StateBox.of(cfg["state_intervals"])
    sizes = [u for u in (1000, 10_000, 30_000, 100_000) if u <= args.max_users]
    rows = [_row(u, cfg, box) for u in sizes]
    base = rows[0][-1]
    for r in rows:
        r.append(round(float(r[-1]) / float(base), 2))  # type: ignore[arg-type]
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    body = (
        f"Load average at the end of the run: {load} (2 cores shared with other work).\n\n"
        f"CartPole-v1, one random-policy episode per user, config `configs/cartpole-private.toml`"
        f" ({cfg['anchor_points']}^4 anchors, bandwidth {cfg['bandwidth']}, T = "
        f"{cfg['iterations']}, M = {cfg['inducing_points']}). 'build' = the per-user sparse "
        "operators of both actions (built once); 'iterate' = the T fixed-point steps; 'krr' = "
        "the subspace KRR of both actions. Ceiling: 'pairs' = one bare enumeration of the "
        "truncated-kernel (sample, anchor) pairs over the same samples, in the same run. "
        "'per-sample ratio' = us / sample of the build against the smallest N (1 = linear "
        "in the sample count).\n\n"
        + table(
            [
                "users",
                "samples",
                "collect s",
                "build s",
                "iterate s",
                "krr s",
                "train s",
                "pairs s",
                "build / pairs",
                "pairs / sample",
                "us / sample",
                "per-sample ratio",
            ],
            rows,
        )
    )
    write_section("kfqi", "Kernel FQI for d coordinates (issue 16)", COMMAND, body)


if __name__ == "__main__":
    main()
