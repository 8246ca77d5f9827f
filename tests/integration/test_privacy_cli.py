"""`qveil privacy`: flags, JSON keys, calibration, and exit code 2 with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qveil.cli import main
from qveil.privacy import E3_SETTINGS, PrivacyParams, account, calibrate


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    assert main(["privacy", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_defaults_are_e3_and_paper_e3_does_not_hold(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "--sigma", "0.32")
    for key in ("mode", "epsilon", "delta_total", "holds", "sigma", "beta", "k", "basis", "reason"):
        assert key in d
    assert d["mode"] == "paper" and d["holds"] is False and d["epsilon"] is None
    assert "Lemma 8" in d["reason"]
    assert d["beta"] == pytest.approx(2222.2222222)
    want = account(PrivacyParams(mode="paper", sigma=0.32, **E3_SETTINGS)).to_dict()  # type: ignore[arg-type]
    assert d == json.loads(json.dumps(want))


def test_every_flag_reaches_the_params(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(
        capsys,
        "--mode",
        "gdp",
        "--sigma",
        "7",
        "--delta",
        "1e-6",
        "--samples",
        "1000",
        "--batch-size",
        "10",
        "--lr",
        "1e-3",
        "--k",
        "5000",
        "--lipschitz",
        "2",
        "--resets",
        "3",
        "--actions",
        "4",
        "--gamma",
        "0.5",
        "--reward-bound",
        "2",
        "--reward-sensitivity",
        "0.5",
        "--steps",
        "50",
    )
    p = d["params"]
    assert (
        p["mode"],
        p["sigma"],
        p["delta"],
        p["samples"],
        p["batch_size"],
        p["lr"],
        p["k"],
        p["lipschitz"],
        p["resets"],
        p["actions"],
        p["gamma"],
        p["reward_bound"],
        p["reward_sensitivity"],
        p["steps"],
    ) == ("gdp", 7.0, 1e-6, 1000, 10, 1e-3, 5000.0, 2.0, 3, 4, 0.5, 2.0, 0.5, 50)
    assert d["mechanisms"] == 51 and d["holds"] is True


def test_epsilon_calibrates(capsys: pytest.CaptureFixture[str]) -> None:
    d = _json(capsys, "--mode", "output", "--epsilon", "0.9")
    r = calibrate(
        PrivacyParams(mode="output", sigma=None, **E3_SETTINGS),  # type: ignore[arg-type]
        target_epsilon=0.9,
    )
    assert d["sigma"] == r.sigma and d["epsilon"] <= 0.9 and d["bound"] == pytest.approx(5.0)
    # paper: k is searched unless --k is given
    searched = _json(capsys, "--epsilon", "0.9")
    assert searched["holds"] is True and searched["k"] > 23
    fixed = _json(capsys, "--epsilon", "0.9", "--k", "23")
    assert fixed["holds"] is False and fixed["k"] == 23 and fixed["target"]["met"] is False


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "--sigma", "0.32"]) == 0
    out = capsys.readouterr().out
    assert "holds       NO" in out and "NOT a guarantee" in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--sigma", "nan"], "sigma must be finite, got nan"),
        (["--sigma", "-1"], "got -1.0"),
        (["--sigma", "1", "--delta", "1.5"], "delta must be < 1, got 1.5"),
        (["--sigma", "1", "--batch-size", "6000"], "batch_size=6000 > samples=5000"),
        (["--sigma", "1", "--k", "0"], "k must be > 0, got 0.0"),
        (["--epsilon", "0"], "got 0.0"),
    ],
)
def test_bad_values_exit_2(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["privacy", *argv]) == 2
    assert fragment in capsys.readouterr().err


def test_malformed_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["privacy", "--sigma", "x"],
        ["privacy", "--sigma", "1", "--epsilon", "1"],
        ["privacy", "--sigma", "1", "--mode", "rdp"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and "error" in capsys.readouterr().err
    # and through the installed entry point, in a real process
    proc = subprocess.run(
        [sys.executable, "-m", "qveil.cli", "privacy"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "--sigma --epsilon is required" in proc.stderr


def test_fqi_text_prints_every_beta_of_a_d_coordinate_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A config of d coordinates has one beta_j each: the text lists all of them (d = 1:
    its one beta)."""
    import tomllib
    from pathlib import Path

    configs = Path(__file__).resolve().parents[2] / "configs"
    cartpole = configs / "cartpole-private.toml"
    betas = tomllib.loads(cartpole.read_text())["betas"]
    flags = ["--mode", "fqi", "--users", "1000", "--epsilon", "1", "--delta", "1e-5"]
    assert main(["privacy", *flags, "--config", str(cartpole)]) == 0
    # each line: the symbol, its value, and what it is in words (in parentheses)
    lines = [ln.split(" (")[0].rstrip() for ln in capsys.readouterr().out.splitlines()]
    assert f"betas       {', '.join(f'{float(b):g}' for b in betas)}" in lines
    assert not [ln for ln in lines if ln.startswith("beta ")]
    assert main(["privacy", *flags, "--config", str(configs / "linewalk-private.toml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split(" (")[0].rstrip() for ln in out if ln.startswith("beta")] == ["betas       2"]
    (ratio,) = [ln for ln in out if ln.startswith("noise/value")]
    assert ratio.endswith("(sigma against the largest value: 0.84 %)"), ratio
