"""The store logs answered values as the answer log hands them over, bit for bit.

A d = 4 release with 3 actions gets a stream of calls (new states, answered ones,
duplicates, rounded coordinates that repeat, 1..300 states a call). Each call is logged the
way :mod:`qveil.server.serving.answer_log` logs it: per (action, coordinate) path, the call's
snapped coordinates and their values from the release's key (``KeyedPaths.coordinate_values``), all
paths in one ``record_paths``. Checked on memory and SQLite:

* each call writes exactly its (path, state) pairs not logged before, and counts no mismatch;
* a call whose states are all logged reads nothing from the database and opens no write
  transaction (the in-process copy answers "logged already");
* after reopening, every path's log holds exactly the pairs handed over, with the values
  bit for bit, and the memory and SQLite logs are the same rows (seq, state, value, hash).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from store_helpers import keyed_paths, make_release

from qveil.keyed import KeyedPaths, snap
from qveil.server.store import open_store

D, ACTIONS = 4, 3
BETAS = [0.7, 2.0, 0.3, 5.0]
PATHS = [a * D + j for a in range(ACTIONS) for j in range(D)]


def _calls(seed: int) -> Iterator[np.ndarray]:
    """(n, D) unit states: fresh ones, earlier ones, duplicates, mixes, batch sizes 1..300."""
    rng = np.random.default_rng(seed)
    seen = rng.uniform(0, 1, (40, D))
    for k in range(40):
        n = int(rng.choice([1, 2, 7, 64, 300]))
        fresh = rng.uniform(0, 1, (n, D))
        old = seen[rng.integers(0, seen.shape[0], n)]
        pick = rng.uniform(size=n) < (0.0 if k < 5 else 0.8 if k % 3 else 1.0)
        xs = np.where(pick[:, None], old, fresh)
        seen = np.concatenate([seen, xs])
        yield np.round(xs, 3) if k % 4 == 0 else xs  # rounded: coordinate values repeat


def _handover(kp: KeyedPaths, units: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """What the answer log hands the store for one call: per path, the snapped coordinates
    and their values (a state asked twice is handed over once)."""
    idx, snapped = snap(units)
    coords = kp.coordinate_values(idx)  # (n, actions, D)
    xs, gs = [], []
    for p in PATHS:
        a, j = divmod(p, D)
        pairs = dict(zip(snapped[:, j].tolist(), coords[:, a, j].tolist(), strict=True))
        xs.append(np.fromiter(pairs.keys(), np.float64))
        gs.append(np.fromiter(pairs.values(), np.float64))
    return xs, gs


class Counted:
    """Counts a real store's database reads and write transactions."""

    def __init__(self, st: Any) -> None:
        self.calls = {"_db_fetch_since": 0, "_db_fetch_since_many": 0, "_db_write_txn": 0}
        for name in self.calls:
            fn = getattr(st, name)

            def counted(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
                self.calls[_name] += 1
                return _fn(*a, **k)

            setattr(st, name, counted)


def _release(st: Any) -> Any:
    return make_release(
        st, "r", n_actions=ACTIONS, sigma=1.5, beta=0.7, interval=(0.0, 1.0), betas=BETAS
    )


def _url(kind: str, tmp: Path) -> str:
    return f"memory://{uuid.uuid4().hex}" if kind == "memory" else f"sqlite:///{tmp / 'log.sqlite'}"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_calls_are_logged_once_and_read_back_bit_for_bit(kind: str, tmp_path: Path) -> None:
    url = _url(kind, tmp_path)
    want: dict[int, dict[float, float]] = {p: {} for p in PATHS}
    with open_store(url) as st:
        kp = keyed_paths(_release(st))
        counted = Counted(st)
        quiet = 0
        for units in _calls(5):
            xs, gs = _handover(kp, units)
            new = sum(len(set(x.tolist()) - want[p].keys()) for p, x in zip(PATHS, xs, strict=True))
            before = dict(counted.calls)
            assert st.record_paths("r", PATHS, xs, gs) == (new, 0)
            if new == 0:
                quiet += 1
                assert counted.calls == before, "a call of logged states touched the database"
            for p, x, g in zip(PATHS, xs, gs, strict=True):
                want[p].update(zip(x.tolist(), g.tolist(), strict=True))
        assert 5 < quiet < 40, quiet
        assert st.count_points("r") == sum(len(v) for v in want.values())
    with open_store(url) as st:
        assert st.verify("r").ok
        rows = {p: [(q.seq, q.x, q.g, q.hash) for q in st.iter_points("r", p)] for p in PATHS}
    for p in PATHS:
        assert len(rows[p]) == len(want[p])
        got = np.array([g for _s, _x, g, _h in rows[p]])
        assert got.tobytes() == np.array([want[p][x] for _s, x, _g, _h in rows[p]]).tobytes()
    if kind == "sqlite":  # the same calls on the memory backend: the same rows
        with open_store("memory://") as mem:
            _release(mem)
            for units in _calls(5):
                xs, gs = _handover(kp, units)
                mem.record_paths("r", PATHS, xs, gs)
            for p in PATHS:
                assert [(q.seq, q.x, q.g, q.hash) for q in mem.iter_points("r", p)] == rows[p]
