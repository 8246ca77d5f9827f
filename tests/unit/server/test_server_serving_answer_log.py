"""The answer log (qveil.server.serving.answer_log) behind a real query service and SQLite
store: after a flush the store holds every answered (path, state) once, each value the key's
noise at the state's grid point, and a refused request logs nothing; on a full disk every call
is still answered while the log keeps what it could not write and retries, then writes all of
it once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from server_helpers import serving_query

LO, HI = -1.0, 2.0  # the state interval of serving_query's bundle


def test_the_answer_log_keeps_each_answered_point_once(tmp_path: Path) -> None:
    """What was answered is logged off the answer path: after a flush the store holds every
    answered (path, state) once, repeats and action subsets included, each value the key's
    noise at the state's grid point; a refused request logs nothing."""
    from qveil.errors import InvalidArgument
    from qveil.keyed import snap

    with serving_query(tmp_path) as (h, st, log, b):
        rid = h.holder.current().release_id
        xs = np.array([0.1, 0.2, 0.2, -1.0, 5.0])  # a repeat; 5.0 is clipped to 2.0
        h.get_values(xs)
        h.get_values(np.array([0.1, 0.3]), [1])  # 0.1 again; 0.3 for action 1 only
        with pytest.raises(InvalidArgument):
            h.get_values(np.array([0.7, np.nan]))
        assert log.flush(30)
        _idx, unit = snap(b.box.to_unit(np.array([0.1, 0.2, -1.0, 2.0, 0.3]), clip=True))
        want = {a: set(unit[:4, 0].tolist()) for a in range(3)}
        want[1].add(float(unit[4, 0]))
        got = {a: {p.x: p.g for p in st.iter_points(rid, a)} for a in range(3)}
        assert {a: set(v) for a, v in got.items()} == want
        assert st.count_points(rid) == 4 * 3 + 1 == log.logged
        for a in range(3):
            xa = np.array(sorted(got[a]))
            ia = np.rint(xa * 2.0**32).astype(np.uint64)
            noise = b.noise_paths.path_values(a, ia)
            assert noise.tobytes() == np.array([got[a][x] for x in xa]).tobytes()
        assert log.mismatched == 0 and log.unlogged == 0
        h.get_values(xs)  # all logged: nothing more
        assert log.flush(30)
        assert st.count_points(rid) == 13 and log.logged == 13


def test_a_full_disk_delays_the_log_and_never_an_answer(tmp_path: Path) -> None:
    """The store's disk is full: every call is still answered (the answers do not wait for
    the store), the log keeps what it could not write and retries; with space again it
    writes all of it, once."""
    with serving_query(tmp_path) as (h, st, log, _b):
        rid = h.holder.current().release_id
        h.get_values(np.linspace(LO, HI, 5))
        assert log.flush(30)
        before = st.count_points(rid)
        pages = st._writer_scalar("PRAGMA page_count")  # type: ignore[attr-defined]
        st._sqlite_pragma_all(f"PRAGMA max_page_count = {pages}")  # type: ignore[attr-defined]
        fresh = [np.random.default_rng(i).uniform(LO, HI, 400) for i in range(3)]
        got = [h.get_values(x).values for x in fresh]  # answered, not logged
        assert not log.flush(2.0)
        assert log.failures >= 1 and st.count_points(rid) == before
        st._sqlite_pragma_all("PRAGMA max_page_count = 1073741823")  # type: ignore[attr-defined]
        assert log.flush(30)
        assert st.count_points(rid) == before + 3 * 400 * 3
        for x, v in zip(fresh, got, strict=True):
            assert h.get_values(x).values.tobytes() == v.tobytes()
        assert log.flush(30) and st.count_points(rid) == before + 3 * 400 * 3
