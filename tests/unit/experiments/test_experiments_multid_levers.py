"""``qveil experiments multid-levers --quick`` (300 CartPole users, seconds): the lever
table's columns, sigma from the accountant for each row's own parameters, and the paired
bootstrap of the fraction (common episodes for ceiling, floor and every release)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from experiment_helpers import read_rows, run_quick

from qveil.experiments import multid_levers as ml
from qveil.privacy.kfqi import KernelFQIPrivacyParams, calibrate_kernel_fqi


def test_quick_table_columns_and_sigma_from_the_accountant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row has the documented columns; its sigma is calibrate_kernel_fqi's at the
    row's users, gamma, T, lam, betas and grid (a sigma from another config, e.g. the
    before row's for the lam lever, or one not recomputed per dataset, would differ); the
    interval contains the point estimate."""
    monkeypatch.setenv("QVEIL_LEVERS_CACHE", str(tmp_path / "cache"))
    run_quick("multid-levers", tmp_path)
    rows = read_rows(tmp_path / "multid_levers.csv", ml.COLUMNS)
    assert [r["label"] for r in rows] == ["before", "chosen", "lam 0.05", "before", "chosen"]
    assert {r["seed"] for r in rows} == {str(ml.TUNE_SEED), "0"}
    cfg = ml.load_config()
    sigmas = set()
    for r in rows:
        p = KernelFQIPrivacyParams(
            neighbour=cfg["neighbour"],
            users=int(r["users"]),
            reward_range=tuple(cfg["reward_range"]),
            gamma=float(r["gamma"]),
            iterations=int(r["iterations"]),
            actions=2,
            dims=4,
            betas=tuple(float(b) for b in r["beta"].split("/")),
            lam=float(r["lam"]),
            anchor_points=int(r["anchor_points"]),
            inducing_points=int(r["inducing_points"]),
            delta=ml.DELTA,
        )
        want = calibrate_kernel_fqi(p, epsilon=float(r["epsilon"])).sigma
        assert math.isclose(float(r["sigma"]), want, rel_tol=1e-12), (r["label"], want)
        sigmas.add(round(float(r["sigma"]), 12))
        assert float(r["private_lo"]) <= float(r["private"]) <= float(r["private_hi"])
    assert len(sigmas) == 2  # lam 0.05 has its own sigma (sqrt 4 = 2x the others)
    assert (tmp_path / "multid_levers.png").stat().st_size > 1000


def test_bootstrap_pairs_episodes_and_resamples_releases() -> None:
    """Constant releases give a degenerate interval at the exact fraction; releases that
    differ widen it; a private return equal to the ceiling on every episode is fraction 1
    with no spread even when episodes vary (ceiling and private are resampled together: an
    unpaired bootstrap would spread it)."""
    e = np.array([10.0, 200.0, 500.0, 90.0])
    floor = np.full(4, 20.0)
    same = ml.Scores(
        ceiling=e, floor=floor, private=np.tile(e, (5, 1)), sigma=1.0, noise_to_value=0.0
    )
    b = ml.bootstrap(same, draws=300)
    assert b["fraction"] == pytest.approx(1.0)
    assert b["fraction_lo"] == pytest.approx(1.0) and b["fraction_hi"] == pytest.approx(1.0)
    mixed = np.tile(e, (5, 1)) * np.array([[0.2], [0.6], [1.0], [0.5], [0.9]])
    w = ml.bootstrap(
        ml.Scores(ceiling=e, floor=floor, private=mixed, sigma=1.0, noise_to_value=0.0), draws=300
    )
    assert w["fraction_lo"] < w["fraction"] < w["fraction_hi"]
    assert w["release_min"] < w["release_max"]
