"""``qveil noise``: sample an exact OU path and print a summary (a smoke test of the core)."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from qveil.cli_parser import Subcommands
from qveil.noise import OUSamplePath
from qveil.rng import OSEntropy, resolve_rng


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser("noise", help="sample an exact GP (OU) noise path and summarise it")
    p.add_argument("--beta", type=float, required=True, help="kernel rate on [0, 1]")
    p.add_argument("--sigma", type=float, required=True, help="noise scale")
    p.add_argument("--points", type=int, default=1000, help="how many random states")
    p.add_argument(
        "--seed", type=int, default=None, help="seed (experiments only; default: OS entropy)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rng = resolve_rng(args.seed)
    states_rng = np.random.default_rng(args.seed) if args.seed is not None else None
    xs = (
        states_rng.random(args.points)
        if states_rng is not None
        else (OSEntropy().standard_normal(args.points) % 1.0)
    )
    path = OUSamplePath(beta=args.beta, sigma=args.sigma, rng=rng)
    t0 = time.perf_counter()
    gs = path.sample(xs)
    dt = time.perf_counter() - t0
    again = path.sample(xs)
    summary = {
        "beta": args.beta,
        "sigma": args.sigma,
        "points": len(path),
        "mean": float(gs.mean()),
        "std": float(gs.std()),
        "max_abs": path.max_abs(),
        "consistent_on_requery": bool(np.array_equal(gs, again)),
        "us_per_point": 1e6 * dt / max(1, len(path)),
        "seeded": args.seed is not None,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for k, v in summary.items():
            print(f"{k:>22}: {v}")
    return 0
