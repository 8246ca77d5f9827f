"""Backups and restores (docs/operations.md) with deploy/backup_sqlite.py.

While clients stream states into a live server, an online backup (SQLite backup API) is
taken; another is taken once the load has stopped (a same-time backup). Each copy verifies
(integrity_check, hash chains) and logs only the release's own values; the same-time copy
holds every state the server answered (it stopped cleanly). Then each is restored
over the live file and served: the server answers every state any client was ever answered
(before and after the older backup) exactly as before, because every answer comes from the
release's key, not from the store; and the restored log, with what the restored server added
to it, passes `qveil audit --bundle` (every logged value recomputed from the key). The restore
check still says what the older copy lost: it is behind the live store's final marks, so
`check-restore` reports it (exit 1), while the live store passes against the same marks.

The statistical part of the audit depends on which states the load happened to log, so it
is checked at a pass level of 1e-8 (``audit_store(level=...)``, the function `qveil audit`
runs): a correct log fails it with probability <= 4e-8 per audit. Integrity and the key
check are exact.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from reliability_helpers import (
    AnswerBook,
    query_workers,
    recheck,
    release_info,
    report,
    run_audit,
    sqlite_url,
    start_server,
)
from server_helpers import charge

from qveil.answer import released_values
from qveil.bundle import load_bundle
from qveil.keyed import snap
from qveil.server.governance.admin_db import admin_db_for
from qveil.server.governance.audit import audit_store
from qveil.server.store import open_store

TOOL = Path(__file__).resolve().parents[2] / "deploy" / "backup_sqlite.py"

pytestmark = pytest.mark.slow


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    """The tool as an operator runs it: a subprocess (used for the backups)."""
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120
    )


def _tool_inproc(*args: str) -> subprocess.CompletedProcess[str]:
    """The same ``main`` in this process (spares a Python start per check)."""
    import contextlib
    import importlib.util
    import io

    spec = importlib.util.spec_from_file_location("backup_sqlite", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = mod.main(list(args))
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def _restore(backup: Path, live: Path) -> None:
    """Restore ``backup`` over the live store file in place (the same inode, as `cp` over
    it does), the server stopped: its -wal and -shm go with the old file."""
    for f in live.parent.glob(live.name + "-*"):
        if f.name.endswith(("-wal", "-shm")):
            f.unlink()
    with open(backup, "rb") as src, open(live, "r+b") as dst:
        dst.truncate(0)
        shutil.copyfileobj(src, dst)


def _logged_are_the_keys(url: str, bundle: Path, rid: str) -> int:
    """Every value the store logged is the release's key's value at its state; returns the
    number of points checked."""
    b = load_bundle(bundle)
    paths = b.noise_paths
    n = 0
    with open_store(url, create=False) as st:
        for p in range(b.n_actions):
            pts = list(st.iter_points(rid, p))
            xs = np.array([q.x for q in pts])
            idx, snapped = snap(xs)
            assert np.array_equal(snapped, xs)  # logged states are on the grid
            assert np.array_equal(np.array([q.g for q in pts]), paths.path_values(p, idx))
            n += len(pts)
    return n


def _audit_passes(url: str, bundle: Path, rid: str) -> None:
    """`qveil audit --bundle` finds the log intact and every value the key's; the whole
    audit (statistics included) passes at level 1e-8 (see the module docstring)."""
    r = run_audit(url, "--bundle", str(bundle), "--no-record", "--json")
    assert r.returncode in (0, 1), r.stderr
    rep = json.loads(r.stdout)
    [rel] = rep["releases"]
    assert rel["release_id"] == rid and rel["key_checked"] and rel["integrity_ok"], rel
    assert all(a["key_checked"] and a["integrity_ok"] for a in rel["actions"]), rel
    b = load_bundle(bundle)
    with open_store(url, create=False) as st:
        db = admin_db_for(st, url)
        try:
            strict = audit_store(
                st, db, record=False, level=1e-8, keys={rid: b.noise_paths}, store_label=url
            )
        finally:
            db.close()
    assert strict.passed, strict.failures()


# long-function: one operator scenario top to bottom: load, two backups, two restores, checks
def test_a_restored_backup_answers_every_state_as_before(tmp_path: Path, bundle: Path) -> None:
    charge(bundle)  # what `qveil train` does: the registry's receipt, so that it is served
    live = tmp_path / "store.sqlite"
    srv = start_server(tmp_path, bundle=bundle, store=sqlite_url(live))
    book = AnswerBook()
    stop = threading.Event()
    older = tmp_path / "older.sqlite"
    try:
        rel = release_info(srv.target)
        workers = query_workers(
            book, [srv.target], stop, clients=2, seed=70,
            low=rel.state_low, high=rel.state_high, n_new=16,
        )  # fmt: skip
        for w in workers:
            w.start()
        time.sleep(1.0)
        r = _tool("backup", str(live), str(older))  # under load
        assert r.returncode == 0, r.stdout + r.stderr
        time.sleep(1.0)  # the server keeps answering new states after the backup
        stop.set()
        for w in workers:
            w.join(timeout=60)
    finally:
        srv.terminate()
    rid = rel.release_id
    assert book.conflicts == [] and book.release_ids == {rid}
    marks_older = json.loads((tmp_path / "older.sqlite.marks.json").read_text())
    assert marks_older["ok"] and marks_older["sqlite_integrity"] == "ok"
    same_time = tmp_path / "same-time.sqlite"
    r = _tool("backup", str(live), str(same_time))  # the load has stopped: nothing is missed
    assert r.returncode == 0, r.stdout + r.stderr
    # every answer a client got is the release's: its model and its key at the snapped state
    b = load_bundle(bundle)
    states = book.states()
    want = released_values(b, b.box.to_unit(np.array(states)))
    row = {s: i for i, s in enumerate(states)}
    wrong = [(s, a) for (s, a), v in book.values.items() if v != want[row[s], a]]
    assert wrong == [], f"{len(wrong)} answers are not the release's, e.g. {wrong[:5]}"
    # the copies log the key's values only; the older one holds fewer
    older_points = _logged_are_the_keys(sqlite_url(older), bundle, rid)
    same_points = _logged_are_the_keys(sqlite_url(same_time), bundle, rid)
    assert 0 < older_points < same_points
    # the server stopped cleanly, so its answer log holds every state it answered
    xs = snap(b.box.to_unit(np.array(states))[:, 0])[1]
    with open_store(sqlite_url(same_time), create=False) as st:
        logged = [{q.x for q in st.iter_points(rid, a)} for a in range(b.n_actions)]
    unlogged = [(s, a) for (s, a) in book.values if float(xs[row[s]]) not in logged[a]]
    assert unlogged == [], f"{len(unlogged)} answers are not in the log, e.g. {unlogged[:5]}"
    # the final live marks: the older copy is behind them (part of the record lost), the
    # live store passes
    final = tmp_path / "final-marks.json"
    r = _tool_inproc("marks", "--store", sqlite_url(live))
    assert r.returncode == 0, r.stderr
    final.write_text(r.stdout)
    behind = _tool_inproc("check-restore", "--store", sqlite_url(older), "--marks", str(final))
    assert behind.returncode == 1, behind.stdout + behind.stderr
    assert "high-water mark" in behind.stderr
    accepted = _tool_inproc("check-restore", "--store", sqlite_url(live), "--marks", str(final))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    # restore each backup over the live file and serve it: every state answered as before
    rechecked = 0
    for backup in (same_time, older):
        _restore(backup, live)
        srv = start_server(tmp_path, bundle=bundle, store=sqlite_url(live), name=backup.stem)
        try:
            n, mism = recheck(book, srv.target)
        finally:
            srv.terminate()
        assert mism == [], f"{len(mism)} of {n} answers changed after the restore: {mism[:5]}"
        assert n == len(book.values)
        rechecked += n
        _logged_are_the_keys(sqlite_url(live), bundle, rid)
        _audit_passes(sqlite_url(live), bundle, rid)
    report(
        "backup_restore_check",
        answers_given=len(book.values),
        points_in_older_backup=older_points,
        points_in_same_time_backup=same_points,
        answers_rechecked=rechecked,
        answers_changed=0,
        backup_marks=marks_older["releases"][rid]["high_water"],
        final_marks=json.loads(final.read_text())["releases"][rid]["high_water"],
        older_copy_behind_reported=True,
        unexpected_errors={},
    )
