"""``qveil dataset collect|info|convert``: offline datasets for the ``fqi`` mode.

  qveil dataset collect --env ENV_ID --users N --seed S --out PATH
                        [--episodes-per-user K] [--reward-range LO,HI] [--force]
                        [--rewards-are-population-averages] [--population NAME]
                        [--config FILE] [--clip-rewards]
                        [--policy NAME [--policy-epsilon E]]
                        [--workers N | --cluster ADDRESS] [--shard-users S]
  qveil dataset info PATH [--reward-range LO,HI] [--config FILE] [--json]
  qveil dataset convert SRC DST [--reward-range LO,HI] [--config FILE] [--population NAME]

PATH is ``FILE.npz`` (the plain format), ``FILE.parquet``, ``FILE.csv``, a Minari dataset
directory ``.../NAME-vN``, or ``minari:DATASET_ID`` under ``$MINARI_DATASETS_PATH``
(docs/datasets.md). A ``.parquet`` file written by qveil (collect, convert) holds row groups
of whole users, streamed by the fit (``info`` reads its metadata only); one written by
pandas, pyarrow, Polars or Spark, and a CSV file, is a plain table with the columns user, a,
r, terminal and the state as list columns s, s2 or one column per coordinate s_0 .., s2_0 ..
(read whole). What a file does not declare comes from --reward-range and the --config's
reward_range and actions. ``info --config`` also counts the rows outside the config's
state_intervals (``qveil train`` warns above 1 %, refuses above 25 %).
``collect`` runs K episodes per user (Gymnasium env, Box observations, Discrete actions) with
a public behaviour policy: uniformly random actions (``--policy random``, the default), a
named public heuristic (``mountaincar-energy``, ``cartpole-balance``) or ``MODULE:CALLABLE``,
mixed epsilon-greedy with uniform actions by ``--policy-epsilon E``; the file records the
policy, and the seed makes the data reproducible. Collecting into a
``.parquet`` file runs one task per shard of users (``--workers N`` on a local Dask cluster,
``--cluster ADDRESS`` on a running scheduler) and gives the same file whatever the worker
count. Bad data or flags: a message naming the array and
row, exit status 2, nothing written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

from qveil.additive import StateBox
from qveil.cli_parser import Subcommands, add_command, add_no_progress
from qveil.dataset import (
    dataset_kind,
    declared_metadata,
    describe_dataset,
    iter_states,
    load_dataset,
    save_dataset,
)
from qveil.dataset_minari import resolve_location
from qveil.dataset_types import _echo
from qveil.errors import FailedPrecondition, InvalidArgument, NotFound
from qveil.fqi_config import CLIP_REFUSE, CLIP_WARN, clipping_message
from qveil.json_types import JSONObject
from qveil.kfqi_config import KernelFQIConfig, load_fqi_config

__all__ = [
    "add_engine_flags",
    "add_parser",
    "format_summary",
    "no_signal_note",
    "parse_reward_range",
]


def parse_reward_range(text: str | None) -> tuple[float, float] | None:
    """``"LO,HI"`` -> (LO, HI), finite with LO < HI; None stays None."""
    if text is None:
        return None
    parts = text.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        lo, hi = float(parts[0]), float(parts[1])
    except ValueError:
        raise InvalidArgument(
            f"--reward-range must be LO,HI (two numbers), got {_echo(text)}"
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise InvalidArgument(f"--reward-range needs finite LO < HI, got {_echo(text)}")
    return (lo, hi)


def add_engine_flags(p: argparse.ArgumentParser, *, what: str) -> None:
    """--workers, --cluster and --shard-users (where the map-reduce runs)."""
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help=f"run the {what} as tasks on a local Dask cluster of N worker processes "
        "(1, the default: in this process, no cluster)",
    )
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help=f"run the {what} on the running Dask scheduler at ADDRESS (tcp://HOST:PORT); "
        "Parquet files must be readable at the same path by every worker",
    )
    p.add_argument(
        "--shard-users",
        type=int,
        metavar="S",
        help="users per shard (default 10000; a Parquet dataset's shards are its row groups)",
    )


def add_parser(sub: Subcommands) -> argparse.ArgumentParser:
    p = add_command(
        sub,
        "dataset",
        "collect, inspect and convert offline datasets (npz, Parquet, CSV, Minari)",
        __doc__,
    )
    dsub = p.add_subparsers(dest="dataset_command", metavar="ACTION", required=True)

    c = dsub.add_parser(
        "collect",
        help="collect simulated episodes, one user per episode (or K)",
        description="Collect K episodes per user with a public behaviour policy (uniformly "
        "random by default).",
    )
    c.add_argument("--env", required=True, metavar="ENV_ID", help="Gymnasium env id")
    c.add_argument("--users", required=True, type=int, metavar="N", help="number of users")
    c.add_argument("--seed", required=True, type=int, metavar="S", help="seed (same S, same data)")
    c.add_argument(
        "--out", required=True, metavar="PATH", help="FILE.npz, FILE.parquet or a Minari location"
    )
    c.add_argument(
        "--episodes-per-user", type=int, default=1, metavar="K", help="episodes per user (1)"
    )
    c.add_argument(
        "--reward-range",
        metavar="LO,HI",
        help="declared reward range where the env declares none (CartPole: 0,1); default: "
        "the --config's reward_range",
    )
    c.add_argument(
        "--config",
        metavar="FILE",
        help="an fqi config: its reward_range is the declared range when --reward-range is absent",
    )
    c.add_argument(
        "--clip-rewards",
        action="store_true",
        help="clip every reward into the declared range (the release's public reward "
        "definition; for envs whose rewards have no hard bound, e.g. LunarLander)",
    )
    c.add_argument(
        "--rewards-are-population-averages",
        action="store_true",
        help="declare that each reward is the mean of the N users' private reward functions "
        "(true by construction for simulated data of the reward neighbour relation; never "
        "for one user's own rewards). fqi trains with --neighbour reward only on datasets "
        "that declare it",
    )
    c.add_argument(
        "--population",
        metavar="NAME",
        help="declare the population these users belong to: every release trained on the "
        "file is charged to its budget (qveil budget create NAME ...); files that share people "
        "declare the same name",
    )
    c.add_argument(
        "--policy",
        default="random",
        metavar="NAME",
        help="the public behaviour policy: random (the default), mountaincar-energy (push in "
        "the direction of the velocity), cartpole-balance (push toward the side the pole "
        "falls), or MODULE:CALLABLE (a function (obs, rng) -> action)",
    )
    c.add_argument(
        "--policy-epsilon",
        type=float,
        default=0.0,
        metavar="E",
        help="with probability E a step's action is uniformly random instead of the "
        "policy's (epsilon-greedy; 0 to 1, default 0)",
    )
    c.add_argument("--force", action="store_true", help="replace an existing .npz or .parquet")
    add_no_progress(c)
    add_engine_flags(c, what="collection (--out FILE.parquet)")
    c.set_defaults(func=run_collect)

    i = dsub.add_parser(
        "info",
        help="users, samples, action histogram, reward range (npz, Parquet, CSV, Minari)",
    )
    i.add_argument("path", metavar="PATH")
    i.add_argument("--reward-range", metavar="LO,HI", help="for files that declare none")
    i.add_argument(
        "--config",
        metavar="FILE",
        help="an fqi config: its reward_range and actions for a file that declares none, and "
        "the rows outside its state_intervals (clipped at train) counted",
    )
    i.add_argument("--json", action="store_true", help="print the summary as JSON")
    i.set_defaults(func=run_info)

    v = dsub.add_parser(
        "convert",
        help="convert between .npz, .parquet and Minari, or from a CSV file or a Parquet "
        "table written by another tool (fingerprint kept)",
    )
    v.add_argument("src", metavar="SRC")
    v.add_argument("dst", metavar="DST")
    v.add_argument("--reward-range", metavar="LO,HI", help="for sources that declare none")
    v.add_argument(
        "--config",
        metavar="FILE",
        help="an fqi config: its reward_range and actions for a source that declares none",
    )
    v.add_argument(
        "--population", metavar="NAME", help="declare (or keep) the population of the users"
    )
    v.set_defaults(func=run_convert)
    return p


def _check_out(out: str, *, force: bool) -> None:
    """Refuse an unusable destination before any work (a 1e5-user run must not fail last)."""
    kind = dataset_kind(out)  # raises for an unknown form
    if kind == "csv":
        raise InvalidArgument(
            f"{_echo(out)}: qveil reads CSV but does not write it (a CSV file cannot carry the "
            "declared metadata); write FILE.parquet or FILE.npz"
        )
    if kind in ("npz", "parquet"):
        path = Path(out)
        if not path.parent.is_dir():
            raise NotFound(f"directory {_echo(str(path.parent))} does not exist")
        if path.exists() and not force:
            raise FailedPrecondition(f"{_echo(out)} exists; pass --force to replace it")
        return

    directory, _ = resolve_location(out)
    if directory.exists():
        raise FailedPrecondition(
            f"{_echo(str(directory))} exists; a Minari dataset is never overwritten"
        )
    # a Minari dataset is a directory: its parent is created when it is written


def run_collect(args: argparse.Namespace, *, collect: Callable[..., None]) -> int:
    """Check the flags and the destination, then ``collect(args, reward_range)``: the
    trainer's simulated collection (:func:`qveil.trainer.commands.collect.collect_command`,
    passed by the composition root :mod:`qveil.cli`)."""
    rr = parse_reward_range(args.reward_range)
    if rr is None and args.config is not None:
        cfg_rr = load_fqi_config(args.config).reward_range
        rr = None if cfg_rr is None else (float(cfg_rr[0]), float(cfg_rr[1]))
    if args.clip_rewards and rr is None:
        raise InvalidArgument("--clip-rewards needs a declared range (--reward-range or --config)")
    if args.users < 1:
        raise InvalidArgument(f"--users must be >= 1, got {args.users}")
    if args.episodes_per_user < 1:
        raise InvalidArgument(f"--episodes-per-user must be >= 1, got {args.episodes_per_user}")
    if args.seed < 0:
        raise InvalidArgument(f"--seed must be >= 0, got {args.seed}")
    if not (math.isfinite(args.policy_epsilon) and 0.0 <= args.policy_epsilon <= 1.0):
        raise InvalidArgument(f"--policy-epsilon must be in [0, 1], got {args.policy_epsilon:g}")
    if args.policy == "random" and args.policy_epsilon != 0.0:
        raise InvalidArgument(
            "--policy-epsilon mixes a --policy NAME with uniform actions; the random policy's "
            "actions are all uniform already"
        )
    _check_out(args.out, force=args.force)
    parquet = dataset_kind(args.out) == "parquet"
    if not parquet and (args.workers != 1 or args.cluster is not None):
        raise InvalidArgument(
            "--workers and --cluster write one Parquet row group per shard: give --out FILE.parquet"
        )
    collect(args, rr)
    return 0


def no_signal_note(s: JSONObject) -> str | None:
    """For a :meth:`Dataset.summary` whose every reward is the same and no episode ends in a
    terminal state: the plain statement that nothing in the data tells one action from
    another (random-policy MountainCar never reaching its goal); None otherwise. CartPole's
    constant reward is not such a case: its terminal states carry the signal."""
    lo, hi = s["reward_observed"]
    if int(s["samples"]) == 0 or lo != hi or int(s["terminals"]) > 0:
        return None
    return (
        f"every reward is {lo:.6g} and no episode reaches a terminal state: nothing in the "
        "data tells one action from another, so no policy fitted on it can be expected to "
        "beat a random policy (another behaviour policy, or data that reaches the goal, is "
        "needed)"
    )


def format_summary(s: JSONObject, path: str) -> str:
    """The human form of :meth:`Dataset.summary` (``qveil dataset info`` without --json)."""
    total = max(1, int(s["samples"]))
    hist = ", ".join(f"{a}: {c} ({100.0 * c / total:.1f}%)" for a, c in enumerate(s["actions"]))
    olo, ohi = s["reward_observed"]
    if s["reward_range"] is None:
        reward = (
            f"none declared (qveil train needs --reward-range LO,HI or the config's "
            f"reward_range), observed [{olo:.6g}, {ohi:.6g}]"
        )
    else:
        lo, hi = s["reward_range"]
        reward = f"declared [{lo:.6g}, {hi:.6g}], observed [{olo:.6g}, {ohi:.6g}]"
    actions = (
        f"{s['n_actions']}: {hist}"
        if s["n_actions"] is not None
        else f"none declared (the config's actions = N, or n_actions in the file), seen: {hist}"
    )
    spu = s["samples_per_user"]
    lines = [
        ("dataset", path),
        ("env", s["env_id"] or "(unknown)"),
        ("users", str(s["users"])),
        ("samples", f"{s['samples']} ({spu['min']} to {spu['max']} per user), d = {s['d']}"),
        ("actions", actions),
        ("reward", reward),
        ("terminal", f"{s['terminals']} rows"),
        (
            "rewards",
            "declared population averages (fqi accepts the reward relation)"
            if s.get("rewards_are_population_averages")
            else "not declared population averages (fqi refuses the reward relation)",
        ),
        ("population", s.get("population") or "(not declared: qveil train needs --population)"),
        ("behaviour", s.get("behaviour") or "(not declared)"),
        ("fingerprint", s["fingerprint"] or "(none until the reward range is declared)"),
    ]
    if s.get("clipped") is not None:
        lines.append(("clipped", s["clipped"]["report"]))
    note = no_signal_note(s)
    if note is not None:
        lines.append(("WARNING", note))
    return "\n".join(f"{k:<12} {v}" for k, v in lines)


def _given(
    path: str, flag: str | None, config: str | None
) -> tuple[tuple[float, float] | None, int | None, KernelFQIConfig | None]:
    """The reward range and action count the command gives for ``path``: --reward-range
    (which a declared range must agree with), else the --config's reward_range where the
    file declares none; the config's actions; and the config itself."""
    rr = parse_reward_range(flag)
    cfg = None if config is None else load_fqi_config(config)
    if rr is None and cfg is not None and cfg.reward_range is not None:
        if declared_metadata(path).reward_range is None:
            rr = (float(cfg.reward_range[0]), float(cfg.reward_range[1]))
    return rr, (None if cfg is None else cfg.actions), cfg


