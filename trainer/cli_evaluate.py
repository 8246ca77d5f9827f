"""``qveil evaluate DIR --episodes N``: returns of the released noisy function (a fresh
sample path with the bundle's sigma and beta) and of the bare network, as a table.

``qveil evaluate --target HOST:PORT [--dataset PATH]``: returns of the SERVED release, its
actions asked from the server (GetBestActions, with the noise its store holds), beside the
random policy and, given the dataset, non-private FQI with the same public estimator."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "evaluate", help="average return of a bundle's greedy policies", description=__doc__
    )
    p.add_argument("bundle", metavar="DIR", nargs="?", help="release bundle directory")
    p.add_argument("--target", metavar="HOST:PORT", help="evaluate the release a server serves")
    p.add_argument("--token", help="bearer token for --target")
    p.add_argument("--dataset", metavar="PATH", help="with --target: non-private FQI reference")
    p.add_argument("--episodes", type=int, default=100, help="episodes per policy (default 100)")
    p.add_argument("--seed", type=int, help="seed the environments and the fresh noise path")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", metavar="PNG", help="also write a bar chart of the returns")
    p.set_defaults(func=run)
    return p


def run_served(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from qveil.trainer.evaluate import format_table, plot_scores
    from qveil.trainer.served_eval import evaluate_served

    dataset = None
    if args.dataset:
        from qveil.dataset import load_dataset

        dataset = load_dataset(args.dataset)
    card, scores = evaluate_served(
        args.target,
        episodes=args.episodes,
        seed=0 if args.seed is None else args.seed,
        token=args.token,
        dataset=dataset,
    )
    if args.json:
        print(json.dumps([asdict(s) for s in scores], indent=2))
    else:
        print(
            f"served release {card.get('bundle_id', '')} ({card.get('env_id')}, mode "
            f"{card.get('mode')}, epsilon {card.get('epsilon')}, holds {card.get('holds')}): "
            f"{args.episodes} episodes"
        )
        print(format_table(scores))
    if args.plot:
        plot_scores(scores, args.plot, title=f"served release {card.get('bundle_id', '')[:8]}")
    return 0


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from qveil.errors import InvalidArgument

    if args.target is not None:
        if args.bundle is not None:
            raise InvalidArgument("give a bundle DIR or --target HOST:PORT, not both")
        return run_served(args)
    if args.bundle is None:
        raise InvalidArgument("give a bundle DIR, or --target HOST:PORT for a served release")
    if args.dataset:
        raise InvalidArgument("--dataset goes with --target")

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
