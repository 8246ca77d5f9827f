"""The SQL store backend (qveil.server.store.sql) on real SQLite files: URLs refused with a
clear error and nothing created, a d-coordinate release's betas kept bit for bit through the
releases table, the integrity key recorded by the first opener and a store opened with another
key refused before anything is read, the advisory-lock keys of PostgreSQL (the backend contract
on every backend: test_server_store_base.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from store_helpers import RID, keyed_paths, log_values, make_release

from qveil.errors import FailedPrecondition, InvalidArgument, Unavailable
from qveil.server.store import open_store
from qveil.server.store.sql import SQLStore, advisory_key


def test_bad_urls_are_refused_and_create_nothing(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="bad store URL"):
        SQLStore("::not a url::")
    with pytest.raises(InvalidArgument, match="unsupported store URL scheme 'mysql'"):
        SQLStore("mysql://h/db")
    missing = tmp_path / "s.sqlite"
    with pytest.raises(FailedPrecondition, match="does not exist \\(nothing was created\\)"):
        SQLStore(f"sqlite:///{missing}", new_ok=False)
    with pytest.raises(Unavailable, match="directory .* of the store does not exist"):
        SQLStore(f"sqlite:///{tmp_path / 'nowhere' / 's.sqlite'}")
    assert list(tmp_path.iterdir()) == []


def test_an_unmigrated_database_is_refused_without_create(tmp_path: Path) -> None:
    f = tmp_path / "empty.sqlite"
    f.write_bytes(b"")
    with pytest.raises(FailedPrecondition):
        SQLStore(f"sqlite:///{f}", create=False)
    with sqlite3.connect(f) as conn:  # no table was made
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []


def test_a_release_of_d_coordinates_reads_back_exactly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    betas = (0.1 + 0.2, 3.0, 1e-7)
    with open_store(url) as st:
        assert isinstance(st, SQLStore) and st.backend == "sqlite"
        assert st.schema_revision
        rec = make_release(st, beta=betas[0], betas=betas, interval=(-0.3, 0.3))
        log_values(st, keyed_paths(rec), RID, [0, 5], [[0.25], [0.5]])
    with open_store(url, create=False, new_ok=False) as again:
        got = again.releases.get_release(RID)
        assert got.betas == betas and got.dims == 3 and got.n_paths == 6
        assert got.interval == (-0.3, 0.3) and got.created_at.tzinfo is not None
        assert got.created_at == rec.created_at
        assert again.count_points(RID, 5) == 1 and again.verify(RID).ok


def test_the_first_openers_key_is_the_stores(tmp_path: Path) -> None:
    plain = f"sqlite:///{tmp_path / 'plain.sqlite'}"
    open_store(plain).close()
    with pytest.raises(FailedPrecondition, match="QVEIL_STORE_KEY is set, but the store was"):
        open_store(plain, key=b"k")
    keyed = f"sqlite:///{tmp_path / 'keyed.sqlite'}"
    with open_store(keyed, key=b"right") as st:
        make_release(st)
    with pytest.raises(FailedPrecondition, match="check QVEIL_STORE_KEY.*nothing was read"):
        open_store(keyed, key=b"wrong")
    with open_store(keyed, key=b"right") as st:
        assert [r.release_id for r in st.releases.list_releases()] == [RID]


def test_advisory_keys_are_signed_64_bit_per_release_and_action() -> None:
    keys = {advisory_key(r, a) for r in ("r1", "r2") for a in (0, 1, 2)}
    assert len(keys) == 6 and all(-(2**63) <= k < 2**63 for k in keys)
    assert advisory_key("r1", 1) == advisory_key("r1", True + 0)
