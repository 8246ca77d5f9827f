"""The hash chains of the logged paths (qveil.server.store.integrity) on every backend
(memory, SQLite file, PostgreSQL): an edited value breaks the chain where it was edited and
deleted rows are reported as a gap (a path with a gap is refused when loaded, nothing
written); a second row for a logged state, appended with a valid link, is refused when the
path is loaded, naming seqs and never a value, and verify reports it."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa
from store_helpers import RID, keyed_paths, log_values, make_release

from qveil.errors import IntegrityError
from qveil.server.store import open_store
from qveil.server.store.integrity import ChainHasher


def _tamper(s: object, store_url: str, sql: str, edit: object) -> None:
    """Change stored rows behind the store's back: SQL on a database, ``edit(rows)`` on the
    memory backend's row list."""
    if store_url.startswith("memory"):
        rows = s._data.rows[(RID, 0)]  # type: ignore[attr-defined]
        edit(rows)  # type: ignore[operator]
        return
    eng = sa.create_engine(s._url)  # type: ignore[attr-defined]
    with eng.begin() as c:
        c.exec_driver_sql(sql)
    eng.dispose()


def test_verify_reports_tampering(store_url: str) -> None:
    def bump(rows: list) -> None:  # type: ignore[type-arg]
        seq, x, g, c, h = rows[3]
        rows[3] = (seq, x, g + 1e-9, c, h)

    def drop(rows: list) -> None:  # type: ignore[type-arg]
        del rows[5:7]

    with open_store(store_url) as s:
        kp = keyed_paths(make_release(s))
        log_values(s, kp, RID, [0], [np.linspace(0, 1, 10)])
        _tamper(
            s, store_url, "UPDATE noise_points SET g = g + 1e-9 WHERE seq = 4 AND action = 0", bump
        )
        rep = s.verify(RID, 0)
        assert not rep.ok and rep.first_broken == {0: 4} and rep.gaps == {0: ()}
        _tamper(s, store_url, "DELETE FROM noise_points WHERE seq IN (6, 7) AND action = 0", drop)
        rep = s.verify(RID, 0)
        assert rep.first_broken == {0: 4} and rep.gaps == {0: ((6, 7),)}
        assert rep.high_water == {0: 10}
    with open_store(store_url) as s:  # a log with a gap is refused when loaded: nothing written
        with pytest.raises(IntegrityError, match="gap"):
            log_values(s, kp, RID, [0], [[0.123]])
        with pytest.raises(IntegrityError, match="gap"):
            s.paths.refresh(RID)
        assert s.count_points(RID, 0) == 8


def test_a_second_row_for_a_state_is_refused_on_load(store_url: str) -> None:
    """A row for a logged state, appended behind the store's back with a valid chain link:
    a store loading the path refuses it (IntegrityError naming seqs, never a value) and logs
    nothing to it; the other path is logged as before; ``verify`` reports the row."""
    units = np.linspace(0, 1, 6)
    with open_store(store_url) as s:
        kp = keyed_paths(make_release(s))
        xs, gs, _, _ = log_values(s, kp, RID, [0, 1], [units, units])
        pts = list(s.iter_points(RID, 0))
        x, g = pts[2].x, 0.25
        h = ChainHasher().link(bytes.fromhex(pts[-1].hash), 7, x, g).hex()

        def append(rows: list) -> None:  # type: ignore[type-arg]
            rows.append((7, x, g, 0.0, h))

        _tamper(
            s,
            store_url,
            "INSERT INTO noise_points (release_id, action, coordinate, seq, x, g, created_at, "
            f"hash) VALUES ('{RID}', 0, 0, 7, {x!r}, {g!r}, 0.0, '{h}')",
            append,
        )
    with open_store(store_url) as t:
        with pytest.raises(IntegrityError, match="seq 7 repeats a stored state") as exc:
            log_values(t, kp, RID, [0], [[0.123]])
        assert "0.25" not in str(exc.value) and repr(float(gs[0][2])) not in str(exc.value)
        with pytest.raises(IntegrityError, match="stores one state twice"):
            log_values(t, kp, RID, [0, 1], [units[:2], units[:2]])
        assert log_values(t, kp, RID, [1], [[0.123]])[2:] == (1, 0)
        assert (t.count_points(RID, 0), t.count_points(RID, 1)) == (7, 7)
        rep = t.verify(RID)
        assert not rep.ok and rep.actions[1].ok
        assert rep.actions[0].problems == (f"seq 7: state {x!r} stored twice (first at seq 3)",)
