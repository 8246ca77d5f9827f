"""``qveil experiments anchors-lever --quick`` (200 private and 300 public CartPole users,
seconds): the rows, the anchor file the visitation rows use (public, cached, of the
config's box and the same bits when rebuilt) and the plot."""

from __future__ import annotations

from pathlib import Path

import pytest
from experiment_helpers import read_rows, run_quick

from qveil.experiments import anchors_lever as al
from qveil.experiments.multid_levers import load_config
from qveil.kfqi_anchors import read_anchors


def test_quick_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QVEIL_LEVERS_CACHE", str(tmp_path / "cache"))
    run_quick("anchors-lever", tmp_path)
    rows = read_rows(tmp_path / "anchors_lever.csv", al.COLUMNS)
    assert [(r["label"], r["anchors"], r["anchor_count"]) for r in rows] == [
        ("config (6^4 grid)", "grid", "1296"),
        ("visitation K=16 k=8 h=0.2", "file", "16"),
    ]
    assert (tmp_path / "anchors_lever.png").stat().st_size > 10_000
    # the accountant's sigma does not depend on the anchors
    assert rows[0]["sigma"] == rows[1]["sigma"] and float(rows[0]["sigma"]) > 0
    for r in rows:
        assert float(r["private_lo"]) <= float(r["private"]) <= float(r["private_hi"])
    # the anchors: a public file of the config's box, rebuilt bit for bit from its data
    cfg = load_config()
    path = al.anchor_file(16, cfg, public_users=300)
    a = read_anchors(path)
    assert rows[1]["anchor_sha256"] == a.sha256 and "collection seed 100" in a.origin
    assert a.state_intervals == tuple(tuple(iv) for iv in cfg["state_intervals"])
    path.unlink()
    assert read_anchors(al.anchor_file(16, cfg, public_users=300)).sha256 == a.sha256
