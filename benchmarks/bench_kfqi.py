"""Kernel FQI for d coordinates: training time against the number of users, up
to N = 1e5 CartPole-v1 users (one random-policy episode each, about 2.2e6 samples), with the
config configs/cartpole-private.toml.

Per N: collecting the dataset; building the per-action sparse operators (c_a, P_a) of the
per-user averager (qveil.kfqi.averaging_operators_nd); the T iterations; the subspace KRR.
Against a ceiling measured in the same run: one bare pass that enumerates the truncated
product-kernel (sample, anchor) pairs over the same samples (work any truncated-kernel
estimator must do; 'build / pairs' is what the per-user normalisation and the sparse
products add). 'us / sample' shows how the build scales with the sample count.

Writes the "kfqi" section of docs/benchmarks.md. With ``--scale``: the fit's time and peak
resident memory against N and d (CartPole d = 4, LunarLander d = 8 and qveil/Reach16-v0
d = 16 with their configs; each fit in a process of its own, whose peak RSS the kernel
reports), the "kfqi-scale" section.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import load_line, table, write_section  # noqa: E402

from qveil.additive import StateBox  # noqa: E402
from qveil.kfqi import kernel_fqi  # noqa: E402
from qveil.kfqi_config import read_fqi_toml  # noqa: E402
from qveil.kfqi_spec import Anchors  # noqa: E402
from qveil.trainer.collect import collect  # noqa: E402

COMMAND = "python benchmarks/bench_kfqi.py [--max-users 100000]"
SCALE_COMMAND = "python benchmarks/bench_kfqi.py --scale [D:N,...]"
#: (env, config, collect options) of the scale section, by d
SCALE = {
    4: ("CartPole-v1", "cartpole-private.toml", {"reward_range": (0.0, 1.0)}),
    8: (
        "LunarLander-v3",
        "lunarlander-sobol.toml",
        {"reward_range": (-100.0, 100.0), "clip_rewards": True},
    ),
    16: ("qveil/Reach16-v0", "reach16-private.toml", {}),
}
CONFIG = HERE.parent / "configs" / "cartpole-private.toml"


def _layout(cfg: dict) -> str:
    """The config's anchors in words."""
    if cfg.get("anchors", "grid") == "grid":
        return f"{cfg['anchor_points']}^4 anchors"
    return f"{cfg['anchors']} anchors, K = {cfg['anchor_count']}, k = {cfg['neighbours']}"


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
            ds.transitions,
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
    anchors = Anchors(spec)
    for lo in range(0, len(x), 1 << 16):
        pairs += len(anchors.pairs(x[lo : lo + (1 << 16)])[0])
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


def _child(d: int, users: int) -> None:
    """One fit (collect, then train_kernel_fqi's fit): prints samples and seconds as JSON."""
    import json

    from qveil.kfqi_config import load_fqi_config
    from qveil.trainer.kfqi import fit_kernel

    env, config, opts = SCALE[d]
    t0 = time.perf_counter()
    ds = collect(env, users, 1, **opts)  # type: ignore[arg-type]
    t_collect = time.perf_counter() - t0
    t0 = time.perf_counter()
    fit_kernel(load_fqi_config(HERE.parent / "configs" / config), ds)
    print(json.dumps({"samples": ds.n, "collect": t_collect, "fit": time.perf_counter() - t0}))


def _scale(plan: list[tuple[int, int]]) -> None:
    """Time and peak RSS of the fit for each (d, N) of ``plan``, each in a fresh process."""
    import json
    import subprocess

    rows: list[list[object]] = []
    for d, users in plan:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(d), str(users)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"d={d} N={users}: the fit failed ({proc.returncode})")
        r = json.loads(out.strip().splitlines()[-1])
        rss = usage.ru_maxrss / 1024 / 1024  # KiB -> GiB
        env, config, _ = SCALE[d]
        print(f"d={d} N={users}: fit {r['fit']:.1f} s, peak {rss:.2f} GiB", flush=True)
        rows.append(
            [d, env, users, r["samples"], round(r["collect"], 1), round(r["fit"], 1),
             round(rss, 2), f"configs/{config}"]
        )  # fmt: skip
    body = (
        load_line()
        + "One random-policy episode per user; each row one process (collect, then the fit: "
        "the per-user operators, T iterations and the subspace KRR, no noise); 'peak GiB' is "
        "that process's peak resident set (collection included). d = 8 and 16 use public "
        "Sobol anchors (K = 4096, each sample and next state reaching its k nearest), so "
        "time and memory grow with samples x k, not with G^d.\n\n"
        + table(["d", "env", "users", "samples", "collect s", "fit s", "peak GiB", "config"], rows)
    )
    write_section("kfqi-scale", "Kernel FQI: time and memory against N and d", SCALE_COMMAND, body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-users", type=int, default=100_000)
    ap.add_argument(
        "--scale",
        nargs="?",
        const="4:10000,4:100000,8:10000,16:10000,16:100000",
        metavar="D:N,...",
        help="time and memory against N and d (default plan: %(const)s)",
    )
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    if args.scale:
        plan = [tuple(int(v) for v in item.split(":")) for item in args.scale.split(",")]
        _scale([(d, n) for d, n in plan if n <= args.max_users])  # type: ignore[misc]
        return
    cfg = read_fqi_toml(CONFIG)
    box = StateBox.of(cfg["state_intervals"])
    sizes = [u for u in (1000, 10_000, 30_000, 100_000) if u <= args.max_users]
    rows = [_row(u, cfg, box) for u in sizes]
    base = rows[0][-1]
    for r in rows:
        r.append(round(float(r[-1]) / float(base), 2))  # type: ignore[arg-type]
    body = (
        load_line()
        + f"CartPole-v1, one random-policy episode per user, config `configs/cartpole-private.toml`"
        f" ({_layout(cfg)}, bandwidth {cfg['bandwidth']}, T = "
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
    write_section("kfqi", "Kernel FQI for d coordinates", COMMAND, body)


if __name__ == "__main__":
    main()
