"""Files qveil writes are owner-only: 0600 files and 0700 directories whatever the umask.

The CLI sets umask 077 at start; the library writers (bundle, SQLite store, release export)
set their modes explicitly as well. The CLI runs here as real subprocesses under umask 022
(collect, train fqi, init-store, export-release, serve), the library writers in-process
under umask 022; every file and directory under the outputs is checked, not a fixed list.
`qveil serve` warns about a bundle that group or others can read."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from server_helpers import QVEIL, REPO, ensure_population, make_bundle, running

from qveil.bundle import load_bundle

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
    # the default store beside the bundle, which train bound the release to
    db = bundle.parent / "qveil-store.sqlite"
    store = f"sqlite:///{db}"
    rid = load_bundle(bundle).bundle_id
    dump = out / "exports" / "release.jsonl"
    (out / "exports").mkdir(mode=0o700)
    os.chmod(out / "exports", 0o700)
    r = _qveil("admin", "export-release", rid, "--out", str(dump), "--store", store)
    assert r.returncode == 0, r.stderr
    assert dump.is_file() and db.is_file()
    assert (bundle / "card.json").is_file()
    _assert_owner_only(out)
    _assert_owner_only(Path(os.environ["QVEIL_HOME"]))  # the registry (lineage, ledger)


def test_library_writers_set_modes_whatever_the_umask(tmp_path: Path) -> None:
    """Without the CLI's umask: the bundle writer, a new SQLite store (with its -wal and
    -shm) and export_release still write owner-only files."""
    from store_helpers import make_release

    from qveil.server.store import open_store

    lib = tmp_path / "lib"
    lib.mkdir(mode=0o700)
    os.chmod(lib, 0o700)
    with _umask(0o022):
        make_bundle(lib / "bundle", seed=3)
        with open_store(f"sqlite:///{lib / 'store.sqlite'}") as st:
            make_release(st, "r1")
            st.get_or_sample("r1", 0, [0.1, 0.5])
            assert (lib / "store.sqlite-wal").exists()  # WAL mode: written while open
            _assert_owner_only(lib)
            assert st.export("r1", str(lib / "release.jsonl")) == 2
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
        f"un-noised model: chmod -R go-rwx {bundle}"
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
