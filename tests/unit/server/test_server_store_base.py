"""Contract suite of qveil.server.store, the durable log of answered values, run on every
backend (memory, SQLite file, PostgreSQL).

What the log guarantees: the values written (``record_paths``) are read back bit for bit after
reopening; a state logged once is not logged again (also by another store object on the same
database); a state logged with a different value is counted as mismatched and not written;
bad input writes nothing; the hash chains verify (tampering: test_server_store_integrity.py;
export and import: test_server_store_export.py).

The values logged come from a real key (:func:`store_helpers.keyed_paths`). PostgreSQL cases
use the ``pg_url`` fixture (a fresh database; skipped outside CI when the server is absent,
failing under CI=true)."""

from __future__ import annotations

import numpy as np
import pytest
from store_helpers import (
    BETA,
    RID,
    SIGMA,
    keyed_paths,
    log_values,
    logged,
    make_release,
    path_values,
)

from qveil.errors import InvalidArgument, NotFound
from qveil.server.store import open_store


def test_releases(store_url: str) -> None:
    with open_store(store_url) as s:
        assert s.releases.list_releases() == []
        rec = s.releases.create_release(
            release_id=RID, fingerprint="fp", sigma=SIGMA, beta=BETA, interval=(-1, 2), n_actions=3
        )
        assert (rec.sigma, rec.beta, rec.interval, rec.n_actions, rec.status) == (
            SIGMA,
            BETA,
            (-1.0, 2.0),
            3,
            "staged",
        )
        assert s.releases.create_release(
            release_id=RID, fingerprint="fp", sigma=SIGMA, beta=BETA, interval=(-1, 2), n_actions=3
        ) == s.releases.get_release(RID)
        with pytest.raises(InvalidArgument, match="different parameters"):
            s.releases.create_release(
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
                s.releases.create_release(**kw)
        assert [r.release_id for r in s.releases.list_releases()] == [RID]
        assert s.releases.set_release_status(RID, "active").status == "active"
        with pytest.raises(InvalidArgument):
            s.releases.set_release_status(RID, "paused")
        with pytest.raises(NotFound):
            s.releases.get_release("nope")
        with pytest.raises(NotFound):
            s.releases.set_release_status("nope", "active")
        with pytest.raises(NotFound):
            s.record_paths("nope", [0], [[0.5]], [[0.1]])
        with pytest.raises(NotFound):
            s.count_points("nope")
    with open_store(store_url) as s:
        got = s.releases.get_release(RID)
        assert (got.status, got.sigma, got.beta, got.interval, got.n_actions) == (
            "active",
            SIGMA,
            BETA,
            (-1.0, 2.0),
            3,
        )


def test_values_read_back_bit_for_bit_after_reopen(store_url: str) -> None:
    units = np.array([0.5, 0.1, 0.5, 0.9, 0.1, 0.0, 1.0])
    with open_store(store_url) as s:
        kp = keyed_paths(make_release(s))
        x0, g0 = path_values(kp, 0, units)
        x1, g1 = path_values(kp, 1, units)
        assert not np.array_equal(g0, g1)  # independent paths per action
        # a state asked twice in one call is logged once
        assert s.record_paths(RID, [0], [x0], [g0]) == (5, 0)
        assert s.count_points(RID, 0) == 5 and s.count_points(RID, 1) == 0
        assert s.record_paths(RID, [1], [x1], [g1]) == (5, 0)
        assert s.count_points() == 10 and s.committer.points_logged == 10
        # logged again (any order, with the other path): nothing written
        assert s.record_paths(RID, [1, 0], [x1[::-1], x0], [g1[::-1], g0]) == (0, 0)
        assert s.count_points() == 10 and s.paths.known_points(RID) == 10
    want0 = dict(zip(x0.tolist(), g0.tolist(), strict=True))
    with open_store(store_url) as s:
        pts = list(s.iter_points(RID, 0))
        assert [p.seq for p in pts] == [1, 2, 3, 4, 5]
        assert [p.x for p in pts] == x0[[0, 1, 3, 5, 6]].tolist()  # first-occurrence order
        got = np.array([p.g for p in pts])
        assert got.tobytes() == np.array([want0[p.x] for p in pts]).tobytes()  # bit for bit
        assert logged(s, RID, 1) == dict(zip(x1.tolist(), g1.tolist(), strict=True))
        # reopened: the log is read before anything is written; nothing is logged twice
        assert s.record_paths(RID, [0, 1], [x0, x1], [g0, g1]) == (0, 0)
        assert s.record_paths(RID, [0], [[]], [[]]) == (0, 0)
        assert s.record_paths(RID, [], [], []) == (0, 0)
        assert s.count_points() == 10 and s.committer.points_logged == 0
        assert s.verify(RID).ok


def test_a_different_value_is_counted_as_mismatched_not_written(store_url: str) -> None:
    """Whether the logged state is in this object's copy already or only in the database
    (logged by another store object), a different value for it is counted and not written."""
    units = np.linspace(0, 1, 9)
    with open_store(store_url) as s:
        kp = keyed_paths(make_release(s))
        xs, gs, written, mism = log_values(s, kp, RID, [0, 1], [units, units])
        assert (written, mism) == (18, 0)
        bumped = gs[0].copy()
        bumped[[2, 5]] += 1e-12
        assert s.record_paths(RID, [0], [xs[0]], [bumped]) == (0, 2)
        with open_store(store_url) as t:  # another object: its copy is empty, the log is not
            other = keyed_paths(t.releases.get_release(RID), seed=2)  # another key's values
            _, _, written, mism = log_values(t, other, RID, [1], [units[:4]])
            assert (written, mism) == (0, 4)
            fresh = np.array([0.3, 0.7])  # new states are logged with the value given
            _, gf, written, mism = log_values(t, other, RID, [1], [fresh])
            assert (written, mism) == (2, 0)
        assert s.count_points() == 20
        assert logged(s, RID, 0) == dict(zip(xs[0].tolist(), gs[0].tolist(), strict=True))
        assert s.verify(RID).ok


def test_bad_input_writes_nothing(store_url: str) -> None:
    with open_store(store_url) as s:
        make_release(s)
        for bad in ([0.2, float("nan")], [1.5], [-0.1], [[0.1, 0.2]], ["a"], [0.3, np.inf]):
            with pytest.raises(InvalidArgument):
                s.record_paths(RID, [0], [bad], [[0.0] * len(bad)])
        for vals in ([float("nan")], [np.inf], [0.1, 0.2], []):
            with pytest.raises(InvalidArgument):
                s.record_paths(RID, [0], [[0.4]], [vals])
        for a in (-1, 2, 1.0, True):
            with pytest.raises(InvalidArgument):
                s.record_paths(RID, [a], [[0.2]], [[0.1]])  # type: ignore[list-item]
        with pytest.raises(InvalidArgument):  # paths must be distinct
            s.record_paths(RID, [0, 0], [[0.2], [0.3]], [[0.1], [0.1]])
        with pytest.raises(InvalidArgument):  # one list of states and values per path
            s.record_paths(RID, [0, 1], [[0.2]], [[0.1]])
        with pytest.raises(InvalidArgument):  # a bad second path: the first is not written
            s.record_paths(RID, [0, 1], [[0.2], [0.3]], [[0.1], [float("nan")]])
        assert s.count_points() == 0 and s.paths.known_points(RID) == 0


def test_two_store_objects_on_one_log(store_url: str) -> None:
    """A state another store object (another process, another replica) logged is not logged
    again; ``refresh`` loads what the others logged."""
    with open_store(store_url) as a, open_store(store_url) as b:
        kp = keyed_paths(make_release(a))
        first = np.linspace(0, 1, 11)
        assert log_values(a, kp, RID, [0, 1], [first, first])[2:] == (22, 0)
        both = np.concatenate([first[::2], [0.33, 0.66]])
        assert log_values(b, kp, RID, [0, 1], [both, both])[2:] == (4, 0)
        assert a.paths.known_points(RID) == 22
        assert a.paths.refresh(RID) == 26 == a.paths.known_points(RID)
        assert log_values(a, kp, RID, [0], [both])[2:] == (0, 0)
        assert a.count_points() == b.count_points() == 26
        assert logged(a, RID, 0) == logged(b, RID, 0)
        assert a.verify(RID).ok


def test_meta_value_first_writer_wins(store_url: str) -> None:
    with open_store(store_url) as s:
        assert s.releases.meta_value("test.key", lambda: "one") == "one"
        assert s.releases.meta_value("test.key", lambda: "two") == "one"
        with open_store(store_url) as t:
            assert t.releases.meta_value("test.key", lambda: "three") == "one"
        sid = s.releases.store_id
    with open_store(store_url) as s:
        assert s.releases.meta_value("test.key", lambda: "four") == "one"
        assert s.releases.store_id == sid
