"""``qveil experiments anchors-sweep --quick`` (200 private and 300 public CartPole users,
seconds): every planned combination on the tuning seed, then the config and the best of
them on the report seed; the accountant's sigma follows gamma and T, not the anchors."""

from __future__ import annotations

from pathlib import Path

import pytest
from experiment_helpers import read_rows, run_quick

from qveil.experiments import anchors_sweep as sw
from qveil.kfqi_config import KernelFQIConfig
from qveil.privacy.fqi import sup_sensitivity


def test_last_step_factor_is_gamma_d_t_minus_1_over_d_t() -> None:
    for gamma, t in ((0.7, 15), (0.3, 6), (0.9, 2)):
        d = [
            sup_sensitivity(
                neighbour="user", users=100, reward_range=(0.0, 1.0), gamma=gamma, iterations=it
            )  # fmt: skip
            for it in (t - 1, t)
        ]
        assert sw.last_step_factor(gamma, t) == pytest.approx(gamma * d[0] / d[1], rel=1e-12)


def test_quick_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QVEIL_LEVERS_CACHE", str(tmp_path / "cache"))
    run_quick("anchors-sweep", tmp_path)
    rows = read_rows(tmp_path / "anchors_sweep.csv", sw.COLUMNS)
    assert (tmp_path / "anchors_sweep.png").stat().st_size > 10_000
    labels = [r["label"] for r in rows]
    assert labels[0] == labels[3] == "config (6^4 grid)"
    assert labels[1:3] == [
        "K=16 states=200000 neighbours=8 bandwidth=0.2",
        "K=16 states=200000 neighbours=8 bandwidth=0.2 gamma=0.5 iterations=10",
    ]
    assert labels[4] in labels[1:3]  # the tuning seed's best, on the report seed
    # sigma: the same for the grid and the anchors at one gamma; smaller at gamma 0.5
    assert rows[0]["sigma"] == rows[1]["sigma"]
    assert float(rows[2]["sigma"]) < float(rows[1]["sigma"])
    assert rows[1]["anchor_sha256"] == rows[2]["anchor_sha256"] != ""
    # the sum-of-squares lever's best case: sigma x gamma D_{T-1} / D_T, labelled as no release
    assert len(rows) == 7
    for r, base in ((rows[5], rows[3]), (rows[6], rows[4])):
        assert r["label"].startswith(base["label"]) and "not a release" in r["label"]
        f = sw.last_step_factor(float(base["gamma"]), int(base["iterations"]))
        assert float(r["sigma"]) == pytest.approx(f * float(base["sigma"]), rel=1e-12)
    for r in rows:
        assert float(r["private_lo"]) <= float(r["private"]) <= float(r["private_hi"])


def test_lower_gamma_puts_the_default_at_the_pessimistic_end() -> None:
    for gamma, t, low in ((0.5, 10, -200.0), (0.3, 6, -1000.0 / 7.0), (0.2, 5, -125.0)):
        ch = sw.lower_gamma(gamma, t, (-100.0, 100.0))
        assert ch == {"gamma": gamma, "iterations": t, "default_value": pytest.approx(low)}
        cfg = sw.plan_config(None, 0, ch, base=sw.LUNAR_SOBOL, env_id="LunarLander-v3")
        spec = KernelFQIConfig.from_dict(cfg).spec(8)
        assert spec.default_value((-100.0, 100.0)) == ch["default_value"]  # in the Q range


def test_lunar_target_keeps_the_reference_anchors_unless_a_k_is_given() -> None:
    target = sw.TARGETS["LunarLander-v3"]
    ref = target.reference()
    assert (ref["anchors"], ref["anchor_count"], ref["gamma"], ref["default_value"]) == (
        "sobol", 4096, 0.5, -200.0,
    )  # fmt: skip
    count, states, ch = target.plan[0]
    assert count is None
    cfg = sw.plan_config(count, states, ch, base=ref, env_id=target.env_id)
    assert cfg == {**ref, **ch}
    assert sw.label(count, states, ch) == (
        "reference anchors gamma=0.3 iterations=6 default_value=-142.857"
    )
