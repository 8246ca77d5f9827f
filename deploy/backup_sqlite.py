#!/usr/bin/env python3
"""Online backup of a qveil SQLite store, verified, with its high-water marks.

    python deploy/backup_sqlite.py /var/lib/qveil/store.sqlite /backup/qveil-20261122.sqlite

1. Copies the live store with SQLite's online backup API (``sqlite3.Connection.backup``): a
   consistent snapshot including what is still only in the ``-wal`` file, taken while the
   server keeps serving. Never copy the database, ``-wal`` or ``-shm`` files by hand.
2. Checks the copy: ``PRAGMA integrity_check``, then opens it as a qveil store and verifies
   every release's hash chains (no broken link, no gap).
3. Prints (and writes beside the copy as ``<copy>.marks.json``) the per-(release, action)
   high-water marks and counts of the copy: the numbers a restore is checked against
   (docs/operations.md, "Restore checks").

Exit status 0 when the copy verifies, 1 otherwise (the copy is then renamed ``*.bad``).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def online_backup(src: Path, dst: Path, *, pages: int = 4096) -> None:
    """Copy ``src`` to ``dst`` with the online backup API (in steps of ``pages`` pages, so a
    busy writer is not blocked for the whole copy; SQLite restarts the copy if the source
    changes in between, so the result is one consistent snapshot)."""
    if dst.exists():
        raise FileExistsError(f"{dst} exists; refusing to overwrite a backup")
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=30)
    target = sqlite3.connect(str(dst))
    try:
        with target:
            source.backup(target, pages=pages)
    finally:
        target.close()
        source.close()


def check_copy(dst: Path) -> dict[str, Any]:
    """integrity_check + qveil chain verification of every release; the marks."""
    conn = sqlite3.connect(f"file:{dst}?mode=ro", uri=True)
    try:
        ic = conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()
    out: dict[str, Any] = {"file": str(dst), "sqlite_integrity": ic,
                           "taken_at": datetime.now(UTC).isoformat(timespec="seconds"),
                           "releases": {}}
    from qveil.server.store import open_store

    store = open_store(f"sqlite:///{dst.resolve()}", create=False)
    try:
        ok = ic == "ok"
        for rec in store.list_releases():
            rep = store.verify(rec.release_id)
            ok = ok and rep.ok
            out["releases"][rec.release_id] = {
                "status": rec.status, "ok": rep.ok,
                "high_water": {str(a): hw for a, hw in rep.high_water.items()},
                "count": {str(a): store.count_points(rec.release_id, a)
                          for a in range(rec.n_actions)}}
    finally:
        store.close()
    out["ok"] = ok
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", type=Path, help="the live store file (store.sqlite)")
    p.add_argument("dest", type=Path, help="the backup file to create")
    args = p.parse_args(argv)
    online_backup(args.source, args.dest)
    result = check_copy(args.dest)
    marks = args.dest.with_name(args.dest.name + ".marks.json")
    marks.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if not result["ok"]:
        args.dest.rename(args.dest.with_name(args.dest.name + ".bad"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
