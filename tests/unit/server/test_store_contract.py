"""Contract suite of qveil.server.store, run on every backend (memory, SQLite file, PostgreSQL).

PostgreSQL cases use the ``pg_url`` fixture (a fresh database; skipped outside CI when the
server is absent, failing under CI=true)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from store_helpers import (
    BETA,
    RID,
    SIGMA,
    check_seen,
    make_release,
    stored,
)

from qveil.errors import IntegrityError, InvalidArgument, NotFound
from qveil.rng import OSEntropy
from qveil.server.store import open_store
from qveil.stats import normality_report, whiten


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


def test_releases(url: str) -> None:
    with open_store(url, rng=1) as s:
        assert s.list_releases() == []
        rec = s.create_release(
            release_id=RID, fingerprint="fp", sigma=SIGMA, beta=BETA, interval=(-1, 2), n_actions=3
        )
        assert (rec.sigma, rec.beta, rec.interval, rec.n_actions, rec.status) == (
            SIGMA,
            BETA,
            (-1.0, 2.0),
            3,
            "staged",
        )
        assert s.create_release(
            release_id=RID, fingerprint="fp", sigma=SIGMA, beta=BETA, interval=(-1, 2), n_actions=3
        ) == s.get_release(RID)
        with pytest.raises(InvalidArgument, match="different parameters"):
            s.create_release(
                release_id=RID,
                fingerprint="fp",
                sigma=2 * SIGMA,
                beta=BETA,
                interval=(-1, 2),
                n_actions=3,
            )
        for bad in (
            {"sigma": -1.0},
            {"beta": 0.0},
            {"interval": (1, 1)},
            {"n_actions": 0},
            {"release_id": "a b"},
            {"status": "live"},
            {"beta": float("nan")},
        ):
            kw = {
                "release_id": "r2",
                "fingerprint": "fp",
                "sigma": 1.0,
                "beta": 1.0,
                "interval": (0, 1),
                "n_actions": 1,
                **bad,
            }
            with pytest.raises(InvalidArgument):
                s.create_release(**kw)
        assert [r.release_id for r in s.list_releases()] == [RID]
        assert s.set_release_status(RID, "active").status == "active"
        with pytest.raises(InvalidArgument):
            s.set_release_status(RID, "paused")
        with pytest.raises(NotFound):
            s.get_release("nope")
        with pytest.raises(NotFound):
            s.set_release_status("nope", "active")
        with pytest.raises(NotFound):
            s.get_or_sample("nope", 0, [0.5])
    with open_store(url) as s:
        assert s.get_release(RID).status == "active"
        assert isinstance(s._rng, OSEntropy)  # production default: OS entropy
        assert not s.seeded
    with open_store(url, rng=12) as s:
        assert s.seeded


def test_same_answers_after_reopen_and_duplicates(url: str) -> None:
    xs = np.array([0.5, 0.1, 0.5, 0.9, 0.1, 0.0, 1.0])
    with open_store(url, rng=2) as s:
        make_release(s)
        g = s.get_or_sample(RID, 0, xs)
        assert g[0] == g[2] and g[1] == g[4]
        assert s.count_points(RID, 0) == 5 and s.count_points(RID, 1) == 0
        g1 = s.get_or_sample(RID, 1, xs)
        assert not np.array_equal(g, g1)  # independent paths per action
        assert s.count_points() == 10
    with open_store(url, rng=3) as s:  # a different seed: stored values must not move
        assert np.array_equal(s.get_or_sample(RID, 0, xs), g)
        assert np.array_equal(s.get_or_sample(RID, 0, xs[::-1]), g[::-1])  # order-free
        assert np.array_equal(s.get_or_sample(RID, 1, xs), g1)
        assert s.count_points() == 10
        assert [p.seq for p in s.iter_points(RID, 0)] == [1, 2, 3, 4, 5]
        assert [p.x for p in s.iter_points(RID, 0)] == [0.5, 0.1, 0.9, 0.0, 1.0]
        assert s.get_or_sample(RID, 0, []).shape == (0,)
        assert s.get_or_sample(RID, 0, 0.5).tolist() == [g[0]]


def test_bad_input_stores_nothing(url: str) -> None:
    with open_store(url, rng=4) as s:
        make_release(s)
        for bad in ([0.2, float("nan")], [1.5], [-0.1], [[0.1, 0.2]], ["a"], [0.3, np.inf]):
            with pytest.raises(InvalidArgument):
                s.get_or_sample(RID, 0, bad)
        for a in (-1, 2, 1.0, True):
            with pytest.raises(InvalidArgument):
                s.get_or_sample(RID, a, [0.2])  # type: ignore[arg-type]
        assert s.count_points() == 0


def test_batches_spanning_neighbours(url: str) -> None:
    """New points between, left and right of stored ones, in one batch: each is drawn given
    the nearest stored-or-earlier-in-batch point on each side (recorded by the debug hook)."""
    records = []
    with open_store(url, rng=5) as s:
        make_release(s)
        s.set_debug_hook(lambda r, a, recs: records.extend(recs))
        first = s.get_or_sample(RID, 0, [0.2, 0.6])
        second = s.get_or_sample(RID, 0, [0.05, 0.4, 0.2, 0.5, 0.9, 0.6, 0.45])
        assert (second[2], second[5]) == (first[0], first[1])
        rows = [(p.seq, p.x) for p in s.iter_points(RID, 0)]
    assert check_seen(rows, records) == []
    seen = {r.x: (r.left, r.right) for r in records}
    assert seen[0.4] == (0.2, 0.6) and seen[0.5] == (0.4, 0.6) and seen[0.45] == (0.4, 0.5)
    assert seen[0.05] == (None, 0.2) and seen[0.9] == (0.6, None)


def test_stored_paths_have_the_gp_law(url: str) -> None:
    """Whitening the stored points in insertion order gives iid N(0, 1) innovations.

    1200 points drawn in random batches (1-60 points, random order, overlapping earlier
    ones). For power: whitening the same points with beta x 2 or sigma x 1.2 (what a wrong
    kernel or variance would produce) fails this test (var ~ 1.4 / 0.69; KS p < 1e-6)."""
    rng = np.random.default_rng(7)
    beta, sigma = 25.0, 1.3
    with open_store(url, rng=8) as s:
        make_release(s, beta=beta, sigma=sigma, n_actions=1)
        pool = rng.uniform(size=1000)
        while s.count_points(RID, 0) < 1200:
            k = int(rng.integers(1, 60))
            xs = np.concatenate([rng.uniform(size=k), rng.choice(pool, size=k // 3)])
            s.get_or_sample(RID, 0, rng.permutation(xs))
        x, g = stored(s, RID, 0)
    rep = normality_report(whiten(x, g, beta=beta, sigma=sigma))
    assert rep["passed"], rep
    assert abs(rep["var"] - 1) < 0.12 and abs(rep["mean"]) < 0.1
    wrong = normality_report(whiten(x, g, beta=2 * beta, sigma=sigma))
    assert not wrong["passed"]
    wrong = normality_report(whiten(x, g, beta=beta, sigma=1.2 * sigma))
    assert not wrong["passed"]


def test_integrity_and_export_import(url: str, tmp_path: Path) -> None:
    with open_store(url, rng=9) as s:
        make_release(s)
        s.get_or_sample(RID, 0, np.linspace(0, 1, 25))
        s.get_or_sample(RID, 1, [0.3, 0.7])
        rep = s.verify(RID)
        assert rep.ok and rep.high_water == {0: 25, 1: 2}
        assert s.verify(RID, 1).high_water == {1: 2}
        out = tmp_path / "r.jsonl"
        assert s.export(RID, str(out)) == 27
        lines = out.read_text().splitlines()
        assert len(lines) == 29
        # a changed value, a missing line, a truncated file: each is refused, nothing stored
        with open_store(f"memory://{uuid.uuid4().hex}") as t:
            bad = tmp_path / "bad.jsonl"
            d = json.loads(lines[5])
            d["g"] += 1e-12
            bad.write_text("\n".join(lines[:5] + [json.dumps(d)] + lines[6:]) + "\n")
            with pytest.raises(IntegrityError, match="broken at seq 5"):
                t.import_(str(bad))
            bad.write_text("\n".join(lines[:7] + lines[8:]) + "\n")
            with pytest.raises(IntegrityError):
                t.import_(str(bad))
            bad.write_text("\n".join(lines[:-1]) + "\n")
            with pytest.raises(IntegrityError, match="truncated"):
                t.import_(str(bad))
            assert t.list_releases() == [] and t.count_points() == 0
            rec = t.import_(str(out))
            assert rec == s.get_release(RID)
            assert t.verify(RID).ok
            xs = np.linspace(0, 1, 25)
            assert np.array_equal(t.get_or_sample(RID, 0, xs), s.get_or_sample(RID, 0, xs))
            with pytest.raises(InvalidArgument, match="already exists"):
                t.import_(str(out))
        with open_store(f"memory://{uuid.uuid4().hex}", key=b"other-key") as t:
            with pytest.raises(IntegrityError, match="server key"):
                t.import_(str(out))


def _tamper(s: object, url: str, sql: str, edit: object) -> None:
    """Change stored rows behind the store's back: SQL on a database, ``edit(rows)`` on the
    memory backend's row list."""
    if url.startswith("memory"):
        rows = s._data.rows[(RID, 0)]  # type: ignore[attr-defined]
        edit(rows)  # type: ignore[operator]
        return
    eng = sa.create_engine(s._url)  # type: ignore[attr-defined]
    with eng.begin() as c:
        c.exec_driver_sql(sql)
    eng.dispose()


def test_verify_reports_tampering(url: str) -> None:
    def bump(rows: list) -> None:  # type: ignore[type-arg]
        seq, x, g, c, h = rows[3]
        rows[3] = (seq, x, g + 1e-9, c, h)

    def drop(rows: list) -> None:  # type: ignore[type-arg]
        del rows[5:7]

    with open_store(url, rng=10) as s:
        make_release(s)
        s.get_or_sample(RID, 0, np.linspace(0, 1, 10))
        _tamper(s, url, "UPDATE noise_points SET g = g + 1e-9 WHERE seq = 4 AND action = 0", bump)
        rep = s.verify(RID, 0)
        assert not rep.ok and rep.first_broken == {0: 4} and rep.gaps == {0: ()}
        _tamper(s, url, "DELETE FROM noise_points WHERE seq IN (6, 7) AND action = 0", drop)
        rep = s.verify(RID, 0)
        assert rep.first_broken == {0: 4} and rep.gaps == {0: ((6, 7),)}
        assert rep.high_water == {0: 10}
    with open_store(url, rng=11) as s:  # a store with a gap refuses to sample against it
        with pytest.raises(IntegrityError, match="gap"):
            s.get_or_sample(RID, 0, [0.123])
