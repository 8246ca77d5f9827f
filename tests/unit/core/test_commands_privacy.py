"""`qveil privacy` (qveil.commands.privacy) in this process: flags, JSON keys, calibration,
the remedies offered when a guarantee does not hold, the fqi plan's text, and exit code 2
with a clear message. Through a real process: tests/integration/test_privacy_cli.py."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from qveil.cli import main
from qveil.commands.privacy import remedies
from qveil.privacy import E3_SETTINGS, PrivacyParams, account, calibrate

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


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


def test_fqi_text_prints_every_beta_of_a_d_coordinate_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A config of d coordinates has one beta_j each: the text lists all of them (d = 1:
    its one beta)."""
    configs = CONFIGS
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


def test_remedies_offer_a_larger_k_and_output_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """gdp E.3 at sigma 1 does not hold: the smallest --k (3 digits, checked by the
    accountant, delta_total <= 2 delta) and --mode output are offered, each with its epsilon."""
    params = PrivacyParams(mode="gdp", sigma=1.0, **E3_SETTINGS)  # type: ignore[arg-type]
    assert not account(params).holds
    fixes = remedies(params)
    assert [flag.split()[0:2] for flag, _ in fixes] == [["--k", "163"], ["--mode", "output"]]
    (k_flag, at_k), (_, output) = fixes
    assert at_k.holds and at_k.delta_total is not None and at_k.delta_total <= 2 * params.delta
    below = account(dataclasses.replace(params, k=0.99 * 163))
    assert not (
        below.holds and below.delta_total is not None and below.delta_total <= 2 * params.delta
    )
    assert output.mode == "output" and output.holds
    assert main(["privacy", "--mode", "gdp", "--sigma", "1"]) == 0
    out = capsys.readouterr().out
    assert "no epsilon for these flags; for this sigma, add one of:" in out
    assert f"  {k_flag:<16} -> ({at_k.epsilon:.6g}, " in out and "[output mode]" in out


def test_output_mode_needs_no_remedy() -> None:
    params = PrivacyParams(mode="output", sigma=2.0, **E3_SETTINGS)  # type: ignore[arg-type]
    assert remedies(params) == []


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--mode", "fqi", "--epsilon", "1"], "fqi mode needs --users N"),
        (["--sigma", "1", "--forecast"], "--forecast is for --mode fqi"),
        (
            ["--mode", "fqi", "--users", "100", "--sigma", "1", "--forecast"],
            "--forecast needs --epsilon E",
        ),
    ],
)
def test_fqi_and_forecast_refusals(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["privacy", *argv]) == 2
    assert fragment in capsys.readouterr().err


def test_a_config_without_actions_or_env_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (CONFIGS / "linewalk-private.toml").read_text().splitlines()
    bare = [ln for ln in text if ln.split("=")[0].strip() not in ("actions", "env_id")]
    cfg = tmp_path / "bare.toml"
    cfg.write_text("\n".join(bare) + "\n")
    flags = ["privacy", "--mode", "fqi", "--users", "300", "--epsilon", "1", "--config", str(cfg)]
    assert main(flags) == 2
    assert "names neither actions nor an env_id" in capsys.readouterr().err
    assert main([*flags, "--actions", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"]["actions"] == 3
