"""One noise lineage per release (qveil.server.registry, qveil.server.binding), tried as an
operator would: real `qveil train`, `qveil serve`, `qveil admin` and deploy/backup_sqlite.py
processes, real SQLite files and the real PostgreSQL server.

Each ordinary mistake that would give a second, independent noise draw under one release is
refused with a message that names the legitimate command, and stores nothing; each
legitimate operation (restart, serving from the bound store, a documented move, adopting a
copy that holds every answer) still works."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from server_helpers import QVEIL, REPO, ensure_population, running

from qveil.bundle import BINDING_FILE, load_bundle, read_binding
from qveil.client.sync import ValueClient
from qveil.server import audit_log
from qveil.server.registry import open_registry
from qveil.server.store import open_store

CONFIG = str(REPO / "configs" / "linewalk-private.toml")
BACKUP = str(REPO / "deploy" / "backup_sqlite.py")


def _run(*argv: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def _url(p: Path) -> str:
    return f"sqlite:///{p}"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "users.npz"
    _run(QVEIL, "dataset", "collect", "--env", "qveil/LineWalk-v0", "--users", "60",
         "--seed", "5", "--out", str(out), "--no-progress")  # fmt: skip
    return out


def _train(dataset: Path, out: Path, *extra: str) -> Path:
    """`qveil train` of a small fqi release: bound to the store beside ``out`` (default)."""
    _run(QVEIL, "train", "--mode", "fqi", "--dataset", str(dataset), "--config", CONFIG,
         "--epsilon", "4", "--delta", "1e-5", "--force", "--out", str(out),
         *ensure_population(), *extra)  # fmt: skip
    return out


def _default_store(bundle: Path) -> str:
    return _url(bundle.parent / "qveil-store.sqlite")


def _values(tmp: Path, bundle: Path, store: str | None, states: list[float]) -> np.ndarray:
    with running(tmp, bundle, store=store) as srv, ValueClient(srv.target) as c:
        return np.asarray(c.values(states))


def _refused(tmp: Path, bundle: Path, store: str | None) -> str:
    """`qveil serve` must refuse to start (exit 2, nothing served); returns its message."""
    argv = [QVEIL, "serve", "--bundle", str(bundle), "--listen", "127.0.0.1:0"]
    r = subprocess.run(
        argv + (["--store", store] if store else []),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "serving release" not in out and "Traceback" not in out, out
    return out


def _points(store: str, rid: str) -> int:
    with open_store(store, create=False) as st:
        return st.count_points(rid)


def test_train_binds_the_release_when_it_writes_the_bundle(dataset: Path, tmp_path: Path) -> None:
    b = _train(dataset, tmp_path / "rel" / "bundle")
    binding = read_binding(b)
    assert binding is not None
    rid = load_bundle(b).bundle_id
    with open_store(_default_store(b), create=False) as st:
        assert binding.store_id == st.store_id and st.get_binding(rid) is not None
        token = st.incarnation().token
    with open_registry() as reg:
        rec = reg.lineage(rid)
        assert rec is not None and binding.registry_id == reg.registry_id
    assert (rec.status, rec.store_id, rec.incarnation) == ("bound", binding.store_id, token)
    # restart: the same store answers, with the same noise
    first = _values(tmp_path, b, None, [0.1, 0.5])
    assert np.array_equal(first, _values(tmp_path, b, None, [0.1, 0.5]))


def test_a_copied_bundle_is_refused_on_any_other_store(dataset: Path, tmp_path: Path) -> None:
    """`cp -r` of a bundle after `qveil train` (before the first serve) and again after
    serving: each copy is refused with its own store (the default beside it, or a new or
    existing one); nothing is created or stored there. Served with the store that holds its
    noise, a copy is the same release (a replica): the same answers."""
    b = _train(dataset, tmp_path / "rel" / "bundle")
    rid = load_bundle(b).bundle_id
    before = tmp_path / "elsewhere" / "before"
    shutil.copytree(b, before)
    out = _refused(tmp_path, before, None)  # its default store: beside the copy, absent
    assert "lives in store" in out or "does not exist" in out, out
    assert not (before.parent / "qveil-store.sqlite").exists()
    other = tmp_path / "other.sqlite"
    _run(QVEIL, "admin", "init-store", "--store", _url(other))
    out = _refused(tmp_path, before, _url(other))
    assert "lives in store" in out and "export-release" in out, out
    with open_store(_url(other), create=False) as st:
        assert st.list_releases() == []
    states = [0.05, 0.35, 0.65]
    first = _values(tmp_path, b, None, states)
    after = tmp_path / "elsewhere" / "after"
    shutil.copytree(b, after)
    assert "lives in store" in _refused(tmp_path, after, _url(other))
    # the copy against the store that holds the noise: one lineage, identical answers
    assert np.array_equal(first, _values(tmp_path, after, _default_store(b), states))
    assert _points(_default_store(b), rid) == 2 * len(states)  # a 1-D release, 2 actions


def test_a_deleted_or_edited_binding_is_refused(dataset: Path, tmp_path: Path) -> None:
    b = _train(dataset, tmp_path / "rel" / "bundle")
    fresh = _url(tmp_path / "fresh.sqlite")
    _run(QVEIL, "admin", "init-store", "--store", fresh)
    no_binding = tmp_path / "copy-a"
    shutil.copytree(b, no_binding)
    (no_binding / BINDING_FILE).unlink()
    out = _refused(tmp_path, no_binding, fresh)
    assert "lives in store" in out and "second, independent noise path" in out, out
    edited = tmp_path / "copy-b"
    shutil.copytree(b, edited)
    d = json.loads((edited / BINDING_FILE).read_text())
    with open_store(fresh, create=False) as st:
        d["store_id"] = st.store_id  # point it at the fresh store
    (edited / BINDING_FILE).write_text(json.dumps(d))
    out = _refused(tmp_path, edited, fresh)
    assert "binding.json was edited" in out, out
    with open_store(fresh, create=False) as st:
        assert st.list_releases() == []
    # activation of the copy on a server running another release on the fresh store
    from qveil.errors import FailedPrecondition
    from qveil.server.services import Services

    with open_store(fresh, create=False) as st:
        h = Services.create(store=st).releases
        with pytest.raises(FailedPrecondition, match="lives in store"):
            h.activate(bundle_path=str(no_binding))
        assert st.list_releases() == []


def test_a_restored_backup_is_refused_until_an_administrator_decides(
    dataset: Path, tmp_path: Path
) -> None:
    """deploy/backup_sqlite.py backup, new states answered, the backup restored over the live
    file (in place, as `cp` does), then: serving, check-restore and qveil audit refuse it;
    adopting it is refused; adopting with --retire-behind retires the release, after which
    check-restore passes and the release is answered nowhere."""
    b = _train(dataset, tmp_path / "rel" / "bundle")
    rid = load_bundle(b).bundle_id
    live = b.parent / "qveil-store.sqlite"
    _values(tmp_path, b, None, [0.1, 0.2, 0.3])
    backup = tmp_path / "backup.sqlite"
    _run(sys.executable, BACKUP, "backup", str(live), str(backup))
    after = _values(tmp_path, b, None, [0.4, 0.5, 0.6])  # answered, then lost by the restore
    for f in live.parent.glob("qveil-store.sqlite-*"):
        f.unlink()  # the server is stopped: its -wal and -shm go with the old file
    with open(backup, "rb") as src, open(live, "r+b") as dst:  # in place: the same inode
        dst.truncate(0)
        shutil.copyfileobj(src, dst)
    out = _refused(tmp_path, b, None)
    assert "is behind what release" in out and "--retire-behind" in out, out
    r = _run(sys.executable, BACKUP, "check-restore", "--store", _url(live), ok=False)
    assert r.returncode == 1 and "seq" in r.stderr, r.stderr
    r = _run(QVEIL, "audit", "--store", _url(live), "--no-record", ok=False)
    assert r.returncode != 0 and "registry's witness" in r.stdout + r.stderr
    r = _run(QVEIL, "admin", "adopt-store", "--store", _url(live), ok=False)
    assert r.returncode == 2 and "--retire-behind" in r.stderr, r.stderr
    assert _points(_url(live), rid) == 6  # refusals stored nothing
    r = _run(QVEIL, "admin", "adopt-store", "--store", _url(live), "--retire-behind")
    assert rid in r.stdout
    _run(sys.executable, BACKUP, "check-restore", "--store", _url(live))
    assert "retired" in _refused(tmp_path, b, None)
    with open_registry() as reg:
        rec = reg.lineage(rid)
        assert rec is not None and rec.status == "retired"
        log = [(e.action, e.target) for e in audit_log.entries(reg.db)]
    assert ("adopt-store", read_binding(b).store_id) in log  # type: ignore[union-attr]
    assert after.shape == (3, 2)


def test_a_byte_copy_of_the_store_is_refused_until_adopted(dataset: Path, tmp_path: Path) -> None:
    """A byte copy of the SQLite file (a backup file, or the live file copied) served beside
    the original with a copy of the bundle: refused. `qveil admin adopt-store` makes the copy
    the live incarnation (it holds every answer), and then the original is refused."""
    b = _train(dataset, tmp_path / "rel" / "bundle")
    live = b.parent / "qveil-store.sqlite"
    states = [0.15, 0.45, 0.75]
    first = _values(tmp_path, b, None, states)
    copy_dir = tmp_path / "copy"
    shutil.copytree(b.parent, copy_dir)  # the bundle and the store file, byte for byte
    cb, cs = copy_dir / "bundle", copy_dir / "qveil-store.sqlite"
    out = _refused(tmp_path, cb, None)
    assert "is a copy" in out and "adopt-store" in out, out
    assert np.array_equal(first, _values(tmp_path, b, None, states))  # the original serves
    _run(QVEIL, "admin", "adopt-store", "--store", _url(cs))
    assert np.array_equal(first, _values(tmp_path, cb, None, states))  # the same noise
    out = _refused(tmp_path, b, _url(live))
    assert "was retired when another copy was adopted" in out, out


@pytest.mark.postgres
def test_a_database_cloned_from_a_template_is_refused(
    dataset: Path, tmp_path: Path, pg_url: str
) -> None:
    import psycopg

    b = _train(dataset, tmp_path / "rel" / "bundle", "--store", pg_url)
    first = _values(tmp_path, b, pg_url, [0.2, 0.8])
    name = pg_url.rsplit("/", 1)[1]
    clone = f"{name}_clone"
    admin = "postgresql://postgres@127.0.0.1:5432/test"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,)
        )
        conn.execute(f'CREATE DATABASE "{clone}" TEMPLATE "{name}"')
    try:
        clone_url = pg_url.rsplit("/", 1)[0] + "/" + clone
        out = _refused(tmp_path, b, clone_url)
        assert "is a copy" in out and "adopt-store" in out, out
        assert np.array_equal(first, _values(tmp_path, b, pg_url, [0.2, 0.8]))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{clone}" WITH (FORCE)')


def test_an_export_moves_the_release_once(dataset: Path, tmp_path: Path) -> None:
    """export-release retires the release in the source; the first import-release completes
    the move (answers bit for bit); a second import of the same export is refused, and so is
    serving from the source or from a store that did not import it."""
    b = _train(dataset, tmp_path / "rel" / "bundle")
    rid = load_bundle(b).bundle_id
    src = _default_store(b)
    states = [0.1, 0.9]
    first = _values(tmp_path, b, None, states)
    dump = tmp_path / "release.jsonl"
    r = _run(QVEIL, "admin", "export-release", rid, "--out", str(dump), "--store", src)
    assert "retired here" in r.stdout
    assert "is moving" in _refused(tmp_path, b, src)
    two, three = _url(tmp_path / "two.sqlite"), _url(tmp_path / "three.sqlite")
    for s in (two, three):
        _run(QVEIL, "admin", "init-store", "--store", s)
    _run(QVEIL, "admin", "import-release", str(dump), "--store", two)
    r = _run(QVEIL, "admin", "import-release", str(dump), "--store", three, ok=False)
    assert r.returncode == 2 and "already imported" in r.stderr, r.stderr
    with open_store(three, create=False) as st:
        assert st.list_releases() == []  # the refused import stored nothing
    assert np.array_equal(first, _values(tmp_path, b, two, states))
    with open_store(two, create=False) as st:
        assert read_binding(b).store_id == st.store_id  # type: ignore[union-attr]
    assert "lives in store" in _refused(tmp_path, b, src)  # the source: retired, moved
    assert "lives in store" in _refused(tmp_path, b, three)


def test_serving_publishes_each_answered_head_before_the_answer(
    dataset: Path, tmp_path: Path
) -> None:
    """The registry's witness reaches every answered point: after each serve the witnessed
    seq of every path equals the store's high-water mark."""
    b = _train(dataset, tmp_path / "rel" / "bundle")
    rid = load_bundle(b).bundle_id
    for states in ([0.3], [0.31, 0.7, 0.99]):
        _values(tmp_path, b, None, states)
        with open_registry() as reg, open_store(_default_store(b), create=False) as st:
            heads = reg.heads(rid)
            for path in (0, 1):
                pts = list(st.iter_points(rid, path))
                assert heads[path] == (pts[-1].seq, pts[-1].hash)


def test_the_registry_in_use_must_be_the_one_the_release_was_trained_with(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = _train(dataset, tmp_path / "rel" / "bundle")
    monkeypatch.setenv("QVEIL_HOME", str(tmp_path / "another-home"))
    out = _refused(tmp_path, b, None)
    assert "QVEIL_REGISTRY" in out and "registry" in out, out
    assert os.environ["QVEIL_HOME"].endswith("another-home")
