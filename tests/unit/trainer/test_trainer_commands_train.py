"""``qveil train`` (qveil.trainer.commands.train) in this process: an fqi release of a small
dataset (its summary, the registry's record and receipt), and the flags refused with exit 2
and one line before any data is read and with nothing written: flags of another estimator,
a missing --out or --dataset, a prior or anchor file asked with release flags, a population
that is not named or not declared, a config of another coordinate count. The documented
commands as real processes: tests/integration/test_cli_train.py, test_fqi_cli.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import qveil_main
from dataset_helpers import LW
from server_helpers import ensure_population

from qveil.bundle import RECEIPT_FILE, load_bundle
from qveil.dataset import save_dataset
from qveil.trainer.collect import collect

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
FQI = str(CONFIGS / "linewalk-private.toml")
ALG1 = str(CONFIGS / "linewalk-quick.toml")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 LineWalk users (no population declared in the file)."""
    out = tmp_path_factory.mktemp("data") / "lw.npz"
    save_dataset(collect(LW, 30, 3), out)
    return out


def test_an_fqi_release_is_written_recorded_and_receipted(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    r = qveil_main("train", "--dataset", str(dataset), "--config", FQI, "--epsilon", "1",
                   "--delta", "1e-5", "--out", str(out), *ensure_population())  # fmt: skip
    assert r.returncode == 0, r.stderr
    b = load_bundle(out)
    assert b.card["mode"] == "fqi" and b.card["users"] == 30 and b.card["holds"] is True
    assert (out / RECEIPT_FILE).is_file()
    assert b.bundle_id in r.stdout and "test-users" in r.stdout


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--seed", "1"], "--seed has no use in fqi mode"),
        (["--mode", "paper"], "--dataset trains in fqi mode, not paper"),
        (["--neighbour", "everyone"], "invalid choice: 'everyone'"),
        (["--epsilon", "-1"], "epsilon"),
        (["--reward-sensitivity", "1"], "--reward-sensitivity is for the Algorithm 1 modes"),
        (["--config", str(CONFIGS / "cartpole-private.toml")], "gives state_intervals for 4"),
        (["--config", ALG1], "is not an fqi config"),
    ],
)
def test_bad_fqi_flags(dataset: Path, tmp_path: Path, extra: list[str], needle: str) -> None:
    out = tmp_path / "b"
    base = ["train", "--dataset", str(dataset), "--out", str(out), *ensure_population()]
    if "--epsilon" not in extra:
        base += ["--epsilon", "1"]
    r = qveil_main(*base, *extra)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--epsilon", "1"], "give --out DIR (the bundle), or --write-prior OUT.npz"),
        (["--out", "{out}", "--mode", "fqi"], "--mode fqi needs --dataset PATH"),
        (["--out", "{out}", "--epsilon", "1"], "give --config FILE (Algorithm 1), or --dataset"),
        (["--out", "{out}", "--config", ALG1, "--neighbour", "user"], "--neighbour is for the fqi"),
        (["--out", "{out}", "--config", ALG1, "--reward-range", "0,1"], "--reward-range is for"),
        (["--write-prior", "{out}", "--epsilon", "1"], "--epsilon has no use with --write-prior"),
        (["--write-anchors", "{out}", "--population", "p"], "--population has no use with"),
        (["--write-prior", "{out}", "--write-anchors", "a.npz"], "not both"),
        (["--write-prior", "{out}"], "--write-prior needs --dataset PATH (a public dataset)"),
    ],
)
def test_refusals_before_any_data(argv: list[str], needle: str, tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    r = qveil_main("train", *(a.replace("{out}", out) for a in argv))
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_a_population_must_be_named_and_declared(dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    base = ["train", "--dataset", str(dataset), "--config", FQI, "--epsilon", "1"]
    r = qveil_main(*base, "--out", str(out))  # the file declares none either
    assert r.returncode == 2 and "name the population whose data this release uses" in r.stderr
    r = qveil_main(*base, "--out", str(out), "--population", " bad")
    assert r.returncode == 2 and "without surrounding spaces" in r.stderr
    r = qveil_main(*base, "--out", str(out), "--population", "nobody-declared-this")
    assert r.returncode == 2 and "nobody-declared-this" in r.stderr, r.stderr
    assert not out.exists()
