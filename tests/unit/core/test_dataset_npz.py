"""The npz format of datasets (qveil.dataset_npz): a round trip keeps every array and the
fingerprint in the documented layout; a minimal file of another tool (flat states, no reward
range) reads with the range given; missing arrays, a file that is not a zip, an absent file
and pickled arrays are refused (never unpickled); an overwrite is atomic, and locations that
are not a dataset are refused. Real files in tmp_path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from dataset_helpers import LW, file_names, raw_arrays, small_dataset

import qveil.trainer  # noqa: F401  (registers qveil/LineWalk-v0)
from qveil.dataset import load_dataset, save_dataset
from qveil.errors import InvalidArgument, NotFound
from qveil.trainer.collect import collect


def test_npz_round_trip_keeps_everything(tmp_path: Path) -> None:
    ds = collect(LW, 30, seed=5, episodes_per_user=2)
    path = tmp_path / "lw.npz"
    save_dataset(ds, path)
    assert file_names(tmp_path) == ["lw.npz"]  # no temporary left behind
    back = load_dataset(path)
    assert back.fingerprint() == ds.fingerprint()
    for name in ("user", "s", "a", "r", "s2", "terminal"):
        np.testing.assert_array_equal(getattr(back, name), getattr(ds, name))
    assert (back.n_actions, back.reward_range, back.env_id) == (2, (0.0, 0.5), LW)
    assert back.behaviour == ds.behaviour == "random"
    with np.load(path, allow_pickle=False) as z:  # the documented layout
        assert set(z.files) == {
            "user", "s", "a", "r", "s2", "terminal",
            "format", "n_actions", "reward_low", "reward_high", "env_id", "behaviour",
        }  # fmt: skip
        assert str(z["format"]) == "qveil-dataset/1" and z["user"].dtype == np.int64


def test_npz_from_another_tool_with_flat_states(tmp_path: Path) -> None:
    """Minimal file: the six arrays, s as [n], n_actions; the range comes from the caller."""
    raw = raw_arrays()
    np.savez(tmp_path / "ext.npz", **raw, n_actions=np.int64(2))
    with pytest.raises(InvalidArgument, match="declares no reward range"):
        load_dataset(tmp_path / "ext.npz")
    ds = load_dataset(tmp_path / "ext.npz", reward_range=(0.0, 0.5))
    assert ds == small_dataset(**raw)
    np.savez(tmp_path / "declared.npz", **raw, n_actions=2, reward_low=0.0, reward_high=0.5)
    with pytest.raises(InvalidArgument, match=r"declares the reward range \[0, 0\.5\], not"):
        load_dataset(tmp_path / "declared.npz", reward_range=(0.0, 1.0))
    missing = {k: v for k, v in raw.items() if k != "terminal"}
    np.savez(tmp_path / "missing.npz", **missing, n_actions=2)
    with pytest.raises(InvalidArgument, match="lacks the array.*terminal"):
        load_dataset(tmp_path / "missing.npz", reward_range=(0.0, 0.5))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InvalidArgument, match="is not an .npz file .* starts with 'not a zip'"):
        load_dataset(tmp_path / "junk.npz")
    with pytest.raises(NotFound):
        load_dataset(tmp_path / "absent.npz")
    np.savez(tmp_path / "pickled.npz", **{**raw, "r": raw["r"].astype(object)}, n_actions=2)
    with pytest.raises(InvalidArgument, match="not a readable"):  # never unpickled
        load_dataset(tmp_path / "pickled.npz", reward_range=(0.0, 0.5))


def test_npz_overwrite_is_atomic(tmp_path: Path) -> None:
    a, b = collect(LW, 3, seed=1), collect(LW, 4, seed=2)
    path = tmp_path / "d.npz"
    save_dataset(a, path)
    save_dataset(b, path)
    assert load_dataset(path) == b and file_names(tmp_path) == ["d.npz"]
    with pytest.raises(NotFound):
        save_dataset(a, tmp_path / "nope" / "d.npz")
    with pytest.raises(InvalidArgument, match="unknown dataset location"):
        save_dataset(a, tmp_path / "d.txt")
    with pytest.raises(InvalidArgument, match="reads CSV but does not write it"):
        save_dataset(a, tmp_path / "d.csv")
