"""``qveil experiments NAME [--quick] [--seeds N] [--out DIR] [--workers W]``.

``anchors-sweep`` takes ``--env ENV`` (CartPole-v1, LunarLander-v3: the environment whose
plan runs) and ``--config FILE`` (its reference config instead of the pinned one).
``multid`` also takes ``--config FILE`` (a kernel fqi config instead of its env's public
one; its env_id is the environment), ``--env ENV``, ``--users N[,N...]``, ``--epsilons E[,E...]``,
``--releases R`` and ``--episodes E`` to run part of its plan (for example CartPole-v1 at
1e5 users only), and ``--dataset FILE.parquet`` to serve releases fitted on a collected
Parquet dataset (its env and users; the fit on ``--workers`` local Dask workers).

Each experiment writes CSV and PNG files into ``--out`` (default ``results/<name>``) and
prints what it wrote. ``--quick`` is the small version the test suite runs; without it the
full reproduction (the four together: about 7 minutes on a quiet 2-core machine; see
docs/results.md). Modules are imported only when their experiment runs (torch for fig1/fig2).
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from qveil.cli_parser import Subcommands, add_command
from qveil.errors import InvalidArgument, echo
from qveil.experiments._util import default_workers

N = TypeVar("N", int, float)

__all__ = ["EXPERIMENTS", "add_parser", "run"]

#: name -> (module, one-line description)
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "fig1": (
        "qveil.experiments.fig1",
        "Algorithm 1 learning curves on LineWalk, sigma in {0,.1,.2,.4,.8}, J in {1, T/B}",
    ),
    "fig2": (
        "qveil.experiments.fig2",
        "every method at eps 0.9 / 0.45 (delta 1e-4), each by its own accountant; "
        "return against eps",
    ),
    "bgp16": (
        "qveil.experiments.bgp16",
        "BGP16 chain MDP: RMSE vs batch size for LSW, LSL, DP-LSW, DP-LSL",
    ),
    "utility": (
        "qveil.experiments.utility",
        "fqi release as served on LineWalk: return vs users and eps (both relations), "
        "Algorithm 1 modes, non-private, random; private FQE vs DP-LSW/LSL on BGP16's chain",
    ),
    "multid": (
        "qveil.experiments.multid",
        "kernel fqi with additive noise, d > 1: CartPole-v1 and Acrobot-v1, return vs N and eps",
    ),
    "multid-levers": (
        "qveil.experiments.multid_levers",
        "CartPole kernel fqi at N = 1e5, eps 1: each public lever (lam, beta_j, gamma, T, "
        "default, bandwidth, anchors) with bootstrap CIs on common episodes",
    ),
    "prior-lever": (
        "qveil.experiments.prior_lever",
        "CartPole kernel fqi at N = 1e4, eps 1: a public prior from a shifted-pole simulator "
        "(and the same dynamics, a reference) against the constant default; each prior alone",
    ),
    "anchors-lever": (
        "qveil.experiments.anchors_lever",
        "CartPole kernel fqi at N = 1e4, eps 1: anchors where public simulated users go "
        "(k-means of their states, K in 256..4096) against the 6^4 grid",
    ),
    "anchors-sweep": (
        "qveil.experiments.anchors_sweep",
        "CartPole kernel fqi at N = 1e4, eps 1: visitation anchors combined with K, k, h, "
        "gamma, T, lambda, beta_j and the k-means source (tuned on seed 1, reported on seed 0)",
    ),
    "behaviour-target": (
        "qveil.experiments.behaviour_target",
        "MountainCar kernel fqi on data of the epsilon-greedy energy heuristic at N = 1e4, eps "
        "1: behaviour, random, non-private and private returns (tuned on seed 1, seed 0 "
        "reported)",
    ),
    "ceiling": (
        "qveil.experiments.ceiling",
        "the kernel fqi estimator (non-private and eps 1) beside offline DQN and discrete CQL "
        "on the same datasets: CartPole-v1 and LunarLander-v3 at 1e4 users",
    ),
    "forecast": (
        "qveil.experiments.forecast_check",
        "the utility forecast (public simulation) against measured served fractions, "
        "LineWalk and CartPole at eps 1 across N",
    ),
    "private-eval": (
        "qveil.experiments.private_eval_check",
        "the private off-policy evaluation against the simulator's true value: coverage of "
        "its 95%% interval over seeds (LineWalk, CartPole)",
    ),
    "theory": (
        "qveil.experiments.theory",
        "Lemma 8 sup bound, Proposition 10 utility bound, Proposition 9 query time",
    ),
}


def add_parser(sub: Subcommands) -> None:
    p = add_command(sub, "experiments", "reproduce the papers' figures and checks", __doc__, run)
    p.add_argument(
        "name",
        choices=sorted(EXPERIMENTS),
        help="; ".join(f"{k}: {v[1]}" for k, v in EXPERIMENTS.items()),
    )
    p.add_argument(
        "--quick", action="store_true", help="small settings (seconds): what the test suite runs"
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="number of seeds / runs (default: the experiment's own; theory: the base seed)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="output directory (default results/<name>)"
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="fig1/fig2: training config (default configs/linewalk.toml, the paper's settings); "
        "anchors-sweep: the reference config; multid: the config instead of the env's public "
        "one (for both, its env_id names the environment)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes (default: CPUs, or QVEIL_EXPERIMENT_WORKERS)",
    )
    multid = p.add_argument_group("multid only")
    multid.add_argument(
        "--env",
        help="multid: one environment with a public config (CartPole-v1, Acrobot-v1, "
        "LunarLander-v3, qveil/Reach16-v0, MountainCar-v0); anchors-sweep: the environment "
        "whose plan runs (CartPole-v1, LunarLander-v3)",
    )
    multid.add_argument("--users", help="multid: comma-separated numbers of users N")
    multid.add_argument("--epsilons", help="multid: comma-separated epsilons (default 0.5,1,2,4)")
    multid.add_argument("--releases", type=int, help="multid: served releases per cell")
    multid.add_argument("--episodes", type=int, help="multid: episodes per policy")
    multid.add_argument(
        "--dataset",
        type=Path,
        metavar="FILE",
        help="multid: a Parquet dataset (qveil dataset collect, seed 0) instead of collecting: "
        "its env and users are the plan; fitted on --workers local Dask workers",
    )


def _count(v: str) -> int:
    """A whole number, also written 1e5."""
    f = float(v)
    if not f.is_integer():
        raise ValueError(v)
    return int(f)


def _numbers(flag: str, raw: str, kind: Callable[[str], N]) -> list[N]:
    try:
        out = [kind(v) for v in raw.split(",")]
    except ValueError:
        raise InvalidArgument(f"{flag} must be comma-separated numbers, got {echo(raw)}") from None
    if not out or any(v <= 0 for v in out):
        raise InvalidArgument(f"{flag} must be positive, got {echo(raw)}")
    return out


def _multid_kwargs(args: argparse.Namespace) -> dict[str, object]:
    """The multid-only flags as keyword arguments of qveil.experiments.multid.run."""
    # here, not at the top: loads the server and the trainer only when multid runs
    from qveil.experiments.multid import ENVS, FULL, QUICK

    # each flag's value as its parser reads it (None: not given)
    env: str | None = getattr(args, "env", None)
    users_flag: str | None = getattr(args, "users", None)
    epsilons: str | None = getattr(args, "epsilons", None)
    releases: int | None = getattr(args, "releases", None)
    episodes: int | None = getattr(args, "episodes", None)
    dataset: Path | None = getattr(args, "dataset", None)
    flags = {
        "env": env,
        "users": users_flag,
        "epsilons": epsilons,
        "releases": releases,
        "episodes": episodes,
        "dataset": dataset,
    }
    given = [k for k, v in flags.items() if v is not None]
    if not given:
        return {}
    if args.name == "anchors-sweep" and given == ["env"] and env is not None:
        return {"env": _sweep_env(env)}
    if args.name != "multid":
        raise InvalidArgument(f"--{', --'.join(given)} apply to multid only")
    kw: dict[str, object] = {}  # keyword arguments of multid.run (found by name: untyped)
    for k, count in (("releases", releases), ("episodes", episodes)):
        if count is not None:
            if count < 1:
                raise InvalidArgument(f"--{k} must be >= 1, got {count}")
            kw[k] = count
    if dataset is not None:
        if env is not None or users_flag is not None:
            raise InvalidArgument("--dataset gives the env and the users: not with --env/--users")
        if not dataset.is_file():
            raise InvalidArgument(f"dataset file {echo(dataset)} does not exist")
        kw["dataset"] = dataset
    if epsilons is not None:
        kw["epsilons"] = tuple(_numbers("--epsilons", epsilons, float))
    if env is not None or users_flag is not None:
        if env is not None and env not in ENVS:
            raise InvalidArgument(f"--env must be one of {', '.join(ENVS)}, got {echo(env)}")
        base = (QUICK if args.quick else FULL)[0]
        users = _numbers("--users", users_flag, _count) if users_flag is not None else None
        if env is None:
            kw["plan"] = [(e, users if users is not None else ns) for e, ns in base]
        else:
            planned = dict(base).get(env)
            if users is None and planned is None:
                raise InvalidArgument(f"--env {env} is not in the default plan: give --users")
            kw["plan"] = [(env, users if users is not None else planned)]
    return kw


def _sweep_env(env: str) -> str:
    """An environment anchors-sweep has a plan for."""
    # here, not at the top: loads the experiment only when it runs
    from qveil.experiments.anchors_sweep import TARGETS

    if env not in TARGETS:
        raise InvalidArgument(f"--env must be one of {', '.join(TARGETS)}, got {echo(env)}")
    return env


def _sweep_config(path: Path, env: str | None) -> None:
    """A reference config for anchors-sweep: a readable fqi config of an environment with a
    plan (``env``'s, when given)."""
    # here, not at the top: loads the config reader only when it runs
    from qveil.kfqi_config import read_fqi_toml

    cfg_env = str(read_fqi_toml(path).get("env_id"))
    _sweep_env(cfg_env)
    if env is not None and env != cfg_env:
        raise InvalidArgument(f"--config is a config of {echo(cfg_env)}, not of --env {echo(env)}")


def _multid_config_env(path: Path, env: str | None) -> str:
    """The environment of a config file given to multid (``env`` when given must be it)."""
    # here, not at the top: loads the config reader and multid only when they run
    from qveil.experiments.multid import ENVS
    from qveil.kfqi_config import read_fqi_toml

    cfg_env = str(read_fqi_toml(path).get("env_id"))
    if cfg_env not in ENVS:
        raise InvalidArgument(f"--config is a config of {echo(cfg_env)}: multid has no such env")
    if env is not None and env != cfg_env:
        raise InvalidArgument(f"--config is a config of {echo(cfg_env)}, not of --env {echo(env)}")
    return cfg_env


def run(args: argparse.Namespace) -> int:
    if args.seeds is not None and args.seeds < 1 and args.name != "theory":
        raise InvalidArgument(f"--seeds must be >= 1, got {args.seeds}")
    if args.workers is not None and args.workers < 1:
        raise InvalidArgument(f"--workers must be >= 1, got {args.workers}")
    out = args.out if args.out is not None else Path("results") / args.name
    module = importlib.import_module(EXPERIMENTS[args.name][0])
    t0 = time.perf_counter()
    kwargs: dict[str, object] = {}  # keyword arguments of the experiment's run (untyped)
    if args.config is not None:
        if args.name not in ("fig1", "fig2", "anchors-sweep", "multid"):
            raise InvalidArgument("--config applies to fig1, fig2, anchors-sweep and multid only")
        if not args.config.is_file():
            raise InvalidArgument(f"config file {echo(args.config)} does not exist")
        if args.name == "anchors-sweep":
            _sweep_config(args.config, args.env)
        if args.name == "multid":
            env = _multid_config_env(args.config, args.env)
            if args.dataset is None:  # a --dataset names its env itself (checked by multid)
                args.env = env
        kwargs["config"] = args.config
    kwargs.update(_multid_kwargs(args))
    paths = module.run(
        out=out,
        quick=bool(args.quick),
        seeds=args.seeds,
        workers=args.workers or default_workers(),
        **kwargs,
    )
    dt = time.perf_counter() - t0
    for key, path in paths.items():
        print(f"{key}: {path}")
    print(f"{args.name}: done in {dt:.1f} s")
    return 0
