"""One release, one store, with real `qveil serve` processes, real SQLite files and a real
PostgreSQL: a library-written bundle is bound to its store on its first serve, and every
start that would draw a second, independent noise path under the same release is refused
(non-zero exit, a message naming the cause, nothing created or drawn). The explicit move,
export-release / import-release, carries the stored points and answers bit for bit the same."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from server_helpers import QVEIL, fresh_bundle, make_bundle, running

from qveil.bundle import BINDING_FILE, load_bundle, read_binding, release_fingerprint
from qveil.client.sync import ValueClient
from qveil.server.store import open_store

STATES = np.linspace(-1.0, 2.0, 7)


def _url(p: Path) -> str:
    return f"sqlite:///{p}"


def _refused(tmp: Path, bundle: Path, store: str, *extra: str) -> str:
    """Run `qveil serve` that must refuse to start: non-zero exit; returns its output."""
    r = subprocess.run(
        [QVEIL, "serve", "--bundle", str(bundle), "--store", store, "--listen", "127.0.0.1:0"]
        + list(extra),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "serving release" not in out, out
    return out


def _admin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QVEIL, "admin", *args], capture_output=True, text=True, timeout=120)


def _values(target: str) -> np.ndarray:
    with ValueClient(target) as c:
        return np.asarray(c.values(STATES))


def _serve_once(tmp: Path, bundle: Path, store: str) -> np.ndarray:
    with running(tmp, bundle, store=store) as srv:
        return _values(srv.target)


def test_first_serve_binds_both_sides(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "b", seed=41)
    fp = release_fingerprint(b)
    assert read_binding(b) is None
    store = tmp_path / "s.sqlite"
    _serve_once(tmp_path, b, _url(store))
    bound = read_binding(b)
    assert bound is not None and bound.fingerprint == fp
    with open_store(_url(store), create=False) as st:
        assert bound.store_id == st.store_id
        held = st.get_binding(bound.release_id)
        assert held is not None and held.fingerprint == fp
    # the binding file is outside the fingerprint and the bundle's own integrity check
    assert release_fingerprint(b) == fp
    load_bundle(b, verify=True)
    # the same bundle and store serve again, with the same noise
    first = _serve_once(tmp_path, b, _url(store))
    assert np.array_equal(first, _serve_once(tmp_path, b, _url(store)))


def test_copied_bundle_against_empty_or_other_store_refused(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "b", seed=42)
    _serve_once(tmp_path, b, _url(tmp_path / "s.sqlite"))
    copy = tmp_path / "copy"
    shutil.copytree(b, copy)
    # a new SQLite path: refused before anything is created
    fresh = tmp_path / "new.sqlite"
    out = _refused(tmp_path, copy, _url(fresh))
    assert "is bound to store" in out and "does not exist" in out and "retired" in out
    assert not fresh.exists()
    # (the registry refuses every other store: below)
    # an existing, empty store (created by init-store): refused, nothing registered in it
    empty = tmp_path / "empty.sqlite"
    r = _admin("init-store", "--store", _url(empty))
    assert r.returncode == 0, r.stderr
    out = _refused(tmp_path, copy, _url(empty))
    assert "lives in store" in out and "export-release" in out
    # a different store that holds other releases
    other = make_bundle(tmp_path / "other", seed=43)
    _serve_once(tmp_path, other, _url(tmp_path / "other.sqlite"))
    out = _refused(tmp_path, copy, _url(tmp_path / "other.sqlite"))
    assert "lives in store" in out
    for url in (_url(empty), _url(tmp_path / "other.sqlite")):
        with open_store(url, create=False) as st:
            assert load_bundle(b).bundle_id not in {r.release_id for r in st.list_releases()}


def test_deleted_sqlite_store_refused(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "b", seed=44)
    store = tmp_path / "s.sqlite"
    _serve_once(tmp_path, b, _url(store))
    for f in tmp_path.glob("s.sqlite*"):
        f.unlink()
    out = _refused(tmp_path, b, _url(store))
    assert "does not exist" in out and "can only be retired" in out
    assert not store.exists()
    # the default store (beside the bundle) as well
    b2 = make_bundle(tmp_path / "d" / "b2", seed=45)
    default = tmp_path / "d" / "qveil-store.sqlite"
    with running(tmp_path, b2) as srv:
        _values(srv.target)
    for f in default.parent.glob("qveil-store.sqlite*"):
        f.unlink()
    r = subprocess.run(
        [QVEIL, "serve", "--bundle", str(b2), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "does not exist" in r.stderr, r.stderr
    assert not default.exists()


def test_fingerprint_mismatch_refused(tmp_path: Path) -> None:
    """A different bundle under a release id the store holds: refused, bound or not."""
    a = make_bundle(tmp_path / "a", seed=46)
    rid = load_bundle(a).bundle_id
    store = _url(tmp_path / "s.sqlite")
    _serve_once(tmp_path, a, store)
    impostor = make_bundle(tmp_path / "imp", seed=47, bundle_id=rid)
    assert release_fingerprint(impostor) != release_fingerprint(a)
    out = _refused(tmp_path, impostor, store)
    assert "different bundle under the same release id" in out
    assert read_binding(impostor) is None
    # a binding.json copied onto another bundle is refused as well
    shutil.copy(a / BINDING_FILE, impostor / BINDING_FILE)
    out = _refused(tmp_path, impostor, store)
    assert "binding.json belongs to release" in out


@pytest.mark.postgres
def test_export_import_moves_release_bit_for_bit(tmp_path: Path, pg_url: str) -> None:
    """SQLite -> PostgreSQL -> SQLite: after each move the bound bundle is served from the new
    store and answers exactly what it answered before (stored noise, not a new draw)."""
    b = make_bundle(tmp_path / "b", seed=48)
    rid = load_bundle(b).bundle_id
    src = _url(tmp_path / "src.sqlite")
    before = _serve_once(tmp_path, b, src)
    # before the move, the new store is refused
    r = _admin("init-store", "--store", pg_url)
    assert r.returncode == 0, r.stderr
    assert "lives in store" in _refused(tmp_path, b, pg_url)
    dump = tmp_path / "release.jsonl"
    r = _admin("export-release", rid, "--out", str(dump), "--store", src)
    assert r.returncode == 0, r.stderr
    assert "retired here" in r.stdout
    # moving: answered nowhere until the import
    assert "is moving" in _refused(tmp_path, b, src)
    r = _admin("import-release", str(dump), "--store", pg_url, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["bound"] is True
    after = _serve_once(tmp_path, b, pg_url)
    assert np.array_equal(before, after)
    with open_store(pg_url, create=False) as st:
        assert read_binding(b).store_id == st.store_id  # type: ignore[union-attr]
    # and back to a third store (SQLite), still bit for bit
    dump2 = tmp_path / "release2.jsonl"
    assert _admin("export-release", rid, "--out", str(dump2), "--store", pg_url).returncode == 0
    dst = _url(tmp_path / "dst.sqlite")
    assert _admin("init-store", "--store", dst).returncode == 0
    r = _admin("import-release", str(dump2), "--store", dst)
    assert r.returncode == 0, r.stderr
    assert np.array_equal(before, _serve_once(tmp_path, b, dst))


def test_copies_of_an_unbound_bundle_bind_once(tmp_path: Path) -> None:
    """A bundle the library wrote (no binding yet), copied before its first serve: the first
    copy served binds the release in the registry; the other copy is refused on any other
    store (one release id, one noise lineage)."""
    b = make_bundle(tmp_path / "b", seed=49)
    c = fresh_bundle(b, tmp_path / "c")
    _serve_once(tmp_path, b, _url(tmp_path / "one.sqlite"))
    out = _refused(tmp_path, c, _url(tmp_path / "two.sqlite"))
    assert "lives in store" in out and "second, independent noise path" in out
    assert read_binding(c) is None


def test_init_store_binds_a_bundle_for_a_read_only_mount(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "b", seed=50)
    store = _url(tmp_path / "s.sqlite")
    r = _admin("init-store", "--store", store, "--bundle", str(b))
    assert r.returncode == 0, r.stderr
    assert read_binding(b) is not None
    b.chmod(0o555)  # the bundle directory read-only from here on (as in a container)
    try:
        _serve_once(tmp_path, b, store)
    finally:
        b.chmod(0o755)
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories: the refusal below needs a user")
    # an unbound bundle in a read-only directory cannot be bound: refused, nothing served
    u = make_bundle(tmp_path / "u", seed=51)
    u.chmod(0o555)
    try:
        out = _refused(tmp_path, u, _url(tmp_path / "u.sqlite"))
    finally:
        u.chmod(0o755)
    assert "must be writable" in out
