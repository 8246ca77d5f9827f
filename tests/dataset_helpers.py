"""Small datasets for the dataset tests: raw arrays, a Dataset of them, a folder's files, and
raw arrays broken in each way a dataset is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qveil.dataset import Dataset

#: the LineWalk env (registered by importing qveil.trainer)
LW = "qveil/LineWalk-v0"


def raw_arrays(n: int = 20, d: int = 1, seed: int = 0) -> dict[str, Any]:
    """A small valid dataset as raw arrays: 4 users, LineWalk-like rewards in [0, 0.5]."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(0, 1, size=(n, d) if d > 1 else n)
    return {
        "user": np.repeat(np.arange(4), n // 4).astype(np.int64),
        "s": s,
        "a": rng.integers(0, 2, n).astype(np.int64),
        "r": rng.uniform(0, 0.5, n),
        "s2": rng.uniform(0, 1, size=s.shape),
        "terminal": np.zeros(n, dtype=bool),
    }


def small_dataset(**overrides: Any) -> Dataset:
    """The Dataset of :func:`raw_arrays` (2 actions, rewards in [0, 0.5]), fields overridden."""
    kw: dict[str, Any] = {**raw_arrays(), "n_actions": 2, "reward_range": (0.0, 0.5)}
    kw.update(overrides)
    return Dataset(**kw)


def file_names(path: Path) -> list[str]:
    """The sorted names in folder ``path``."""
    return sorted(p.name for p in path.iterdir())


def bad_arrays(name: str) -> tuple[dict[str, Any], str]:
    """Raw arrays (:func:`raw_arrays`) broken in one way, and the regex its error must match
    (array and row)."""
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


#: every way :func:`bad_arrays` breaks a dataset
BAD_ARRAYS = [
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
