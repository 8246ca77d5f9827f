#!/usr/bin/env python3
"""Online backup of a qveil SQLite store, and the high-water-mark checks of a restore.

    # a verified online copy, with its marks in <copy>.marks.json
    python deploy/backup_sqlite.py backup /var/lib/qveil/store.sqlite /backup/qveil.sqlite
    # record the live marks (cron, every minute, and at every clean shutdown)
    python deploy/backup_sqlite.py marks --store sqlite:////var/lib/qveil/store.sqlite > m.json
    # how much of the record a restored store lost: exit 1 if any path is behind the marks
    python deploy/backup_sqlite.py check-restore --store URL --marks m.json

``backup`` copies the live store with SQLite's online backup API
(``sqlite3.Connection.backup``): one consistent snapshot, including what is still only in
the ``-wal`` file, taken while the server keeps serving. Never copy the database, ``-wal`` or
``-shm`` files by hand. The copy is then checked (``PRAGMA integrity_check``; every release's
hash chains, no gap) and its per-(release, action) high-water marks are written beside it.

``check-restore`` compares a store's marks with recorded ones (any store URL, PostgreSQL
too): a restored store that is behind lost part of the record of what was answered. It answers
exactly as before all the same (every answer comes from the release's key); the check tells
how much of the audit trail the restore lost (docs/operations.md, "Restoring a store"). Exit
status 0 when everything verifies, 1 otherwise. The copies it writes are owner-only (0600).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def online_backup(src: Path, dst: Path, *, pages: int = 4096) -> None:
    """Copy ``src`` to ``dst`` with the online backup API (in steps of ``pages`` pages so a
    busy writer is not blocked for the whole copy; SQLite restarts the copy when the source
    changes in between, so the result is one consistent snapshot)."""
    if dst.exists():
        raise FileExistsError(f"{dst} exists; refusing to overwrite a backup")
    os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # owner-only from birth
    os.chmod(dst, 0o600)
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30)
    target = sqlite3.connect(str(dst))
    try:
        with target:
            source.backup(target, pages=pages)
    finally:
        target.close()
        source.close()


def store_marks(store_url: str) -> dict[str, Any]:
    """Per release: chain verification, and per action the high-water mark and count."""
    from qveil.server.store import open_store

    out: dict[str, Any] = {
        "store": store_url,
        "taken_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "releases": {},
    }
    store = open_store(store_url, create=False)
    try:
        ok = True
        for rec in store.releases.list_releases():
            rep = store.verify(rec.release_id)
            ok = ok and rep.ok
            out["releases"][rec.release_id] = {
                "status": rec.status,
                "ok": rep.ok,
                "high_water": {str(a): hw for a, hw in rep.high_water.items()},
                "count": {
                    str(a): store.count_points(rec.release_id, a) for a in range(rec.n_actions)
                },
            }
    finally:
        store.close()
    out["ok"] = ok
    return out


def behind(current: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    """Every (release, action) whose mark in ``current`` is below the ``recorded`` one."""
    problems = []
    for rid, rec in recorded.get("releases", {}).items():
        cur = current["releases"].get(rid)
        if cur is None:
            problems.append(f"release {rid}: missing from the store")
            continue
        for action, hw in rec["high_water"].items():
            now = cur["high_water"].get(action)
            if hw is not None and (now is None or now < hw):
                problems.append(
                    f"release {rid} action {action}: high-water mark {now} < recorded {hw}"
                )
    return problems


def check_copy(dst: Path) -> dict[str, Any]:
    conn = sqlite3.connect(f"file:{dst}?mode=ro", uri=True)
    try:
        ic = conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()
    marks = store_marks(f"sqlite:///{dst.resolve()}")
    marks["sqlite_integrity"] = ic
    marks["ok"] = bool(marks["ok"] and ic == "ok")
    return marks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("backup", help="online backup + verification + marks")
    b.add_argument("source", type=Path, help="the live store file (store.sqlite)")
    b.add_argument("dest", type=Path, help="the backup file to create")
    m = sub.add_parser("marks", help="print a store's high-water marks as JSON")
    m.add_argument("--store", required=True)
    c = sub.add_parser("check-restore", help="fail if a store is behind recorded marks")
    c.add_argument("--store", required=True)
    c.add_argument("--marks", type=Path, required=True, help="JSON from `marks` or `backup`")
    args = p.parse_args(argv)
    if args.cmd == "backup":
        online_backup(args.source, args.dest)
        result = check_copy(args.dest)
        marks = args.dest.with_name(args.dest.name + ".marks.json")
        fd = os.open(marks, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        if not result["ok"]:
            args.dest.rename(args.dest.with_name(args.dest.name + ".bad"))
            return 1
        return 0
    if args.cmd == "marks":
        result = store_marks(args.store)
        print(json.dumps(result, indent=2))
        return 0 if result["ok"] else 1
    current = store_marks(args.store)
    problems = behind(current, json.loads(args.marks.read_text()))
    if not current["ok"]:
        problems.append("integrity verification failed")
    for line in problems:
        print(f"restore check: {line}", file=sys.stderr)
    if problems:
        print(
            "restore check FAILED: this store lacks part of the record of what was answered "
            "(answers are unaffected: docs/operations.md, Restoring a store)",
            file=sys.stderr,
        )
        return 1
    print("restore check passed: every action at or above the recorded marks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
