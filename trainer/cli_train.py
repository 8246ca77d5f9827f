"""``qveil train --config FILE --out DIR (--sigma S | --epsilon E [--delta D]) [--mode M]``
``qveil train --mode fqi --dataset PATH --epsilon E --delta D [--neighbour user|reward] --out DIR``

With ``--dataset`` (an offline dataset of users' episodes, ``qveil dataset collect``) the
mode is ``fqi``, the rigorous private fitted-Q release and the product's default: its
guarantee holds by construction (docs/privacy.md). ``--config`` is then an fqi config
(default: the built-in defaults; configs/linewalk-private.toml is LineWalk's tuned one). The
privacy plan is computed before the data is read: a warning when the noise is more than half
the value scale r0/(1-gamma), a refusal above it (expected worse than random) unless
``--force``.

Without ``--dataset``: Algorithm 1 of Wang & Hegde (paper, gdp, output modes), trained online
per the TOML config (command-line privacy flags override its values); writes a release
bundle. ``--seed N`` makes every source of randomness reproducible, for tests and
experiments only: the bundle's card then says ``seeded: true``. Without it all noise comes
from OS entropy.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
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
    p.add_argument("--config", metavar="FILE", help="training config (TOML); optional in fqi mode")
    p.add_argument("--out", required=True, metavar="DIR", help="bundle directory (must not exist)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sigma", type=float, help="noise scale sigma (>= 0; 0 = non-private)")
    g.add_argument(
        "--epsilon", type=float, help="target epsilon: sigma calibrated by the accountant"
    )
    p.add_argument("--delta", type=float, help="delta of the guarantee (config default 1e-4)")
    p.add_argument(
        "--mode",
        choices=("fqi", "paper", "gdp", "output"),
        help="fqi (default with --dataset): private fitted-Q on an offline dataset; "
        "paper/gdp/output: Algorithm 1 online",
    )
    p.add_argument("--dataset", metavar="PATH", help="offline dataset (.npz or Minari): fqi")
    p.add_argument(
        "--neighbour",
        choices=("user", "reward"),
        help="fqi: user (one user's whole data replaced; default) or reward",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="fqi: release even when the noise is expected to make it worse than random",
    )
    p.add_argument(
        "--reward-sensitivity",
        type=float,
        dest="reward_sensitivity",
        help="scale of neighbouring reward functions (default 1)",
    )
    p.add_argument("--seed", type=int, help="seed everything (experiments only: seeded: true)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--ledger",
        metavar="URL",
        help="store whose privacy ledger records the release (default: the store qveil serve "
        "uses by default, qveil-store.sqlite beside the bundle, created if missing)",
    )
    p.set_defaults(func=run)
    return p


def run_fqi(args: argparse.Namespace) -> int:
    """The fqi release: plan (public), fit, write; warnings on stderr."""
    from qveil.dataset import load_dataset
    from qveil.fqi_config import FQIConfig
    from qveil.kfqi_config import load_fqi_config
    from qveil.trainer.fqi import summary, train_fqi

    if args.dataset is None:
        raise InvalidArgument("--mode fqi needs --dataset PATH (qveil dataset collect makes one)")
    if args.seed is not None:
        raise InvalidArgument(
            "--seed has no use in fqi mode: the fit is deterministic and the release noise "
            "is drawn by the server's store from OS entropy"
        )
    cfg = load_fqi_config(args.config) if args.config else FQIConfig()
    changes: dict[str, Any] = {
        k: v for k, v in (("delta", args.delta), ("neighbour", args.neighbour)) if v is not None
    }
    if args.sigma is not None:
        changes.update(sigma=args.sigma, epsilon=None)
    elif args.epsilon is not None:
        changes.update(epsilon=args.epsilon, sigma=None)
    if args.reward_sensitivity is not None:
        raise InvalidArgument(
            "--reward-sensitivity is for the Algorithm 1 modes; fqi uses the dataset's "
            "declared reward range"
        )
    cfg = cfg.replace(**changes)
    outcome = train_fqi(cfg, load_dataset(args.dataset), args.out, force=args.force)
    print(summary(outcome))
    if outcome.warning:
        print(f"WARNING: {outcome.warning}", file=sys.stderr)
    record_in_ledger(Path(args.out), args.ledger)
    return 0


def record_in_ledger(bundle: Path, url: str | None) -> None:
    """Every release ``qveil train`` writes is recorded in a privacy ledger (issue 14, item 5):
    the one of ``--ledger URL``, else of the store ``qveil serve --bundle`` uses by default
    (``qveil-store.sqlite`` beside the bundle; created here if missing, as the release's first
    serve would), keyed by the dataset fingerprint or the environment id."""
    try:
        from qveil.server.admin import open_admin
        from qveil.server.release_ledger import record_release
    except ImportError as exc:  # the trainer without the server extra
        print(
            f"WARNING: the release is NOT recorded in a privacy ledger ({exc}); install "
            "qveil[server], or record it by serving it",
            file=sys.stderr,
        )
        return
    url = url or f"sqlite:///{bundle.resolve().parent / 'qveil-store.sqlite'}"
    from qveil.bundle import load_bundle

    card = load_bundle(bundle, verify=True).card  # public + admin card (dataset_fingerprint)
    with open_admin(url, actor="qveil train") as ctx:
        out = record_release(ctx.ledger, card, actor="qveil train")
    print(f"privacy {out.describe()} [{url}]")


def run(args: argparse.Namespace) -> int:
    if args.dataset is not None or args.mode == "fqi":
        if args.mode not in (None, "fqi"):
            raise InvalidArgument(f"--dataset trains in fqi mode, not {args.mode}")
        return run_fqi(args)
    if args.config is None:
        raise InvalidArgument("give --config FILE (Algorithm 1), or --dataset PATH (fqi)")
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
    from qveil.bundle import value_scale_warning

    warn = value_scale_warning(outcome.card)
    if warn:
        print("\n" + "!" * 78 + f"\n{warn}\n" + "!" * 78, file=sys.stderr)
    if not outcome.card["holds"]:
        print(f"warning: the guarantee does not hold: {outcome.card['reason']}", file=sys.stderr)
    record_in_ledger(Path(args.out), args.ledger)
    return 0