def clipped_rows(
    path: str,
    intervals: list[list[float]] | tuple[tuple[float, float], ...],
    *,
    reward_range: tuple[float, float] | None,
) -> tuple[int, int]:
    """(rows whose state or next state lies outside ``intervals``, all rows) of the file
    (a qveil Parquet file one row group at a time)."""
    box = StateBox.of([list(p) for p in intervals])
    clipped = rows = 0
    for s, s2 in iter_states(path, reward_range=reward_range):
        if s.shape[1] != box.dims:
            raise InvalidArgument(
                f"the dataset {_echo(path)} has {s.shape[1]} state coordinates, but the "
                f"config gives state_intervals for {box.dims}"
            )
        clipped += box.rows_outside(s, s2)
        rows += len(s)
    return clipped, rows


def run_info(args: argparse.Namespace) -> int:
    rr, n_actions, cfg = _given(args.path, args.reward_range, args.config)
    s = describe_dataset(args.path, reward_range=rr, n_actions=n_actions)
    if cfg is not None and cfg.state_intervals is not None:
        clipped, rows = clipped_rows(args.path, cfg.state_intervals, reward_range=rr)
        share = clipped / max(1, rows)
        s["clipped"] = {
            "rows": clipped,
            "share": share,
            "report": clipping_message(clipped, rows, cfg.state_intervals)
            + (
                f" (qveil train refuses above {100 * CLIP_REFUSE:g} % unless --allow-clipping)"
                if share > CLIP_REFUSE
                else f" (qveil train warns above {100 * CLIP_WARN:g} %)"
            ),
        }
    if args.json:
        print(json.dumps(s | {"reward_signal": no_signal_note(s) is None}, indent=2))
    else:
        print(format_summary(s, os.fspath(args.path)))
    return 0


def run_convert(args: argparse.Namespace) -> int:
    _check_out(args.dst, force=False)
    rr, n_actions, _ = _given(args.src, args.reward_range, args.config)
    ds = load_dataset(args.src, reward_range=rr, n_actions=n_actions)
    if args.population is not None:
        if ds.population is not None and ds.population != args.population:
            raise InvalidArgument(
                f"{_echo(str(args.src))} declares population {_echo(ds.population)}; a file's "
                "people do not change population (write a new dataset for another population)"
            )
        ds = dataclasses.replace(ds, population=args.population)
    save_dataset(ds, args.dst)
    print(f"wrote {args.dst}: {ds.n} samples, {ds.users} users, {ds.fingerprint()}")
    return 0
