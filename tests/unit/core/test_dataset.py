"""qveil.dataset: refusals of bad npz files and bad saves (array + row in every error), the
declared population and population averages through the files, and the module's public
surface (a Dataset's own construction and validation: test_dataset_types.py).
Real files in tmp_path (the formats: test_dataset_npz.py and test_dataset_minari.py;
collection: tests/unit/trainer/test_trainer_collect.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dataset_helpers import BAD_ARRAYS, LW, bad_arrays, file_names, raw_arrays, small_dataset

import qveil.trainer  # noqa: F401  (registers qveil/LineWalk-v0)
from qveil.dataset import Dataset, load_dataset, save_dataset
from qveil.errors import InvalidArgument


@pytest.fixture(autouse=True)
def _minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``minari:ID`` locations resolve under this test's tmp_path, never the real home."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-root"))


@pytest.mark.parametrize("case", BAD_ARRAYS)
def test_bad_npz_file_is_refused_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    """A bad file written by another tool: load refuses it (array and row); and a Dataset
    corrupted behind the validator's back is refused by save_dataset, writing nothing."""
    raw, pattern = bad_arrays(case)
    src = tmp_path / "in"
    src.mkdir()
    np.savez(src / "bad.npz", **raw, n_actions=np.int64(2), reward_low=0.0, reward_high=0.5)
    with pytest.raises(InvalidArgument, match=pattern):
        load_dataset(src / "bad.npz")
    good = small_dataset()
    out = tmp_path / "out"
    out.mkdir()
    for name, value in raw.items():  # bypass the frozen dataclass, as a buggy caller might
        object.__setattr__(good, name, value)
    for target in (out / "x.npz", out / "x-v0"):
        with pytest.raises(InvalidArgument, match=pattern):
            save_dataset(good, target)
    assert file_names(out) == []


# -- the declared rewards_are_population_averages --------------------------------------------


@pytest.mark.parametrize("flag", [True, False])
def test_population_averages_declaration_round_trips(tmp_path: Path, flag: bool) -> None:
    ds = small_dataset(env_id=LW, rewards_are_population_averages=flag)
    save_dataset(ds, tmp_path / "d.npz")
    with np.load(tmp_path / "d.npz") as z:  # absent when False: old files read the same
        assert ("rewards_are_population_averages" in z.files) is flag
    back = load_dataset(tmp_path / "d.npz")
    assert back.rewards_are_population_averages is flag and back == ds
    save_dataset(back, tmp_path / "d-v0")  # Minari: under the qveil metadata key
    meta = json.loads((tmp_path / "d-v0" / "data" / "metadata.json").read_text())
    assert meta["qveil"]["rewards_are_population_averages"] is flag
    again = load_dataset(tmp_path / "d-v0")
    assert again.rewards_are_population_averages is flag and again == ds
    save_dataset(again, tmp_path / "e.npz")
    assert load_dataset(tmp_path / "e.npz").rewards_are_population_averages is flag


def test_population_averages_declaration_of_the_wrong_type_in_a_file_is_refused(
    tmp_path: Path,
) -> None:
    np.savez(
        tmp_path / "d.npz",
        **raw_arrays(),
        n_actions=2,
        reward_low=0.0,
        reward_high=0.5,
        rewards_are_population_averages=1,
    )
    with pytest.raises(InvalidArgument, match="rewards_are_population_averages must be a bool"):
        load_dataset(tmp_path / "d.npz")


# -- the declared population ------------------------------------------------------------------


@pytest.mark.parametrize("name", [None, "clinic-2026"])
def test_declared_population_round_trips_and_is_read_from_metadata_alone(
    tmp_path: Path, name: str | None
) -> None:
    """npz and Minari keep the declaration; ``declared_population`` reads it without the rows;
    it is not in the fingerprint (a declaration, not data)."""
    from qveil.dataset import declared_metadata

    ds = small_dataset(env_id=LW, population=name)
    assert ds.fingerprint() == small_dataset(env_id=LW).fingerprint()
    assert ds.summary()["population"] == name
    save_dataset(ds, tmp_path / "d.npz")
    assert declared_metadata(tmp_path / "d.npz").population == name
    assert load_dataset(tmp_path / "d.npz").population == name
    save_dataset(ds, tmp_path / "d-v0")
    assert declared_metadata(tmp_path / "d-v0").population == name
    assert load_dataset(tmp_path / "d-v0").population == name


# -- the module ----------------------------------------------------------------------------


def test_public_surface() -> None:
    import qveil.dataset
    import qveil.trainer.collect

    assert qveil.dataset.__all__ == sorted(qveil.dataset.__all__)
    assert {"Dataset", "load_dataset", "save_dataset", "validate_arrays"} <= set(
        qveil.dataset.__all__
    )
    assert qveil.trainer.collect.__all__ == ["collect", "env_reward_range"]
    fields = [f for f in Dataset.__dataclass_fields__ if not f.startswith("_")]
    assert fields == [
        "user", "s", "a", "r", "s2", "terminal", "n_actions", "reward_range", "env_id",
        "rewards_are_population_averages", "population", "behaviour",
    ]  # fmt: skip


def test_dataset_module_imports_numpy_only() -> None:
    """qveil.dataset must not pull gymnasium or torch (the server and client import it)."""
    import subprocess
    import sys

    code = (
        "import sys, qveil.dataset; "
        "bad = [m for m in ('gymnasium', 'torch', 'minari', 'h5py') if m in sys.modules]; "
        "print(bad)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
