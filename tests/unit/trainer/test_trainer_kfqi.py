"""The clipped-rows report of the kernel fqi fit (qveil.trainer.kfqi.check_clipping): rows
whose state or next state lies outside the config's state intervals are counted; a warning
above CLIP_WARN of the rows, a refusal above CLIP_REFUSE unless allow_clipping, nothing
written on a refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qveil.additive import StateBox
from qveil.errors import FailedPrecondition
from qveil.fqi_config import CLIP_REFUSE, CLIP_WARN
from qveil.kfqi_config import load_fqi_config
from qveil.trainer.collect import collect
from qveil.trainer.kfqi import check_clipping, fit_kernel, train_kernel_fqi

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "linewalk-private.toml"


def test_rows_outside_counts_the_state_or_the_next_state() -> None:
    box = StateBox.of([[0.0, 1.0], [-1.0, 1.0]])
    s = np.array([[0.5, 0.0], [1.5, 0.0], [0.5, 0.0], [0.5, -2.0]])
    s2 = np.array([[0.5, 0.0], [0.5, 0.0], [0.5, 3.0], [0.5, 0.0]])
    assert box.rows_outside(s) == 2 and box.rows_outside(s, s2) == 3


def test_thresholds(tmp_path: Path) -> None:
    ds = collect("qveil/LineWalk-v0", 40, 1)
    cfg = load_fqi_config(CONFIG)
    inside = fit_kernel(cfg.replace(state_intervals=((0.0, 1.0),)), ds)
    assert inside.states_clipped == 0 and check_clipping(inside) is None
    # an upper bound for each band of the clipped share: none, a warning, a refusal
    shares = {hi: StateBox.of([[0.0, hi]]).rows_outside(ds.s, ds.s2) / ds.n
              for hi in np.linspace(0.3, 1.0, 71)}  # fmt: skip
    warn = min((h for h, v in shares.items() if CLIP_WARN < v <= CLIP_REFUSE), default=None)
    refuse = min(h for h, v in shares.items() if v > CLIP_REFUSE)
    assert warn is not None
    fit = fit_kernel(cfg.replace(state_intervals=((0.0, warn),)), ds)
    assert fit.states_clipped == round(shares[warn] * ds.n)
    assert "outside the config's state_intervals" in str(check_clipping(fit))
    fit = fit_kernel(cfg.replace(state_intervals=((0.0, refuse),)), ds)
    with pytest.raises(FailedPrecondition, match="--allow-clipping"):
        check_clipping(fit)
    assert check_clipping(fit, allow_clipping=True) is not None
    with pytest.raises(FailedPrecondition, match="refusing: .* rows"):
        train_kernel_fqi(fit.cfg, ds, tmp_path / "b", force=True)
    assert not (tmp_path / "b").exists()
