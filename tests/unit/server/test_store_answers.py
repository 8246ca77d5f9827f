"""The serving fast paths answer bit for bit what the general path answers.

Two stores seeded alike get the same sequence of requests (new states, stored states,
duplicates, d = 4 coordinate paths): one through the general path (``get_or_sample_paths``
on each request's unique values, as the handlers always did), the other through the fast
path (``known_values`` when every state is stored, else ``reserve`` and then the general
path). Every answer must have the same bytes. A request of stored states must not touch the
database; a request with new states reads the database once (``reserve``), whatever the
number of paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from store_helpers import make_release

from qveil.server.quotas import QuotaConfig, Quotas
from qveil.server.store import open_store

D, ACTIONS = 4, 3


def _stores(kind: str, tmp: Path) -> Iterator[Any]:
    for name in ("general", "fast"):
        url = "memory://" if kind == "memory" else f"sqlite:///{tmp / f'{name}.sqlite'}"
        st = open_store(url, rng=1234)
        make_release(
            st,
            "r",
            n_actions=ACTIONS,
            sigma=1.5,
            beta=0.7,
            interval=(0.0, 1.0),
            betas=[0.7, 2.0, 0.3, 5.0],
        )
        yield st


def _requests(seed: int) -> Iterator[np.ndarray]:
    """(n, D) unit states: fresh ones, stored ones, duplicates, mixes, batch sizes 1..300."""
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


def _general(st: Any, xs: np.ndarray) -> list[np.ndarray]:
    cols = [np.unique(xs[:, j], return_inverse=True) for j in range(D)]
    paths = [a * D + j for a in range(ACTIONS) for j in range(D)]
    gs = st.get_or_sample_paths("r", paths, [cols[p % D][0] for p in paths])
    return [g[cols[p % D][1].reshape(-1)] for p, g in zip(paths, gs, strict=True)]


class Counted:
    """Counts the reads of a real store's in-process copies from its database."""

    def __init__(self, st: Any) -> None:
        self.calls = {"_db_fetch_since": 0, "_db_fetch_since_many": 0}
        for name in self.calls:
            fn = getattr(st, name)

            def counted(*a: Any, _fn: Any = fn, _name: str = name, **k: Any) -> Any:
                self.calls[_name] += 1
                return _fn(*a, **k)

            setattr(st, name, counted)


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_fast_path_answers_bit_for_bit_and_reads_once(kind: str, tmp_path: Path) -> None:
    general, fast = _stores(kind, tmp_path)
    quotas = Quotas(QuotaConfig(new_state_rate=1e9))
    paths = [a * D + j for a in range(ACTIONS) for j in range(D)]
    counted = Counted(fast)
    hits = 0
    for xs in _requests(5):
        want = _general(general, xs)
        before = dict(counted.calls)
        got = fast.known_values("r", paths, [xs[:, p % D] for p in paths])
        if got is not None:
            hits += 1
            assert counted.calls == before, "a request of stored states read the database"
        else:
            cols = [np.unique(xs[:, j], return_inverse=True) for j in range(D)]
            pairs = [(p, cols[p % D][0]) for p in paths]
            index = [cols[p % D][1].reshape(-1) for p in paths]
            ticket = fast.reserve("r", pairs, quotas=quotas, caller="c", rows=(xs, index))
            assert ticket > 0
            many = counted.calls["_db_fetch_since_many"] - before["_db_fetch_since_many"]
            assert many == 1, "reserve reads the database once per request"
            try:
                got = _general(fast, xs)
            finally:
                quotas.done("r", ticket)
        for w, g in zip(want, got, strict=True):
            assert w.tobytes() == g.tobytes()
    assert 5 < hits < 40, hits
    for st in (general, fast):
        st.close()


def test_known_values_misses_anything_not_stored() -> None:
    """NaN, out-of-range or unseen states are not found (the caller takes the general path,
    which refuses bad input); a path out of range is refused."""
    from qveil.errors import InvalidArgument

    st = open_store("memory://", rng=3)
    st.create_release(
        release_id="r", fingerprint="f", sigma=1.0, beta=1.0, interval=(0, 1), n_actions=2
    )
    xs = np.array([0.25, 0.5])
    g = np.column_stack(st.get_or_sample_paths("r", [0, 1], [xs, xs]))
    got = st.known_values("r", [0, 1], [xs, xs])
    assert got is not None
    assert np.column_stack(got).tobytes() == g.tobytes()
    for bad in (np.array([np.nan]), np.array([1.5]), np.array([0.75]), np.array([0.25, 0.3])):
        assert st.known_values("r", [0], [bad]) is None
    with pytest.raises(InvalidArgument):
        st.known_values("r", [2], [xs])


def test_stored_values_without_blocking_match_get_values(tmp_path: Path) -> None:
    """``QueryService.get_stored_values`` (the data plane runs it on the event loop) answers a
    request of stored states with the bytes ``get_values`` answers, and None for any request
    with a new state (nothing stored by it); its refusals are get_values' refusals."""
    from server_helpers import make_bundle

    from qveil.errors import InvalidArgument
    from qveil.server.services import Services

    bundle = make_bundle(tmp_path / "bundle")
    with open_store(f"sqlite:///{tmp_path / 'store.sqlite'}", rng=9) as st:
        services = Services.create(store=st)
        services.releases.start(bundle)
        h = services.query
        rng = np.random.default_rng(4)
        seen = rng.uniform(-1.0, 2.0, 50)
        stored_hits = 0
        for k in range(30):
            n = int(rng.choice([1, 3, 64, 500]))
            xs = np.where(
                rng.uniform(size=n) < 0.7, seen[rng.integers(0, 50, n)], rng.uniform(-1, 2, n)
            )
            acts = [] if k % 2 else [2, 0]
            before = st.count_points()
            fast = h.get_stored_values(xs, acts)
            assert st.count_points() == before
            full = h.get_values(xs, acts)
            if fast is None:
                assert st.count_points() > before or k == 0
            else:
                stored_hits += 1
                assert fast.values.tobytes() == full.values.tobytes()
                assert (fast.release_id, fast.actions, fast.value_grid) == (
                    full.release_id,
                    full.actions,
                    full.value_grid,
                )
            seen = np.concatenate([seen, xs])
        assert stored_hits >= 5
        with pytest.raises(InvalidArgument):
            h.get_stored_values([float("nan")])
