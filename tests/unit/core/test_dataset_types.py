"""A dataset in memory (qveil.dataset_types): construction (normalised, frozen, not aliasing
the caller's arrays), the canonical fingerprint, the summary, validation naming the array and
row, the metadata's and declarations' checks, and a file's rows resolved against the
caller's reward range and action count (DatasetRows)."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest
from dataset_helpers import BAD_ARRAYS, LW, bad_arrays, raw_arrays, small_dataset

from qveil.dataset_types import Dataset, DatasetRows, check_population_name, validate_arrays
from qveil.errors import InvalidArgument
from qveil.transitions import Transitions

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


@pytest.mark.parametrize("case", BAD_ARRAYS)
def test_bad_data_names_array_and_row(case: str) -> None:
    raw, pattern = bad_arrays(case)
    with pytest.raises(InvalidArgument, match=pattern):
        Dataset(**raw, n_actions=2, reward_range=(0.0, 0.5))
    with pytest.raises(InvalidArgument, match=pattern):
        validate_arrays(Transitions.of(raw), n_actions=2, reward_range=(0.0, 0.5))


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


@pytest.mark.parametrize("bad", ["", " x", "x ", "a\nb", "p" * 201, 3])
def test_a_bad_population_name_is_refused(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="population name"):
        small_dataset(population=bad)


def test_check_population_name() -> None:
    assert check_population_name("clinic-2026") == "clinic-2026"
    with pytest.raises(InvalidArgument, match="^a population name is 1 to 200 printable"):
        check_population_name(" pop")
    with pytest.raises(InvalidArgument) as exc:
        check_population_name("y" * 300)
    assert len(str(exc.value)) < 200  # the name echoed at most 80 characters


def _rows(**declared: Any) -> DatasetRows:
    return DatasetRows(where="f.npz", arrays=Transitions.of(raw_arrays()), **declared)


def test_rows_take_the_declared_or_the_given_metadata() -> None:
    declared = _rows(n_actions=2, reward_range=(0.0, 0.5))
    ds = declared.dataset()
    assert ds == small_dataset()
    assert declared.dataset(reward_range=(0.0, 0.5), n_actions=2) == ds  # agreeing is fine
    assert _rows().dataset(reward_range=(0.0, 0.5), n_actions=2) == ds


@pytest.mark.parametrize(
    ("declared", "given", "message"),
    [
        ({"reward_range": (0.0, 0.5)}, {"reward_range": (0.0, 1.0), "n_actions": 2},
         r"^'f.npz' declares the reward range \[0, 0.5\], not \[0, 1\]$"),
        ({"n_actions": 2}, {"reward_range": (0.0, 0.5), "n_actions": 3},
         r"^'f.npz' declares 2 actions \(n_actions\), not 3$"),
        ({}, {"n_actions": 2}, r"^'f.npz' declares no reward range; give it \(--reward-range"),
        ({}, {"reward_range": (0.0, 0.5)}, r"^'f.npz' declares no action count"),
    ],
)  # fmt: skip
def test_rows_refuse_disagreeing_or_missing_metadata(
    declared: dict[str, Any], given: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _rows(**declared).dataset(**given)


def test_rows_summary_without_declared_metadata() -> None:
    s = _rows().summary()
    assert s["reward_range"] is None and s["n_actions"] is None and s["fingerprint"] is None
    assert sum(s["actions"]) == 20 and s["users"] == 4
    full = _rows(n_actions=2, reward_range=(0.0, 0.5)).summary()
    assert full == small_dataset().summary()
