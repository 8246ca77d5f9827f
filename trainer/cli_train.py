"""``qveil train --config FILE --out DIR (--sigma S | --epsilon E [--delta D]) [--mode M]``.

Trains per the TOML config (command-line privacy flags override its values) and writes a
release bundle. ``--seed N`` makes every source of randomness reproducible, for tests and
experiments only: the bundle's card then says ``seeded: true``. Without it all noise comes
from OS entropy.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from qveil.errors import InvalidArgument

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "train",
        help="train a private Q-network (Algorithm 1) and write a release bundle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, metavar="FILE", help="training config (TOML)")
    p.add_argument("--out", required=True, metavar="DIR", help="bundle directory (must not exist)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sigma", type=float, help="noise scale sigma (>= 0; 0 = non-private)")
    g.add_argument(
        "--epsilon", type=float, help="target epsilon: sigma calibrated by the accountant"
    )
    p.add_argument("--delta", type=float, help="delta of the guarantee (config default 1e-4)")
    p.add_argument("--mode", choices=("paper", "gdp", "output"), help="accounting mode")
    p.add_argument(
        "--reward-sensitivity",
        type=float,
        dest="reward_sensitivity",
        help="scale of neighbouring reward functions (default 1)",
    )
    p.add_argument("--seed", type=int, help="seed everything (experiments only: seeded: true)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from qveil.trainer.config import TrainConfig
    from qveil.trainer.train import main_summary, run_training

    cfg = TrainConfig.from_toml(args.config)
    overrides: dict[str, Any] = {
        k: v
        for k, v in (
            ("mode", args.mode),
            ("delta", args.delta),
            ("reward_sensitivity", args.reward_sensitivity),
        )
        if v is not None
    }
    if args.sigma is not None:
        overrides.update(sigma=args.sigma, epsilon=None)
    elif args.epsilon is not None:
        overrides.update(epsilon=args.epsilon, sigma=None)
    cfg = dataclasses.replace(cfg, **overrides)
    cfg.validate()
    if cfg.sigma is None and cfg.epsilon is None:
        raise InvalidArgument("give --sigma S or --epsilon E (or set sigma/epsilon in the config)")
    outcome = run_training(
        cfg, args.out, seed=args.seed, progress=not args.no_progress and sys.stderr.isatty()
    )
    print(main_summary(outcome))
    if not outcome.card["holds"]:
        print(f"warning: the guarantee does not hold: {outcome.card['reason']}", file=sys.stderr)
    return 0
