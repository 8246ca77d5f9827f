"""The trainer's part of the ``qveil dataset`` and ``qveil train`` commands: simulated
collection (``qveil dataset collect``: Gymnasium episodes, into one file or as Parquet row
groups written by tasks on Dask) and the :class:`~qveil.trainer.distributed.Engine` of the
``--workers``, ``--cluster`` and ``--shard-users`` flags.

``qveil dataset`` itself lives in core (:mod:`qveil.commands.dataset`: it checks the flags and
the destination); the composition root (:mod:`qveil.cli`) passes :func:`collect_command` to
it, so that core never imports the trainer.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from qveil.commands.dataset import no_signal_note
from qveil.dataset import dataset_kind, save_dataset
from qveil.dataset_parquet import USERS_PER_GROUP
from qveil.trainer.behaviour import resolve_behaviour
from qveil.trainer.collect import collect
from qveil.trainer.distributed import Engine, collect_parquet

__all__ = ["collect_command", "engine_from"]


def engine_from(args: argparse.Namespace) -> Engine:
    """The engine of the command-line flags (:func:`qveil.commands.dataset.add_engine_flags`)."""
    return Engine(
        workers=args.workers,
        cluster=args.cluster,
        shard_users=USERS_PER_GROUP if args.shard_users is None else args.shard_users,
        progress=not args.no_progress,
    )


def collect_command(args: argparse.Namespace, reward_range: tuple[float, float] | None) -> None:
    """``qveil dataset collect`` once its flags and destination are checked: the episodes of
    ``args.users`` users into ``args.out`` (a ``.parquet`` file as one task per shard), under
    the behaviour policy of ``--policy`` and ``--policy-epsilon``."""
    behaviour = resolve_behaviour(args.policy, args.policy_epsilon)
    if dataset_kind(args.out) == "parquet":
        s = collect_parquet(
            args.env,
            args.users,
            args.seed,
            args.out,
            episodes_per_user=args.episodes_per_user,
            reward_range=reward_range,
            clip_rewards=args.clip_rewards,
            population=args.population,
            rewards_are_population_averages=args.rewards_are_population_averages,
            force=args.force,
            engine=engine_from(args),
            behaviour=behaviour,
        )
    else:
        ds = collect(
            args.env,
            args.users,
            args.seed,
            episodes_per_user=args.episodes_per_user,
            progress=not args.no_progress,  # a bar on a terminal, else log lines
            reward_range=reward_range,
            clip_rewards=args.clip_rewards,
            behaviour=behaviour,
        )
        if args.rewards_are_population_averages:
            ds = dataclasses.replace(ds, rewards_are_population_averages=True)
        if args.population is not None:
            ds = dataclasses.replace(ds, population=args.population)
        save_dataset(ds, args.out)
        s = ds.summary()
    print(
        f"wrote {args.out}: {s['users']} users, {s['samples']} samples, d = {s['d']}, "
        f"{s['fingerprint']}, behaviour policy {s['behaviour']}"
    )
    note = no_signal_note(s)
    if note is not None:
        print(f"WARNING: {note}", file=sys.stderr)
