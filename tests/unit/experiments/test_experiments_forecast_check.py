"""qveil.experiments.forecast_check (`qveil experiments forecast`): its plan covers every
environment with an fqi config, and a quick run writes its table and plot."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

from server_helpers import REPO

from qveil.experiments.forecast_check import MEASURED, PLAN, run


def test_the_plan_covers_every_fqi_config() -> None:
    """Every environment with an fqi config in configs/ (LunarLander has two: its default
    and the Sobol one its measured rows used), each planned config an fqi config of its env."""
    fqi = {}
    for path in (REPO / "configs").glob("*.toml"):
        with path.open("rb") as fh:
            cfg = tomllib.load(fh)
        if cfg.get("mode") == "fqi":
            fqi[path.name] = cfg["env_id"]
    assert {env for env, _, _ in PLAN} == set(fqi.values())
    assert all(fqi.get(config) == env for env, config, _ in PLAN)
    planned = {(env, n) for env, _, sizes in PLAN for n in sizes}
    assert set(MEASURED) <= planned  # every served measurement has its forecast


def test_quick_run_writes_table_and_plot(tmp_path: Path) -> None:
    out = run(out=tmp_path, plan=[("qveil/LineWalk-v0", "linewalk-private.toml", [300])])
    with Path(out["csv"]).open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 1 and float(rows[0]["forecast"]) > 0.5
    assert float(rows[0]["measured_served"]) > 0.9
    assert Path(out["png"]).stat().st_size > 0
