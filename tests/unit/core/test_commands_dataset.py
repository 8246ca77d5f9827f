"""``qveil dataset`` (qveil.commands.dataset) in this process: the --reward-range parser,
collect's flag and destination checks (each refused before any work, a one-line reason,
nothing written), the summary's human form and no-signal note, and the rows a config's
state intervals clip. The commands end to end: tests/integration/test_dataset_cli.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from dataset_helpers import LW, small_dataset

from qveil.cli import build_parser
from qveil.commands.dataset import (
    clipped_rows,
    format_summary,
    no_signal_note,
    parse_reward_range,
    run_collect,
)
from qveil.dataset import load_dataset, save_dataset
from qveil.errors import FailedPrecondition, InvalidArgument, NotFound
from qveil.trainer.commands.collect import collect_command

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b", "--reward-range must be LO,HI (two numbers), got 'a,b'"),
        ("1,0", "--reward-range needs finite LO < HI, got '1,0'"),
        ("0,1,2", "--reward-range must be LO,HI (two numbers)"),
        ("0,nan", "--reward-range needs finite LO < HI"),
        ("1", "--reward-range must be LO,HI"),
    ],
)
def test_parse_reward_range_refuses(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        parse_reward_range(text)
    assert str(exc.value) == message if message.endswith("'") else message in str(exc.value)


def test_parse_reward_range() -> None:
    assert parse_reward_range(None) is None
    assert parse_reward_range("-1.5, 2") == (-1.5, 2.0)


def _collect_args(tmp_path: Path, *flags: str) -> argparse.Namespace:
    argv = ["dataset", "collect", "--env", LW, "--users", "3", "--seed", "1"]
    argv += ["--out", str(tmp_path / "x.npz"), "--no-progress", *flags]
    return build_parser(argv).parse_args(argv)


def _never(args: argparse.Namespace, rr: tuple[float, float] | None) -> None:
    raise AssertionError("collected although a check should have refused")


@pytest.mark.parametrize(
    ("flags", "error", "message"),
    [
        (["--users", "0"], InvalidArgument, "--users must be >= 1, got 0"),
        (["--seed", "-3"], InvalidArgument, "--seed must be >= 0, got -3"),
        (["--episodes-per-user", "0"], InvalidArgument, "--episodes-per-user must be >= 1"),
        (["--reward-range", "a,b"], InvalidArgument, "--reward-range must be LO,HI"),
        (["--clip-rewards"], InvalidArgument, "--clip-rewards needs a declared range"),
        (["--policy-epsilon", "0.3"], InvalidArgument, "the random policy's actions are all"),
        (
            ["--policy", "mountaincar-energy", "--policy-epsilon", "2"],
            InvalidArgument,
            "--policy-epsilon must be in [0, 1], got 2",
        ),
        (["--workers", "2"], InvalidArgument, "give --out FILE.parquet"),
        (["--out", "{tmp}/x.csv"], InvalidArgument, "qveil reads CSV but does not write it"),
        (["--out", "{tmp}/missing/x.npz"], NotFound, "missing' does not exist"),
        (["--out", "{tmp}/old.npz"], FailedPrecondition, "exists; pass --force to replace it"),
        (["--out", "{tmp}/old-v0"], FailedPrecondition, "a Minari dataset is never overwritten"),
    ],
)
def test_collect_checks_refuse_before_any_work(
    tmp_path: Path, flags: list[str], error: type[Exception], message: str
) -> None:
    (tmp_path / "old.npz").write_bytes(b"kept")
    (tmp_path / "old-v0").mkdir()
    args = _collect_args(tmp_path, *(f.replace("{tmp}", str(tmp_path)) for f in flags))
    with pytest.raises(error, match=None) as exc:
        run_collect(args, collect=_never)
    assert message in str(exc.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old-v0", "old.npz"]
    assert (tmp_path / "old.npz").read_bytes() == b"kept"


def test_collect_takes_the_config_reward_range_and_force_replaces(tmp_path: Path) -> None:
    (tmp_path / "x.npz").write_bytes(b"old")
    args = _collect_args(
        tmp_path, "--config", str(CONFIGS / "linewalk-private.toml"), "--force", "--clip-rewards"
    )
    assert run_collect(args, collect=collect_command) == 0
    ds = load_dataset(tmp_path / "x.npz")
    assert ds.users == 3 and ds.reward_range is not None


def test_no_signal_note() -> None:
    flat = small_dataset(r=np.full(20, 0.25))
    assert no_signal_note(small_dataset().summary()) is None
    note = no_signal_note(flat.summary())
    assert note is not None and note.startswith("every reward is 0.25 and no episode reaches")
    term = np.zeros(20, dtype=bool)
    term[4] = True  # a terminal state carries the signal (CartPole)
    assert no_signal_note(small_dataset(r=np.full(20, 0.25), terminal=term).summary()) is None


def test_format_summary_lines() -> None:
    s = small_dataset(population="pop-a").summary()
    text = format_summary(s, "d.npz")
    lines = dict(ln.split(None, 1) for ln in text.splitlines())
    assert lines["dataset"] == "d.npz" and lines["users"] == "4"
    assert lines["reward"].startswith("declared [0, 0.5], observed [")
    assert lines["population"] == "pop-a"
    assert lines["actions"].startswith("2: 0: ") and "%" in lines["actions"]
    assert "WARNING" not in lines
    # a file that declares no reward range (a plain table): summarised, not yet loadable
    undeclared = small_dataset(r=np.full(20, 0.0)).summary() | {
        "reward_range": None,
        "fingerprint": None,
    }
    lines = dict(ln.split(None, 1) for ln in format_summary(undeclared, "d").splitlines())
    assert lines["reward"].startswith("none declared (qveil train needs --reward-range")
    assert lines["WARNING"].startswith("every reward is 0")
    assert lines["fingerprint"] == "(none until the reward range is declared)"


def test_clipped_rows_counts_rows_outside_the_intervals(tmp_path: Path) -> None:
    ds = small_dataset()
    path = tmp_path / "d.npz"
    save_dataset(ds, path)
    outside = int(((ds.s > 0.5) | (ds.s2 > 0.5)).sum())
    assert clipped_rows(str(path), [[0.0, 0.5]], reward_range=None) == (outside, 20)
    assert clipped_rows(str(path), [[0.0, 1.0]], reward_range=None) == (0, 20)
    with pytest.raises(InvalidArgument, match="has 1 state coordinates, but the config gives"):
        clipped_rows(str(path), [[0.0, 1.0], [0.0, 1.0]], reward_range=None)
