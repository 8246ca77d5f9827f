"""The newcomer's path: the loud warning when sigma exceeds the value scale
r0/(1-gamma) (``qveil train``, ``qveil admin retrain``), ``qveil privacy --sigma 0.74`` saying
which flags give an epsilon, a relative ``sqlite:///`` store resolved against the bundle's
directory by a real ``qveil serve``, and card numbers rounded for humans."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from config_helpers import tiny_linewalk_config
from server_helpers import QVEIL, ensure_population, make_bundle, start_server

from qveil.bundle import value_scale_warning
from qveil.cli import main
from qveil.client.commands.query import human


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    return tiny_linewalk_config(tmp_path)


def test_value_scale_warning_unit() -> None:
    card = {"sigma": 11.4, "privacy_params": {"reward_bound": 0.5, "gamma": 0.9}}
    w = value_scale_warning(card)
    assert w is not None and "WARNING" in w and "11.4" in w and "= 5" in w
    assert value_scale_warning({**card, "sigma": 4.9}) is None
    assert value_scale_warning({"sigma": 3.0}) is None  # no reward bound: nothing to say


def test_train_warns_loudly_when_sigma_swamps_the_values(
    tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["train", "--config", str(tiny_config), "--seed", "1", "--no-progress"]
    base += ensure_population()
    assert main([*base, "--out", str(tmp_path / "a"), "--sigma", "6", "--mode", "output"]) == 0
    err = capsys.readouterr().err
    assert "WARNING: the release noise sigma = 6 exceeds the value scale" in err
    assert "no better than random" in err
    assert main([*base, "--out", str(tmp_path / "b"), "--sigma", "1", "--mode", "gdp"]) == 0
    assert "WARNING" not in capsys.readouterr().err


def test_admin_retrain_warns_loudly(
    tiny_config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "srv").mkdir()
    store = f"sqlite:///{tmp_path / 'srv' / 'qveil-store.sqlite'}"
    assert main(["admin", "init-store", "--store", store]) == 0  # admin creates stores only so
    cap = ["admin", "set-cap", "--store", store, "--dataset-id", "users"]
    assert main([*cap, "--epsilon", "5000", "--delta", "1e-3"]) == 0
    args = ["admin", "retrain", "--store", store, "--config", str(tiny_config)]
    args += ["--dataset-id", "users", "--mode", "output", "--seed", "1"]
    assert main([*args, "--sigma", "6"]) == 0
    assert "WARNING: the release noise sigma = 6 exceeds" in capsys.readouterr().err


def test_privacy_cli_prints_an_epsilon_or_the_flags_it_needs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["privacy", "--sigma", "0.74"]) == 0
    out = capsys.readouterr().out
    assert "holds       NO" in out and "no epsilon for these flags" in out
    [k_line] = [ln for ln in out.splitlines() if ln.strip().startswith("--k ")]
    k = k_line.split()[1]
    assert "--mode output" in out
    # the suggested flag really gives an epsilon
    assert main(["privacy", "--sigma", "0.74", "--k", k]) == 0
    out = capsys.readouterr().out
    assert "holds       yes" in out and "guarantee   (" in out and "no epsilon" not in out
    assert main(["privacy", "--mode", "gdp", "--sigma", "0.74"]) == 0
    assert "--k " in capsys.readouterr().out


def test_serve_resolves_a_relative_sqlite_store_against_the_bundle(tmp_path: Path) -> None:
    """start_server runs `qveil serve` with cwd = tmp_path; the bundle is in tmp_path/runs."""
    (tmp_path / "runs").mkdir()
    bundle = make_bundle(tmp_path / "runs" / "b")
    srv = start_server(tmp_path, bundle, store="sqlite:///rel-store.sqlite")
    try:
        want = (tmp_path / "runs" / "rel-store.sqlite").resolve()
        assert want.is_file() and not (tmp_path / "rel-store.sqlite").exists()
        assert f"store sqlite:///{want} (relative path resolved against" in srv.output()
        r = subprocess.run(
            [QVEIL, "query", "--target", srv.target, "--card"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        # rounded for humans: no 0.7999999999999998-style tails
        for line in r.stdout.splitlines():
            value = line.split(":", 1)[-1]
            assert "99999999" not in value and "00000000" not in value, line
        # the less obvious fields say what they are
        (grid,) = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("value_grid:")]
        assert grid.endswith("(answers are rounded to multiples of it)"), grid
    finally:
        assert srv.terminate() == 0


def test_human_rounding() -> None:
    assert human(7.999999999999996) == "8"
    assert human(0.7999999999999998) == "0.8"
    assert human(11.388545915990033) == "11.3885"
    assert human([0.0, 5.000000000000001]) == "[0, 5]"
    assert human(float("nan")) == "n/a" and human("x") == "x" and human(3) == "3"
