"""Small datasets for the dataset tests: raw arrays, a Dataset of them, a folder's files."""

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
