"""``qveil evaluate`` (qveil.trainer.commands.evaluate) in this process: a bundle's table and
JSON, a served release's (a real server: LocalServer on 127.0.0.1, port 0), and the flag
combinations refused in one line with exit 2 before anything is read or played."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, qveil_main
from dataset_helpers import LW
from server_helpers import fresh_bundle, small_network_bundle

from qveil.dataset import save_dataset
from qveil.server.local import LocalServer
from qveil.trainer.collect import collect


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LineWalk output-mode network release (d = 1, 2 actions)."""
    return small_network_bundle(
        tmp_path_factory.mktemp("evaluate") / "b",
        weights_seed=1,
        sigma=0.5,
        interval=(0.0, 1.0),
        env_id=LW,
    )


def test_a_bundle_as_json_and_as_a_table(bundle: Path, tmp_path: Path) -> None:
    r = qveil_main("evaluate", str(bundle), "--episodes", "2", "--seed", "3", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert all(row["episodes"] == 2 for row in rows) and "random" in {row["policy"] for row in rows}
    png = tmp_path / "scores.png"
    r = qveil_main("evaluate", str(bundle), "--episodes", "2", "--seed", "3", "--plot", str(png))
    assert r.returncode == 0, r.stderr
    first, *_, summary, plotted = r.stdout.splitlines()
    assert re.match(r"bundle \S+ \(qveil/LineWalk-v0, mode output, epsilon [\d.]+, ", first)
    assert "(mean return over 2 episodes)" in summary
    assert plotted == f"plot written to {png}" and png.read_bytes()[:4] == b"\x89PNG"


def test_a_served_release(bundle: Path, tmp_path: Path) -> None:
    copy = fresh_bundle(bundle, tmp_path / "served" / "b")  # receipted in this registry
    with LocalServer(copy, f"sqlite:///{tmp_path / 'store.sqlite'}") as srv:
        r = qveil_main("evaluate", "--target", srv.target, "--episodes", "2", "--seed", "1")
        j = qveil_main("evaluate", "--target", srv.target, "--episodes", "2", "--json")
    assert r.returncode == 0 and j.returncode == 0, r.stderr + j.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("served release ") and lines[0].endswith(": 2 episodes")
    assert "mode output" in lines[0] and "qveil/LineWalk-v0" in lines[0]
    assert [row["policy"] for row in json.loads(j.stdout)] == [
        "served release (GetBestActions)",
        "random",
    ]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], ("give a bundle DIR, or --target HOST:PORT",)),
        (["B", "--target", "127.0.0.1:9"], ("not both",)),
        (["B", "--dataset", "d.npz"], ("--dataset goes with --target",)),
        (["--target", "127.0.0.1:9", "--token", "t", "--token-file", "f"], ("not both",)),
        (["--private", "B", "--target", "127.0.0.1:9", "--dataset", "h.npz", "--config",
          "c.toml", "--epsilon", "1"], ("--target", "never sends held-out states to a server")),
        (["--private"], ("--private needs a bundle DIR, --dataset, --config, --epsilon",)),
        (["--private", "B", "--epsilon", "1"], ("--private needs --dataset, --config",)),
    ],
)  # fmt: skip
def test_refusals_are_one_line_before_anything_is_read(
    argv: list[str], words: tuple[str, ...], tmp_path: Path
) -> None:
    """B, d.npz, h.npz, c.toml do not exist: each refusal comes first."""
    assert_one_line_error(qveil_main("evaluate", *argv, cwd=tmp_path), "evaluate", *words)


def test_private_needs_a_population(bundle: Path, tmp_path: Path) -> None:
    held = tmp_path / "held.npz"
    save_dataset(collect(LW, 4, 1), held)
    config = Path(__file__).resolve().parents[3] / "configs" / "linewalk-private.toml"
    r = qveil_main("evaluate", "--private", str(bundle), "--dataset", str(held), "--config",
                   str(config), "--epsilon", "1")  # fmt: skip
    assert_one_line_error(r, "evaluate", "--private needs --population NAME")
