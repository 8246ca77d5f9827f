"""Files qveil writes are owner-only: 0600 files and 0700 directories whatever the umask.

The CLI sets umask 077 at start; the library writers (bundle with its noise key, SQLite
store, release export) set their modes explicitly as well. The CLI runs here as real
subprocesses under umask 022 (collect, train fqi, serve with its answer log, export-release),
the library writers in-process under umask 022; every file and directory under the outputs
is checked, not a fixed list. `qveil serve` warns about a bundle that group or others can
read."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from server_helpers import (
    QVEIL,
    REPO,
    ServerProcess,
    ensure_population,
    make_bundle,
    running,
    wait_health,
)

from qveil.bundle import KEY_FILE, RECEIPT_FILE, load_bundle
from qveil.server.store.export import export_release

CONFIG = str(REPO / "configs" / "linewalk-private.toml")


def _qveil(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [QVEIL, *argv],
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=lambda: os.umask(0o022),  # what a login shell usually has
    )


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    """Mode of every file and directory under ``root`` (root itself excluded)."""
    return {str(p.relative_to(root)): stat.S_IMODE(p.lstat().st_mode) for p in root.rglob("*")}


def _assert_owner_only(root: Path) -> None:
    modes = _modes(root)
    assert modes, f"nothing under {root}"
    bad = {
        name: f"{mode:04o}"
        for name, mode in modes.items()
        if mode != (0o700 if (root / name).is_dir() else 0o600)
    }
    assert not bad, f"not owner-only (files 0600, directories 0700): {bad}"


def test_cli_writes_owner_only_files_under_umask_022(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    os.chmod(out, 0o700)
    (out / "data").mkdir(mode=0o700)
    os.chmod(out / "data", 0o700)
    data = out / "data" / "users.npz"
    r = _qveil(
        "dataset", "collect", "--env", "qveil/LineWalk-v0", "--users", "40", "--seed", "1",
        "--out", str(data), "--no-progress",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    bundle = out / "releases" / "bundle"  # train creates releases/ as well
    r = _qveil(
        "train", "--mode", "fqi", "--dataset", str(data), "--config", CONFIG,
        "--epsilon", "1", "--delta", "1e-5", "--out", str(bundle), "--force",
        *ensure_population(),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (bundle / KEY_FILE).is_file() and (bundle / RECEIPT_FILE).is_file()
    # train creates no store; serving does, and its answer log writes to it
    db = out / "qveil-store.sqlite"
    store = f"sqlite:///{db}"
    srv = _serve(tmp_path, bundle, store, port_file=out / "serve.port")
    try:
        from qveil.client import ValueClient

        with ValueClient(srv.target, timeout=30) as c:
            assert c.values([0.1, 0.5]).shape == (2, 2)
    finally:
        assert srv.terminate() == 0, srv.output()  # the answer log is flushed on the way out
    rid = load_bundle(bundle).bundle_id
    dump = out / "exports" / "release.jsonl"
    (out / "exports").mkdir(mode=0o700)
    os.chmod(out / "exports", 0o700)
    r = _qveil("admin", "export-release", rid, "--out", str(dump), "--store", store)
    assert r.returncode == 0, r.stderr
    assert dump.is_file() and db.is_file() and len(dump.read_text().splitlines()) > 1
    assert (bundle / "card.json").is_file()
    _assert_owner_only(out)
    _assert_owner_only(Path(os.environ["QVEIL_HOME"]))  # the registry (ledger, signing key)


def _serve(tmp: Path, bundle: Path, store: str, *, port_file: Path) -> ServerProcess:
    """`qveil serve` of ``bundle`` on ``store`` as a subprocess under umask 022 (its log in
    ``tmp``, outside the checked tree), once healthy."""
    import time

    log = tmp / "serve.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [QVEIL, "serve", "--bundle", str(bundle), "--store", store,
             "--listen", "127.0.0.1:0", "--port-file", str(port_file)],
            stdout=fh, stderr=subprocess.STDOUT, text=True, cwd=tmp,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=lambda: os.umask(0o022),
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text().strip():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)
    srv = ServerProcess(proc, int(port_file.read_text()), log)
    wait_health(srv.target, "SERVING", timeout=60, proc=srv)
    return srv


def test_library_writers_set_modes_whatever_the_umask(tmp_path: Path) -> None:
    """Without the CLI's umask: the bundle writer (its noise key too), a new SQLite store
    (with its -wal and -shm) logging answered values and export_release still write
    owner-only files."""
    from store_helpers import keyed_paths, log_values, make_release

    from qveil.server.store import open_store

    lib = tmp_path / "lib"
    lib.mkdir(mode=0o700)
    os.chmod(lib, 0o700)
    with _umask(0o022):
        make_bundle(lib / "bundle", seed=3)
        assert (lib / "bundle" / KEY_FILE).is_file()
        with open_store(f"sqlite:///{lib / 'store.sqlite'}") as st:
            rec = make_release(st, "r1")
            _, _, written, _ = log_values(st, keyed_paths(rec), "r1", [0], [[0.1, 0.5]])
            assert written == 2
            assert (lib / "store.sqlite-wal").exists()  # WAL mode: written while open
            _assert_owner_only(lib)
            assert export_release(st, "r1", lib / "release.jsonl") == 2
    _assert_owner_only(lib)


def test_serve_warns_about_a_bundle_others_can_read(tmp_path: Path) -> None:
    """An owner-only bundle and store: no warning. The bundle chmod'ed 0755/0644: one
    WARNING line naming the path, its mode and the fix; the server still serves."""
    bundle = make_bundle(tmp_path / "bundle", seed=4)
    store = f"sqlite:///{tmp_path / 'store.sqlite'}"
    with running(tmp_path, bundle, store=store, name="tight") as srv:
        assert "WARNING" not in srv.output(), srv.output()
    os.chmod(bundle, 0o755)
    for p in bundle.iterdir():
        os.chmod(p, 0o644)
    with running(tmp_path, bundle, store=store, name="loose") as srv:
        lines = [ln for ln in srv.output().splitlines() if "qveil serve: WARNING" in ln]
    assert len(lines) == 1, srv.output()
    assert lines[0] == (
        f"qveil serve: WARNING: {bundle} is mode 0755, readable or writable by group or "
        f"others (and {len(list(bundle.iterdir()))} more in the bundle); a bundle holds the "
        f"un-noised model and its noise key: chmod -R go-rwx {bundle}"
    )
    # the store file as well
    os.chmod(bundle, 0o700)
    for p in bundle.iterdir():
        os.chmod(p, 0o600)
    db = tmp_path / "store.sqlite"
    os.chmod(db, 0o644)
    with running(tmp_path, bundle, store=store, name="store") as srv:
        lines = [ln for ln in srv.output().splitlines() if "qveil serve: WARNING" in ln]
    assert len(lines) == 1 and f"store file {db} is mode 0644" in lines[0], srv.output()
    assert f"chmod -R go-rwx {db}" in lines[0]
