"""qveil.dataset: validation (array + row in every error), refusals of bad npz files and bad
saves, the declared population and population averages, and the module's public surface.
Real files in tmp_path (the formats: test_dataset_npz.py and test_dataset_minari.py;
collection: tests/unit/trainer/test_trainer_collect.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dataset_helpers import LW, file_names, raw_arrays, small_dataset

import qveil.trainer  # noqa: F401  (registers qveil/LineWalk-v0)
from qveil.dataset import Dataset, Transitions, load_dataset, save_dataset, validate_arrays
from qveil.errors import InvalidArgument


@pytest.fixture(autouse=True)
def _minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``minari:ID`` locations resolve under this test's tmp_path, never the real home."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-root"))


# -- construction and validation -----------------------------------------------------------


def test_construction_normalises_and_freezes() -> None:
    raw = raw_arrays()
    ds = small_dataset(**raw, env_id=LW)
    assert (ds.n, ds.d, ds.users, len(ds)) == (20, 1, 4, 20)
    assert ds.s.shape == (20, 1) and ds.s2.shape == (20, 1)
    assert ds.user.dtype == np.int64 and ds.a.dtype == np.int64
    assert ds.s.dtype == np.float64 and ds.r.dtype == np.float64 and ds.terminal.dtype == bool
    for name in ("user", "s", "a", "r", "s2", "terminal"):
        arr = getattr(ds, name)
        assert not arr.flags.writeable
        assert not np.shares_memory(arr, raw[name])  # the caller's arrays are not aliased
    raw["r"][0] = 99.0  # changing the caller's array changes nothing inside
    assert ds.r[0] != 99.0


def test_fingerprint_is_canonical_and_sensitive() -> None:
    raw = raw_arrays()
    a = small_dataset(**raw)
    flat_vs_column = small_dataset(
        **{**raw, "s": raw["s"].reshape(-1, 1), "s2": raw["s2"].reshape(-1, 1)}
    )
    assert a.fingerprint() == flat_vs_column.fingerprint() and a == flat_vs_column
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", a.fingerprint())
    int32 = small_dataset(
        **{**raw, "a": raw["a"].astype(np.int32), "user": raw["user"].astype(np.int32)}
    )
    assert int32.fingerprint() == a.fingerprint()  # content, not the caller's dtypes
    seen = {a.fingerprint()}
    for name in ("user", "s", "a", "r", "s2", "terminal"):
        arr = raw[name].copy()
        if arr.dtype == bool:
            arr[3] = ~arr[3]
        elif name == "a":
            arr[3] = 1 - arr[3]
        elif name == "user":
            arr[3] = 77
        else:
            arr[3] = arr[3] * 0.5
        seen.add(small_dataset(**{**raw, name: arr}).fingerprint())
    seen.add(small_dataset(**raw, n_actions=3).fingerprint())
    seen.add(small_dataset(**raw, reward_range=(0.0, 0.5000000001)).fingerprint())
    seen.add(small_dataset(**raw, env_id=LW).fingerprint())
    assert len(seen) == 10  # every array and every metadata field is covered


def test_summary_keys_and_counts() -> None:
    ds = small_dataset(env_id=LW)
    s = ds.summary()
    assert s["users"] == 4 and s["samples"] == 20 and s["d"] == 1 and s["n_actions"] == 2
    assert sum(s["actions"]) == 20 and s["actions"] == np.bincount(ds.a, minlength=2).tolist()
    assert s["reward_range"] == [0.0, 0.5]
    assert s["reward_observed"] == [float(ds.r.min()), float(ds.r.max())]
    assert s["samples_per_user"] == {"min": 5, "max": 5} and s["terminals"] == 0
    assert s["env_id"] == LW and s["fingerprint"] == ds.fingerprint()
    json.dumps(s)  # serialisable as is


def _bad(name: str) -> tuple[dict[str, Any], str]:
    """Raw arrays broken in one way, and the regex its error must match (array and row)."""
    raw = raw_arrays()
    if name == "nan_s":
        raw["s"][7] = np.nan
        return raw, r"^s\[7, 0\] = nan is not finite"
    if name == "nan_r":
        raw["r"][5] = np.nan
        return raw, r"^r\[5\] = nan is not finite"
    if name == "inf_s2":
        raw["s2"][11] = -np.inf
        return raw, r"^s2\[11, 0\] = -inf is not finite"
    if name == "nan_s_2d":
        raw = raw_arrays(d=3)
        raw["s"][4, 2] = np.nan
        return raw, r"^s\[4, 2\] = nan is not finite"
    if name == "reward_high":
        raw["r"][17] = 0.73
        return raw, r"^r\[17\] = 0\.73 is outside the declared reward range \[0, 0\.5\]$"
    if name == "reward_low":
        raw["r"][2] = -1e-9
        return raw, r"^r\[2\] = -1e-09 is outside the declared reward range \[0, 0\.5\]$"
    if name == "action_high":
        raw["a"][9] = 2
        return raw, r"^a\[9\] = 2 is outside the env's actions \[0, 2\)$"
    if name == "action_negative":
        raw["a"][0] = -1
        return raw, r"^a\[0\] = -1 is outside the env's actions \[0, 2\)$"
    if name == "short_r":
        raw["r"] = raw["r"][:19]
        return raw, r"mismatched lengths: r has 19 rows but a has 20 \(row 19 "
    if name == "long_user":
        raw["user"] = np.append(raw["user"], 3)
        return raw, r"mismatched lengths: user has 21 rows but a has 20"
    if name == "short_s2":
        raw["s2"] = raw["s2"][:10]
        return raw, r"mismatched lengths: s2 has 10 rows but a has 20 \(row 10 "
    if name == "float_actions":
        raw["a"] = raw["a"].astype(np.float64)
        return raw, r"^a must hold integers \(int64\), got dtype float64"
    if name == "int_terminal":
        raw["terminal"] = raw["terminal"].astype(np.int64)
        return raw, r"^terminal must hold booleans, got dtype int64"
    if name == "string_rewards":
        raw["r"] = raw["r"].astype(str)
        return raw, r"^r must hold real numbers \(float64\), got dtype <U"
    if name == "d_mismatch":
        raw["s2"] = np.stack([raw["s2"], raw["s2"]], axis=1)
        return raw, r"s and s2 must have the same number of coordinates d, got s with 1 and s2 "
    if name == "s_3d":
        raw["s"] = raw["s"].reshape(20, 1, 1)
        return raw, r"^s must be \[n\] or \[n, d\], got shape \(20, 1, 1\)"
    if name == "a_2d":
        raw["a"] = raw["a"].reshape(20, 1)
        return raw, r"^a must be 1-D \[n\], got shape \(20, 1\)"
    if name == "empty":
        raw = {k: v[:0] for k, v in raw.items()}
        return raw, r"the dataset is empty"
    raise AssertionError(name)


BAD = [
    "nan_s",
    "nan_r",
    "inf_s2",
    "nan_s_2d",
    "reward_high",
    "reward_low",
    "action_high",
    "action_negative",
    "short_r",
    "long_user",
    "short_s2",
    "float_actions",
    "int_terminal",
    "string_rewards",
    "d_mismatch",
    "s_3d",
    "a_2d",
    "empty",
]


@pytest.mark.parametrize("case", BAD)
def test_bad_data_names_array_and_row(case: str) -> None:
    raw, pattern = _bad(case)
    with pytest.raises(InvalidArgument, match=pattern):
        Dataset(**raw, n_actions=2, reward_range=(0.0, 0.5))
    with pytest.raises(InvalidArgument, match=pattern):
        validate_arrays(Transitions.of(raw), n_actions=2, reward_range=(0.0, 0.5))


@pytest.mark.parametrize("case", BAD)
def test_bad_npz_file_is_refused_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    """A bad file written by another tool: load refuses it (array and row); and a Dataset
    corrupted behind the validator's back is refused by save_dataset, writing nothing."""
    raw, pattern = _bad(case)
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


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"n_actions": 0}, r"n_actions must be >= 1, got 0"),
        ({"n_actions": 2.0}, r"n_actions must be an integer"),
        ({"n_actions": True}, r"n_actions must be an integer"),
        ({"reward_range": (0.5, 0.5)}, r"reward_range must be finite with low < high"),
        ({"reward_range": (0.0, np.inf)}, r"reward_range must be finite with low < high"),
        ({"reward_range": (0.0,)}, r"reward_range must be two numbers"),
        ({"reward_range": "0,1"}, r"reward_range must be two numbers"),
        ({"env_id": ""}, r"env_id must be 1 to 256 printable"),
        ({"env_id": "x" * 500}, r"env_id must be 1 to 256 printable"),
        ({"env_id": 3}, r"env_id must be a string"),
    ],
)
def test_bad_metadata(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(InvalidArgument, match=pattern) as info:
        small_dataset(**kwargs)
    assert len(str(info.value)) < 200  # user input echoed at most 80 characters


# -- the declared rewards_are_population_averages --------------------------------------------


def test_population_averages_declaration_defaults_false_and_is_validated() -> None:
    assert small_dataset().rewards_are_population_averages is False
    assert small_dataset().summary()["rewards_are_population_averages"] is False
    for ok, want in ((True, True), (np.bool_(True), True), (np.array(False), False)):
        got = small_dataset(rewards_are_population_averages=ok).rewards_are_population_averages
        assert got is want
    for bad in (1, 0, "yes", None, 1.0, np.array([True]), np.array(1), np.array("True")):
        with pytest.raises(InvalidArgument, match="rewards_are_population_averages must be a bool"):
            small_dataset(rewards_are_population_averages=bad)


def test_population_averages_declaration_is_not_in_the_fingerprint() -> None:
    """A declaration about the data, not data: the ledger keys a dataset on its fingerprint,
    so declaring it must not make the same rows a new dataset with a fresh budget."""
    declared = small_dataset(rewards_are_population_averages=True)
    assert declared.fingerprint() == small_dataset().fingerprint()


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


@pytest.mark.parametrize("bad", ["", " x", "x ", "a\nb", "p" * 201, 3])
def test_a_bad_population_name_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="population name"):
        small_dataset(population=bad)


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
