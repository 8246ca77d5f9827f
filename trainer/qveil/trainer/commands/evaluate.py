"""``qveil evaluate DIR --episodes N``: returns of the released function (its answers computed
in process from the bundle's key, as the server answers them) and of the bare network, as a
table.

``qveil evaluate --target HOST:PORT [--dataset PATH]``: returns of the SERVED release, its
actions asked from the server (GetBestActions: the released values, their noise the release
key's), beside the random policy and, given the dataset, non-private FQI with the same public
estimator.

``qveil evaluate --private DIR --dataset HELD_OUT --config FILE --population NAME --epsilon E
[--delta D]``: a differentially private estimate of the release's greedy policy's value on the
held-out users' start states (:mod:`qveil.trainer.private_eval`), the policy computed in
process from the bundle exactly as the server answers it (no held-out state is sent to any
server), with its 95% interval, charged to the population's budget and shown on the admin
card. The value is a discounted one (the config's gamma), not an episode return; the interval
covers the mechanism's noise only, not the bias of the fitted-Q evaluation (the output says
both)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from qveil.bundle import load_bundle
from qveil.cli_parser import Subcommands
from qveil.client.channel import read_token_file
from qveil.dataset import declared_metadata, load_dataset
from qveil.errors import InvalidArgument, echo
from qveil.kfqi_config import load_fqi_config
from qveil.privacy.ledger import spending_line
from qveil.release_records import OpenReleaseRecords
from qveil.trainer.evaluate import evaluate_bundle, format_table, plot_scores, summary_line
from qveil.trainer.private_eval import private_evaluation
from qveil.trainer.served_eval import evaluate_served

__all__ = ["add_parser", "run"]


def add_parser(sub: Subcommands) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "evaluate", help="average return of a bundle's greedy policies", description=__doc__
    )
    p.add_argument("bundle", metavar="DIR", nargs="?", help="release bundle directory")
    p.add_argument("--target", metavar="HOST:PORT", help="evaluate the release a server serves")
    p.add_argument("--token", help="bearer token for --target")
    p.add_argument("--token-file", metavar="FILE", help="file holding the bearer token")
    p.add_argument("--dataset", metavar="PATH", help="with --target: non-private FQI reference")
    p.add_argument("--episodes", type=int, default=100, help="episodes per policy (default 100)")
    p.add_argument("--seed", type=int, help="seed the environments")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--plot", metavar="PNG", help="also write a bar chart of the returns")
    pv = p.add_argument_group("private evaluation (--private)")
    pv.add_argument(
        "--private",
        action="store_true",
        help="with a bundle DIR and --dataset HELD_OUT: a differentially private estimate of "
        "the release's discounted policy value (the config's gamma; not an episode return) from "
        "held-out users' data, computed in process (no held-out state reaches a server); its "
        "95%% interval covers the mechanism's noise only, not the fitted-Q evaluation's bias",
    )
    pv.add_argument("--config", metavar="FILE", help="the fqi config of the estimator")
    pv.add_argument("--population", metavar="NAME", help="the held-out users' population")
    pv.add_argument("--epsilon", type=float, help="the estimate's epsilon")
    pv.add_argument("--delta", type=float, default=1e-5, help="its delta (default 1e-5)")
    pv.add_argument("--registry", metavar="URL", help="the registry (default: QVEIL_HOME's)")
    p.set_defaults(func=run)
    return p


def _token(args: argparse.Namespace) -> str | None:
    """The bearer token: --token, or read from --token-file (not both)."""

    token: str | None = args.token
    if args.token_file is None:
        return token
    if token is not None:
        raise InvalidArgument("give --token or --token-file, not both")
    return read_token_file(args.token_file)


def run_served(args: argparse.Namespace) -> int:

    dataset = None
    if args.dataset:
        dataset = load_dataset(args.dataset)
    card, scores = evaluate_served(
        args.target,
        episodes=args.episodes,
        seed=0 if args.seed is None else args.seed,
        token=_token(args),
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
        print(summary_line(scores))
    if args.plot:
        plot_scores(scores, args.plot, title=f"served release {card.get('bundle_id', '')[:8]}")
    return 0


def run_private(args: argparse.Namespace, records: OpenReleaseRecords) -> int:
    """``--private``: the private off-policy evaluation of the served release, charged to
    the population in ``records``."""

    if args.target is not None:
        raise InvalidArgument(
            "--private evaluates a bundle DIR in process; it never sends held-out states to a "
            "server (--target)"
        )
    missing = [f"--{k}" for k in ("dataset", "config", "epsilon") if getattr(args, k) is None]
    if args.bundle is None:
        missing.insert(0, "a bundle DIR")
    if missing:
        raise InvalidArgument(f"--private needs {', '.join(missing)}")
    bundle = load_bundle(args.bundle, verify=True)
    population = args.population or declared_metadata(args.dataset).population
    if not population:
        raise InvalidArgument("--private needs --population NAME (or a dataset that declares it)")
    cfg = load_fqi_config(args.config)
    with records(args.registry, actor="qveil evaluate") as rec:
        rec.population_report(population)  # declared? (refused before the data is read)
        dataset = load_dataset(args.dataset)
        if dataset.population not in (None, population):
            raise InvalidArgument(
                f"the dataset declares population {echo(dataset.population)}, not "
                f"{population!r:.80}"
            )
        rep = private_evaluation(
            bundle=bundle,
            dataset=dataset,
            config=cfg,
            epsilon=args.epsilon,
            delta=args.delta,
            population=population,
            records=rec,
        )
    if args.json:
        print(json.dumps(rep, indent=2, default=str))
        return 0
    lo, hi = rep["interval95"]
    b = rep["population_budget"]
    print(
        f"private evaluation of release {rep['release_id']} on {rep['users']} held-out users: "
        f"{rep['estimate']:.4g} (95% interval {lo:.4g} to {hi:.4g}; the mechanism's noise, "
        f"sigma {rep['sigma']:.4g}), ({rep['epsilon']:.4g}, {rep['delta']:.3g})-DP, user relation\n"
        f"scale: {rep['scale']}\n"
        f"the interval does NOT cover {rep['interval_does_not_cover']}\n"
        f"{spending_line(population, b)}"
    )
    return 0


def run(args: argparse.Namespace, *, records: OpenReleaseRecords) -> int:
    """Evaluate a bundle, a served release, or (``--private``) a served release privately,
    charged to its population in ``records`` (the registry, passed by :mod:`qveil.cli`)."""

    if args.private:
        return run_private(args, records)
    if args.target is not None:
        if args.bundle is not None:
            raise InvalidArgument("give a bundle DIR or --target HOST:PORT, not both")
        return run_served(args)
    if args.bundle is None:
        raise InvalidArgument("give a bundle DIR, or --target HOST:PORT for a served release")
    if args.dataset:
        raise InvalidArgument("--dataset goes with --target")

    bundle = load_bundle(args.bundle, verify=True)
    scores = evaluate_bundle(bundle, episodes=args.episodes, seed=args.seed)
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
        print(summary_line(scores))
    if args.plot:
        plot_scores(
            scores,
            args.plot,
            title=f"{bundle.env_id}  bundle {bundle.bundle_id[:8]}  "
            f"mode {bundle.card['mode']}  sigma {bundle.sigma:.4g}",
        )
        print(f"plot written to {args.plot}")
    return 0
