"""``qveil evaluate DIR --episodes N``: returns of the released noisy function (a fresh
sample path with the bundle's sigma and beta) and of the bare network, as a table."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "evaluate", help="average return of a bundle's greedy policies", description=__doc__
    )
    p.add_argument("bundle", metavar="DIR", help="release bundle directory")
    p.add_argument("--episodes", type=int, default=100, help="episodes per policy (default 100)")
    p.add_argument("--seed", type=int, help="seed the environments and the fresh noise path")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", metavar="PNG", help="also write a bar chart of the returns")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from qveil.bundle import load_bundle
    from qveil.rng import seeded_rng
    from qveil.trainer.evaluate import evaluate_bundle, format_table, plot_scores

    bundle = load_bundle(args.bundle, verify=True)
    scores = evaluate_bundle(
        bundle,
        episodes=args.episodes,
        seed=args.seed,
        noise_rng=None if args.seed is None else seeded_rng(args.seed),
    )
    if args.json:
        print(json.dumps([asdict(s) for s in scores], indent=2))
    else:
        c = bundle.card
        guarantee = (
            f"epsilon {c['epsilon']:.4g}, delta_total {c['delta_total']:.3g}"
            if c["holds"]
            else "no guarantee (holds: false)"
        )
        print(
            f"bundle {bundle.bundle_id} ({bundle.env_id}, mode {c['mode']}, {guarantee}, "
            f"release sigma {bundle.sigma:.4g}, beta {bundle.beta:.4g})"
        )
        print(format_table(scores))
    if args.plot:
        plot_scores(
            scores,
            args.plot,
            title=f"{bundle.env_id}  bundle {bundle.bundle_id[:8]}  "
            f"mode {bundle.card['mode']}  sigma {bundle.sigma:.4g}",
        )
        print(f"plot written to {args.plot}")
    return 0
