"""``qveil train --config FILE --out DIR (--sigma S | --epsilon E [--delta D]) [--mode M]``
``qveil train --mode fqi --dataset PATH --epsilon E --delta D [--neighbour user|reward] --out DIR``

With ``--dataset`` (an offline dataset of users' episodes, ``qveil dataset collect``) the
mode is ``fqi``, the rigorous private fitted-Q release and the product's default: its
guarantee holds by construction (docs/privacy.md). ``--config`` is then an fqi config
(default: the built-in defaults; configs/linewalk-private.toml is LineWalk's tuned one). The
privacy plan is computed before the data is read: a warning when the noise is more than half
the value scale r0/(1-gamma), a refusal above it (expected worse than random) unless
``--force``. With ``--forecast`` the utility forecast (public simulation) is printed first,
and a forecast that says the release would be worse than random, or that the non-private fit
itself is random-level (the data cannot support a better policy), is refused unless
``--force``. The kernel estimator's fit runs as map-reduce tasks over shards of whole users:
in this process by default, on a local Dask cluster with ``--workers N``, or on a running
Dask scheduler with ``--cluster ADDRESS`` (the same release bits whatever the worker count;
:mod:`qveil.trainer.distributed`). The dataset is ``.npz``, ``.parquet`` (qveil's layout,
streamed one row group per task; or a table written by pandas, pyarrow, Polars or Spark, read
whole), ``.csv`` or Minari (docs/datasets.md names a table's columns). What the file does not
declare comes from ``--reward-range LO,HI`` (which must agree with a declared range) or the
config's ``reward_range``, and from the config's ``actions`` (or its env's). Rows whose state
or next state lies outside the config's state_intervals are counted: a warning above 1 %, a
refusal above 25 % unless ``--allow-clipping`` (nothing written, nothing charged).

Without ``--dataset``: Algorithm 1 of Wang & Hegde (paper, gdp, output modes), trained online
per the TOML config (command-line privacy flags override its values); writes a release
bundle. ``--seed N`` makes every source of randomness reproducible, for tests and
experiments only: the bundle's card then says ``seeded: true``. Without it all noise comes
from OS entropy.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

from qveil.cli_parser import Subcommands, add_no_progress
from qveil.commands.dataset import add_engine_flags, parse_reward_range
from qveil.dataset import Dataset, Declared, count_users, declared_metadata, open_dataset
from qveil.dataset_parquet import ParquetSource
from qveil.errors import FailedPrecondition, InvalidArgument, QveilError, echo
from qveil.json_types import JSONObject
from qveil.kfqi_config import KernelFQIConfig
from qveil.privacy.gaussian import gdp_mu
from qveil.privacy.ledger import PlannedEvent, PrivacyEvent
from qveil.release_records import OpenReleaseRecords, validate_population
from qveil.trainer.commands.collect import engine_from
from qveil.trainer.estimators import TrainConfig, create_estimator, load_config
from qveil.trainer.forecast import forecast
from qveil.trainer.kfqi import action_count

__all__ = ["add_parser", "run"]


# long-function: a flat list of qveil train's flag declarations, one per option: splitting it
#   would only scatter its one --help
def add_parser(sub: Subcommands) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "train",
        help="train a private release and write its bundle: fqi on an offline dataset "
        "(the default, --dataset), or Algorithm 1 online (--mode paper|gdp|output)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", metavar="FILE", help="training config (TOML); optional in fqi mode")
    p.add_argument("--out", metavar="DIR", help="bundle directory (must not exist)")
    p.add_argument(
        "--write-prior",
        metavar="OUT.npz",
        dest="write_prior",
        help="fqi: fit the config's estimator on a PUBLIC --dataset (no noise, nothing "
        "charged) and write its values at the config's anchors as a prior file, for a "
        "config's prior key (docs/privacy.md 2.6), instead of a bundle",
    )
    p.add_argument(
        "--write-anchors",
        metavar="OUT.npz",
        dest="write_anchors",
        help="fqi: place the config's anchor_count anchors where the states of a PUBLIC "
        "--dataset go (k-means in the config's state box) and write them as an anchor file, "
        'for a config\'s anchors = "file" and anchor_file (docs/privacy.md 2.6), instead of '
        "a bundle",
    )
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
    p.add_argument(
        "--dataset",
        metavar="PATH",
        help="offline dataset: fqi. PATH.npz, PATH.parquet (qveil's layout, streamed; or a "
        "table written by pandas, pyarrow, Polars or Spark), PATH.csv, or a Minari dataset "
        "(docs/datasets.md names the columns)",
    )
    p.add_argument(
        "--reward-range",
        metavar="LO,HI",
        help="fqi: the declared reward range of a dataset that declares none (default: the "
        "config's reward_range); a dataset that declares one must agree",
    )
    p.add_argument(
        "--allow-clipping",
        action="store_true",
        help="fqi: train even when more than 25%% of the rows have a state or next state "
        "outside the config's state_intervals (they are clipped into them; above 1%% a "
        "warning)",
    )
    p.add_argument(
        "--neighbour",
        choices=("user", "reward"),
        help="fqi: user (one user's whole data replaced; default) or reward",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="fqi: release even when the noise is expected to make it worse than random, or "
        "(with --forecast) the forecast says the release would be worse than random or the "
        "data cannot support any policy better than random",
    )
    p.add_argument(
        "--reward-sensitivity",
        type=float,
        dest="reward_sensitivity",
        help="scale of neighbouring reward functions (default 1)",
    )
    p.add_argument("--seed", type=int, help="seed everything (experiments only: seeded: true)")
    add_no_progress(p)
    p.add_argument(
        "--forecast",
        action="store_true",
        help="fqi: first print the utility forecast (qveil privacy --forecast: the same "
        "estimator on simulated public data of N users), before the private data is read; "
        "refuse (unless --force) when it says the release would be worse than random or the "
        "data cannot support any policy better than random",
    )
    p.add_argument(
        "--population",
        metavar="NAME",
        help="the population whose data this release uses (declared once with qveil budget "
        "create NAME --epsilon E --delta D); the release is recorded against its budget and "
        "refused, before the data is read, when the budget's privacy filter would not let it "
        "through",
    )
    p.add_argument(
        "--registry",
        metavar="URL",
        help="the registry that charges the release to its population and signs its receipt "
        "(default: QVEIL_REGISTRY, else $QVEIL_HOME/registry.sqlite, ~/.qveil when unset)",
    )
    p.add_argument(
        "--ledger",
        metavar="URL",
        help="deprecated alias of --registry",
    )

    add_engine_flags(p, what="fit")
    p.set_defaults(func=run)
    return p


def _config(args: argparse.Namespace) -> KernelFQIConfig | TrainConfig:
    """The run's config (:func:`qveil.trainer.estimators.load_config`) with the command-line
    privacy flags applied; flags that do not belong to its estimator are refused."""

    if args.dataset is not None and args.mode not in (None, "fqi"):
        raise InvalidArgument(f"--dataset trains in fqi mode, not {args.mode}")
    fqi = args.dataset is not None or args.mode == "fqi"
    if fqi and args.dataset is None:
        raise InvalidArgument("--mode fqi needs --dataset PATH (qveil dataset collect makes one)")
    if not fqi and args.config is None:
        raise InvalidArgument("give --config FILE (Algorithm 1), or --dataset PATH (fqi)")
    cfg = load_config(args.config, estimator="grid" if fqi else "algorithm1")
    privacy: JSONObject = {}
    if args.sigma is not None:
        privacy.update(sigma=args.sigma, epsilon=None)
    elif args.epsilon is not None:
        privacy.update(epsilon=args.epsilon, sigma=None)
    if args.delta is not None:
        privacy["delta"] = args.delta
    if isinstance(cfg, TrainConfig):
        if fqi:
            raise InvalidArgument(f"config {echo(args.config)} is not an fqi config")
        for flag in ("neighbour", "force", "reward_range", "allow_clipping"):
            if getattr(args, flag):
                name = flag.replace("_", "-")
                raise InvalidArgument(f"--{name} is for the fqi mode (--dataset)")
        changes = {
            k: v
            for k, v in (("mode", args.mode), ("reward_sensitivity", args.reward_sensitivity))
            if v is not None
        }
        cfg = dataclasses.replace(cfg, **privacy, **changes)
        cfg.validate()
        if cfg.sigma is None and cfg.epsilon is None:
            raise InvalidArgument(
                "give --sigma S or --epsilon E (or set sigma/epsilon in the config)"
            )
        return cfg
    if args.seed is not None:
        raise InvalidArgument(
            "--seed has no use in fqi mode: the fit is deterministic and the release's noise "
            "key is drawn from OS entropy"
        )
    if args.reward_sensitivity is not None:
        raise InvalidArgument(
            "--reward-sensitivity is for the Algorithm 1 modes; fqi uses the dataset's "
            "declared reward range"
        )
    if args.neighbour is not None:
        privacy["neighbour"] = args.neighbour
    return cfg.replace(**privacy)


def run(args: argparse.Namespace, *, records: OpenReleaseRecords) -> int:
    """Plan (public), check the population's budget, read the data, fit and write through
    the config's estimator (:mod:`qveil.trainer.estimators`), then record and bind in
    ``records`` (the registry, passed by the composition root :mod:`qveil.cli`)."""

    if args.write_prior is not None or args.write_anchors is not None:
        return _write_public(args)
    if args.out is None:
        raise InvalidArgument(
            "give --out DIR (the bundle), or --write-prior OUT.npz or --write-anchors OUT.npz"
        )
    cfg = _config(args)
    est = create_estimator(cfg)
    ds: Dataset | ParquetSource | None = None
    if est.needs_dataset:
        # the estimators that read a dataset are the fqi ones, configured by a KernelFQIConfig
        assert isinstance(cfg, KernelFQIConfig)
        declared: Declared | None = None
        if not args.population:  # the population the dataset declares (its metadata alone)
            declared = declared_metadata(args.dataset)
            args.population = declared.population
        # the budget first: a population that cannot pay is refused before the data is read
        precheck_population(args, records, mode="fqi", epsilon=cfg.epsilon, delta=cfg.delta)
        if args.forecast:
            _print_forecast(cfg, args.dataset, force=args.force)
        # a qveil Parquet file streamed for the kernel fit: one row group per task
        ds = _open(args, cfg, declared=declared, stream=est.name == "kernel")
        if ds.population is not None and ds.population != args.population:
            raise InvalidArgument(
                f"the dataset declares population {ds.population!r:.80}, not "
                f"{args.population!r:.80}: a release is charged to the population of its users"
            )
    else:
        assert isinstance(cfg, TrainConfig)  # the online estimator (Algorithm 1)
        precheck_population(args, records, mode=cfg.mode, epsilon=cfg.epsilon, delta=cfg.delta)
    outcome = est.train(
        ds,
        args.out,
        force=args.force,
        seed=args.seed,
        progress=not args.no_progress and sys.stderr.isatty(),
        engine=engine_from(args),
        allow_clipping=bool(getattr(args, "allow_clipping", False)),
    )
    print(est.summary(outcome))
    for w in outcome.warnings:
        if est.needs_dataset:
            print(f"WARNING: {w}", file=sys.stderr)
        elif w.startswith("the guarantee does not hold"):
            print(f"warning: {w}", file=sys.stderr)
        else:
            print("\n" + "!" * 78 + f"\n{w}\n" + "!" * 78, file=sys.stderr)
    finish_release(Path(args.out), args, records)
    return 0


#: Flags of a release that a prior or anchor file (public data, no noise, no population)
#: has no use for.
_RELEASE_FLAGS = (
    *("out", "sigma", "epsilon", "delta", "force", "reward_sensitivity", "seed", "forecast"),
    *("population", "registry", "ledger"),
)


def _write_public(args: argparse.Namespace) -> int:
    """``--write-prior`` (the config's fit on a public dataset, written as a prior file) or
    ``--write-anchors`` (anchors where a public dataset's states go, as an anchor file)."""
    # here, not at the top: the prior and anchor writers are the kernel estimator's
    from qveil.trainer.kfqi import write_kernel_anchors, write_kernel_prior

    if args.write_prior is not None and args.write_anchors is not None:
        raise InvalidArgument("give --write-prior or --write-anchors, not both")
    option, what = (
        ("--write-prior", "a prior is fitted")
        if args.write_prior is not None
        else ("--write-anchors", "anchors are placed")
    )
    given = [f for f in _RELEASE_FLAGS if getattr(args, f) not in (None, False)]
    if given:
        raise InvalidArgument(
            f"--{given[0].replace('_', '-')} has no use with {option}: {what} "
            "on public data, without noise, and is no release"
        )
    if args.dataset is None:
        raise InvalidArgument(f"{option} needs --dataset PATH (a public dataset)")
    cfg = _config(args)
    if isinstance(cfg, TrainConfig):  # Algorithm 1's config: not an fqi one
        raise InvalidArgument(f"config {echo(args.config)} is not an fqi config")
    # anchors are placed from the states in memory
    ds = _open(args, cfg, declared=None, stream=args.write_anchors is None)
    if args.write_anchors is not None:
        anchors = write_kernel_anchors(cfg, ds, args.write_anchors, source=Path(args.dataset).name)
        print(
            f"anchors written to {args.write_anchors}: {len(anchors.points)} points in "
            f"{anchors.points.shape[1]} coordinates, sha256 {anchors.sha256}"
        )
        return 0
    prior = write_kernel_prior(
        cfg, ds, args.write_prior, source=Path(args.dataset).name, engine=engine_from(args)
    )
    k, m = prior.values.shape
    print(
        f"prior written to {args.write_prior}: {k} anchors x {m} actions, values in "
        f"[{prior.values.min():.4g}, {prior.values.max():.4g}], sha256 {prior.sha256}"
    )
    return 0


def _print_forecast(cfg: KernelFQIConfig, dataset: str, *, force: bool) -> None:
    """The utility forecast (:mod:`qveil.trainer.forecast`) for this config, the dataset's
    user count (from its user column alone) and the config's epsilon. A forecast that says
    the data cannot support a policy better than random, or that the release would be worse
    than random, refuses the release unless ``force`` (before the private data is read: the
    forecast is public)."""

    if cfg.epsilon is None:
        raise InvalidArgument("--forecast needs --epsilon E")
    # N from the dataset's user column alone: the accountant's public input
    fc = forecast(cfg, users=count_users(dataset), epsilon=float(cfg.epsilon))
    print(fc.text(), flush=True)
    if fc.refusal is not None and not force:
        raise FailedPrecondition(f"refusing: {fc.refusal}; pass --force to release anyway")


def _open(
    args: argparse.Namespace, cfg: KernelFQIConfig, *, declared: Declared | None, stream: bool
) -> Dataset | ParquetSource:
    """``--dataset`` for a fit of ``cfg``: its reward range from the file, ``--reward-range``
    (which must agree with a declared one) or the config's (for a file that declares none),
    its action count from the file or the config; refused when its coordinates are not the
    config's. ``declared``: the file's metadata when already read (None: read here)."""
    if declared is None:
        declared = declared_metadata(args.dataset)  # the file's metadata alone
    flag = parse_reward_range(args.reward_range)
    rr = cfg.reward_range
    cfg_rr = None if rr is None else (float(rr[0]), float(rr[1]))
    ds = open_dataset(
        args.dataset,
        reward_range=flag or (cfg_rr if declared.reward_range is None else None),
        n_actions=_action_count(cfg, declared),
        stream=stream,
    )
    _check_dims(cfg, ds.d, args.dataset, args.config)
    return ds


def _action_count(cfg: KernelFQIConfig, declared: Declared) -> int | None:
    """The action count the command gives a dataset that may declare none (an npz or a
    table): the config's ``actions``, else its env's. None for a file that declares one (the
    plan then refuses a config whose ``actions`` differ)."""
    if declared.n_actions is not None:
        return None
    return int(cfg.actions) if cfg.actions is not None else action_count(cfg)


def _check_dims(cfg: KernelFQIConfig, dims: int, dataset: str, config: str | None) -> None:
    """The config's per-coordinate lists (state_intervals, betas) must be the dataset's d
    long; the error names both files."""
    where = f"config {echo(config)}" if config else "the built-in default config"
    for name in ("state_intervals", "betas"):
        given = getattr(cfg, name, None)
        if given is not None and len(given) != dims:
            raise InvalidArgument(
                f"the dataset {echo(dataset)} has {dims} state coordinates, but the {where} "
                f"gives {name} for {len(given)}: give one per coordinate (state_intervals = "
                "[[lo, hi], ...], betas = [...])"
            )


def precheck_population(
    args: argparse.Namespace,
    records: OpenReleaseRecords,
    *,
    mode: str,
    epsilon: float | None,
    delta: float | None,
) -> None:
    """Before any data is read: the population must be declared, and the planned release must
    pass its privacy filter (exactly, when an epsilon is asked for: the Gaussian mechanism
    calibrated to (epsilon, delta) is mu-GDP with mu = gdp_mu(epsilon, delta); with --sigma
    the epsilon is known only after planning, and the record after the fit checks it)."""
    if not args.population:
        raise InvalidArgument(
            "name the population whose data this release uses: --population NAME, or a "
            "dataset that declares it (qveil dataset collect|convert --population NAME); "
            "declare it once: qveil budget create NAME --epsilon E --delta D"
        )
    validate_population(args.population)  # before the registry is opened
    with records(args.registry or args.ledger, actor="qveil train") as rec:
        if epsilon is None or delta is None or not 0 < delta < 1:
            rec.population_report(args.population)  # declared?
            return
        gauss = mode != "paper"
        planned = PrivacyEvent(
            mechanism=PlannedEvent(mode),
            epsilon=float(epsilon),
            delta=float(delta),
            dataset_id=args.population,
            bundle_id="planned",
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            mu=gdp_mu(epsilon=float(epsilon), delta=float(delta)) if gauss else None,
            delta_mechanism=float(delta) if gauss else None,
        )
        rec.precheck(args.population, planned)


def finish_release(bundle: Path, args: argparse.Namespace, records: OpenReleaseRecords) -> None:
    """Record the written bundle in the population ledger (one ledger whatever the output
    directory: ``--registry URL``, else ``QVEIL_REGISTRY``, else
    ``$QVEIL_HOME/registry.sqlite``; a release past the population's budget is refused), then
    write the registry's signed receipt of the charge into it: a release is served only with
    one. A refusal removes the bundle."""
    try:
        url = args.registry or args.ledger
        with records(url, actor="qveil train") as rec:
            print(rec.record_release(bundle, population=args.population))
            print(rec.issue_receipt(bundle))
    except (QveilError, OSError):
        shutil.rmtree(bundle, ignore_errors=True)
        raise
