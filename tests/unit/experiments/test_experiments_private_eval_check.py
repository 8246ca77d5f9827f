"""qveil.experiments.private_eval_check (`qveil experiments private-eval`): the private
estimate beside the simulator's discounted value and episode return of the same policy."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

from server_helpers import REPO

from qveil.experiments.private_eval_check import PLAN, run


def test_the_plan_covers_every_fqi_config() -> None:
    """Every environment with an fqi config in configs/ (LunarLander has two: its default
    and the Sobol one its measured rows used), each planned config an fqi config of its env."""
    fqi = {}
    for path in (REPO / "configs").glob("*.toml"):
        with path.open("rb") as fh:
            cfg = tomllib.load(fh)
        if cfg.get("mode") == "fqi":
            fqi[path.name] = cfg["env_id"]
    assert {env for env, _, _, _ in PLAN} == set(fqi.values())
    assert all(fqi.get(config) == env for env, config, _, _ in PLAN)


def test_quick_run_records_value_and_return(tmp_path: Path) -> None:
    out = run(out=tmp_path, quick=True)
    with Path(out["csv"]).open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2
    for r in rows:
        # LineWalk pays at most 1 a step: the discounted value (gamma 0.5) is at most 2, the
        # episode return (50 steps) at least the value
        assert 0.0 <= float(r["true_value"]) <= 2.0 <= float(r["served_return"]) + 2.0
        assert float(r["served_return"]) >= float(r["true_value"]) - 1e-9
    assert Path(out["png"]).stat().st_size > 0
