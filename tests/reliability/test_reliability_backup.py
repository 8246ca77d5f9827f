"""Backups and restore checks (docs/operations.md) with deploy/backup_sqlite.py.

While clients stream new points into a live server, an online backup (SQLite backup API) is
taken. The copy verifies (integrity_check, hash chains) and contains every answer received
before the backup began, unchanged. Then the restore check does its job: the copy is BEHIND the
live store's final marks (the server kept answering new points after the backup), so
`check-restore` refuses it (exit 1) -- serving from it would re-sample answered states -- while
the live store itself passes against the same marks.
"""

from __future__ import annotations

import json
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
    release_info,
    report,
    sqlite_url,
    start_server,
)

from qveil.bundle import load_bundle
from qveil.server.store import open_store

TOOL = Path(__file__).resolve().parents[2] / "deploy" / "backup_sqlite.py"

pytestmark = pytest.mark.slow


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    """The tool as an operator runs it: a subprocess (used for the backup under load)."""
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


def test_online_backup_under_load_and_restore_check(tmp_path: Path, bundle: Path) -> None:
    live = tmp_path / "store.sqlite"
    srv = start_server(tmp_path, bundle=bundle, store=sqlite_url(live))
    book = AnswerBook()
    stop = threading.Event()
    try:
        rel = release_info(srv.target)
        workers = query_workers(
            book, [srv.target], stop, clients=2, seed=70,
            low=rel.state_low, high=rel.state_high, n_new=16,
        )  # fmt: skip
        for w in workers:
            w.start()
        time.sleep(1.0)
        before = dict(book.values)  # answered before the backup began
        copy = tmp_path / "backup.sqlite"
        r = _tool("backup", str(live), str(copy))
        assert r.returncode == 0, r.stdout + r.stderr
        time.sleep(1.0)  # the server keeps answering new points after the backup
        stop.set()
        for w in workers:
            w.join(timeout=60)
    finally:
        srv.terminate()
    marks_copy = json.loads((tmp_path / "backup.sqlite.marks.json").read_text())
    assert marks_copy["ok"] and marks_copy["sqlite_integrity"] == "ok"
    # every answer given before the backup is in the copy
    b = load_bundle(bundle)
    store = open_store(sqlite_url(copy), create=False)
    try:
        stored = {
            a: {float(p.x): float(p.g) for p in store.iter_points(rel.release_id, a)}
            for a in range(b.n_actions)
        }
    finally:
        store.close()
    states = sorted({s for s, _ in before})
    unit = dict(zip(states, b.box.to_unit(np.array(states))[:, 0].tolist(), strict=True))
    missing = [k for k in before if unit[k[0]] not in stored[k[1]]]
    assert not missing, f"{len(missing)} answers given before the backup are not in it"
    # the final live marks: the copy is behind them and must be refused; the live store passes
    final = tmp_path / "final-marks.json"
    r = _tool_inproc("marks", "--store", sqlite_url(live))
    assert r.returncode == 0, r.stderr
    final.write_text(r.stdout)
    refused = _tool_inproc("check-restore", "--store", sqlite_url(copy), "--marks", str(final))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "high-water mark" in refused.stderr
    accepted = _tool_inproc("check-restore", "--store", sqlite_url(live), "--marks", str(final))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    rid = rel.release_id
    report(
        "backup_restore_check",
        answers_before_backup=len(before),
        answers_rechecked=len(before),
        backup_marks=marks_copy["releases"][rid]["high_water"],
        final_marks=json.loads(final.read_text())["releases"][rid]["high_water"],
        stale_copy_refused=True,
        unexpected_errors={},
    )
