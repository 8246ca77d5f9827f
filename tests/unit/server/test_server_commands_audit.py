"""``qveil audit`` as a command (qveil.server.commands.audit), run in this process on real
SQLite stores: exit 0 and a summary for a healthy log, 1 with the failure named for an edited
one, the JSON report and the exports it writes, --no-record, and refusals (exit 2) that create
no store (the audit itself: test_server_governance_audit.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, qveil_main
from store_helpers import RID, keyed_paths, log_values, make_release

from qveil.server.commands.audit import _redact
from qveil.server.governance import audit_log
from qveil.server.governance.admin_db import open_admin_db
from qveil.server.store import open_store


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, Path]:
    """(URL, file) of a SQLite store whose log holds 40 keyed values of each of 2 paths."""
    f = tmp_path / "s.sqlite"
    with open_store(f"sqlite:///{f}") as st:
        rec = make_release(st)
        units = np.random.default_rng(0).uniform(0, 1, 40)
        log_values(st, keyed_paths(rec), RID, [0, 1], [units, units[::-1]])
    return f"sqlite:///{f}", f


def test_a_healthy_log_passes(store: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = store
    r = qveil_main("audit", "--store", url)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"audit of {url} at ") and lines[0].endswith("PASSED")
    assert f"release {RID} [staged]" in r.stdout and "values not recomputed" in r.stdout
    assert "action 0: n=40 hwm=40 integrity=ok" in r.stdout and "FAIL" not in r.stdout
    report, points = tmp_path / "report.json", tmp_path / "points"
    r = qveil_main(
        *("audit", "--store", url, "--json", "--release", RID),
        *("--export", str(report), "--export-points", str(points)),
    )
    assert r.returncode == 0 and json.loads(r.stdout)["passed"] is True
    assert json.loads(report.read_text()) == json.loads(r.stdout)
    assert f"report written to {report}" in r.stderr
    exported = [json.loads(ln) for ln in (points / f"{RID}.jsonl").read_text().splitlines()]
    assert exported[0]["release_id"] == RID and len(exported) == 1 + 80 + 1  # head, points, end


def test_an_audit_is_recorded_unless_asked_not_to(store: tuple[str, Path]) -> None:
    url, _ = store

    def audits() -> int:
        with open_admin_db(url) as db:
            return len(audit_log.entries(db, action="audit"))

    assert qveil_main("audit", "--store", url, "--no-record").returncode == 0
    assert audits() == 0
    assert qveil_main("audit", "--store", url).returncode == 0
    assert audits() == 1


def test_an_edited_log_fails_with_exit_1(store: tuple[str, Path]) -> None:
    url, f = store
    with sqlite3.connect(f) as conn:
        conn.execute("UPDATE noise_points SET g = g + 1 WHERE action = 1 AND seq = 5")
    r = qveil_main("audit", "--store", url)
    assert r.returncode == 1, r.stderr
    assert r.stdout.splitlines()[0].endswith("FAILED")
    assert "integrity=BROKEN" in r.stdout and "FAIL: " in r.stdout


def test_refusals_exit_2_and_create_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QVEIL_STORE_URL", raising=False)
    assert_one_line_error(qveil_main("audit"), "audit", "needs --store URL")
    missing = tmp_path / "none.sqlite"
    r = qveil_main("audit", "--store", f"sqlite:///{missing}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert not missing.exists()
    r = qveil_main("audit", "--store", "sqlite:///x", "--against", str(tmp_path / "no.json"))
    assert r.returncode == 2 and "no.json" in r.stderr
    r = qveil_main("audit", "--store", "sqlite:///x", "--bundle", str(tmp_path / "nob"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_store_url_is_printed_without_its_password() -> None:
    assert _redact("postgresql+psycopg://u:pw@h/db") == "postgresql+psycopg://u:***@h/db"
    assert _redact("postgresql://u@h/db") == "postgresql://u@h/db"
    assert _redact("sqlite:////a/b") == "sqlite:////a/b"
