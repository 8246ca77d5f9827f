"""The in-memory store backend (qveil.server.store.memory): ``memory://`` is private to its
object, ``memory://NAME`` is one process-global store that a reopen sees again (as a file
would), each with its own volatile identity; an import under an existing release id is
refused and changes nothing (the backend contract on every backend:
test_server_store_base.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from store_helpers import RID, keyed_paths, log_values, logged, make_release

from qveil.errors import InvalidArgument
from qveil.server.store import open_store
from qveil.server.store.export import export_release, import_release
from qveil.server.store.memory import MemoryStore


def test_private_stores_share_nothing() -> None:
    a, b = open_store("memory://"), open_store("memory://")
    try:
        assert isinstance(a, MemoryStore) and a.backend == "memory"
        make_release(a)
        assert [r.release_id for r in a.releases.list_releases()] == [RID]
        assert b.releases.list_releases() == []
        assert a.releases.store_id != b.releases.store_id
    finally:
        a.close()
        b.close()


def test_a_named_store_is_seen_again_after_a_reopen() -> None:
    name = f"memory://t-{uuid.uuid4().hex}"
    with open_store(name) as st:
        rec = make_release(st)
        _xs, gs, written, _ = log_values(st, keyed_paths(rec), RID, [0, 1], [[0.25], [0.5, 0.75]])
        assert written == 3
        store_id = st.releases.store_id
    with open_store(name) as again:
        assert again.releases.store_id == store_id
        assert logged(again, RID, 1) == dict(zip([0.5, 0.75], gs[1].tolist(), strict=True))
        assert again.count_points(RID) == 3 and again.verify(RID).ok
    with open_store(f"memory://other-{uuid.uuid4().hex}") as other:
        assert other.releases.list_releases() == []


def test_statuses_and_listing_order() -> None:
    with open_store("memory://") as st:
        make_release(st, "b")
        make_release(st, "a")
        st.releases.set_release_status("a", "active")
        listed = st.releases.list_releases()
        assert [(r.release_id, r.status) for r in listed] == [("b", "staged"), ("a", "active")]


def test_meta_first_writer_wins_only_when_asked() -> None:
    with open_store("memory://") as st:
        st._db_set_meta({"k": "1"}, only_if_absent=True)
        st._db_set_meta({"k": "2"}, only_if_absent=True)
        assert st._db_meta("k") == "1"
        st._db_set_meta({"k": "3"}, only_if_absent=False)
        assert st._db_meta("k") == "3" and st._db_meta("absent") is None


def test_an_import_under_an_existing_release_is_refused(tmp_path: Path) -> None:
    with open_store("memory://") as src, open_store("memory://") as dst:
        rec = make_release(src)
        log_values(src, keyed_paths(rec), RID, [0], [[0.1, 0.2]])
        out = tmp_path / "rel.jsonl"
        export_release(src, RID, out)
        assert import_release(dst, out).release_id == RID
        assert dst.count_points(RID) == 2
        with pytest.raises(InvalidArgument, match="already exists in this store"):
            import_release(dst, out)
        assert dst.count_points(RID) == 2 and len(dst.releases.list_releases()) == 1
