"""The trainer's part of ``qveil dataset collect`` (qveil.trainer.commands.collect): the
engine of the --workers, --cluster and --shard-users flags, and the collection into a file
(npz, or Parquet as one task per shard) with its one-line report and the no-signal warning.
The flag and destination checks before it: tests/unit/core/test_commands_dataset.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from dataset_helpers import LW

from qveil.cli import build_parser
from qveil.dataset import load_dataset
from qveil.dataset_parquet import USERS_PER_GROUP, ParquetSource
from qveil.trainer.collect import collect
from qveil.trainer.commands.collect import collect_command, engine_from
from qveil.trainer.distributed import Engine


def _args(*flags: str) -> argparse.Namespace:
    argv = ["dataset", "collect", "--env", LW, "--seed", "2", *flags]
    return build_parser(argv).parse_args(argv)


def test_engine_from_the_flags() -> None:
    assert engine_from(_args("--users", "3", "--out", "x.npz")) == Engine(
        workers=1, cluster=None, shard_users=USERS_PER_GROUP, progress=True
    )
    e = engine_from(_args("--users", "3", "--out", "x.parquet", "--workers", "3",
                          "--shard-users", "5", "--no-progress"))  # fmt: skip
    assert (e.workers, e.shard_users, e.progress, e.local) == (3, 5, False, False)
    assert engine_from(_args("--users", "3", "--out", "x", "--cluster", "tcp://h:1")).cluster


def test_collect_into_npz_with_the_declarations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lw.npz"
    args = _args("--users", "6", "--out", str(out), "--no-progress", "--population", "pop-a",
                 "--rewards-are-population-averages")  # fmt: skip
    collect_command(args, None)
    ds = load_dataset(out)
    assert ds.users == 6 and ds.population == "pop-a" and ds.rewards_are_population_averages
    assert ds.fingerprint() == collect(LW, 6, 2).fingerprint()  # the same episodes
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"wrote {out}: 6 users, {ds.n} samples, d = 1, {ds.fingerprint()}")
    assert line.endswith("behaviour policy random")


def test_collect_into_parquet_one_row_group_per_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lw.parquet"
    collect_command(_args("--users", "7", "--out", str(out), "--no-progress",
                          "--shard-users", "3"), (0.0, 0.5))  # fmt: skip
    assert ParquetSource(out).groups == 3
    assert load_dataset(out) == collect(LW, 7, 2, reward_range=(0.0, 0.5))
    assert capsys.readouterr().out.startswith(f"wrote {out}: 7 users, ")


def test_data_without_any_reward_signal_is_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Random-policy MountainCar never reaches its goal: every reward is -1, no terminal."""
    argv = ["dataset", "collect", "--env", "MountainCar-v0", "--users", "2", "--seed", "0",
            "--out", str(tmp_path / "mc.npz"), "--no-progress"]  # fmt: skip
    collect_command(build_parser(argv).parse_args(argv), (-1.0, 0.0))
    err = capsys.readouterr().err
    assert err.startswith("WARNING: every reward is -1 and no episode reaches a terminal state")
