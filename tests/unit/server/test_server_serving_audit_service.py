"""The audit service (qveil.server.serving.audit_service) over a real query service and SQLite
store: the stored points of a path in chunks with their raw states, the chains' integrity, the
statistical report; an unknown release or action refused, naming what exists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from server_helpers import serving_query

from qveil.errors import InvalidArgument, NotFound
from qveil.server.serving.audit_service import AuditService


def test_points_chunks_integrity_and_report(tmp_path: Path) -> None:
    with serving_query(tmp_path, points_chunk=2) as (h, st, log, b):
        rid = h.holder.current().release_id
        xs = np.array([-1.0, 0.5, 2.0, 1.25, 0.5])  # one repeat: 4 states
        h.get_values(xs)
        assert log.flush(30)
        audit = AuditService(h.ctx)
        got_id, chunks = audit.noise_points("", 1)  # "": the active release
        sizes, points = [], []
        for c in chunks:
            sizes.append(len(c))
            points += c
        assert got_id == rid and sizes == [2, 2]
        stored = list(st.iter_points(rid, 1))
        assert [(p.seq, p.x, p.g) for p in points] == [(p.seq, p.x, p.g) for p in stored]
        lo, hi = b.box.intervals[0].lo, b.box.intervals[0].hi
        assert sorted(p.state for p in points) == pytest.approx(sorted({-1.0, 0.5, 2.0, 1.25}))
        assert all(p.state == lo + p.x * (hi - lo) for p in points)
        res = audit.verify()
        assert res.ok and res.release_id == rid and [a.count for a in res.actions] == [4] * 3
        one = audit.verify(rid, 2)
        assert [a.action for a in one.actions] == [2]
        report = audit.report(rid)
        assert report.release_id == rid and report.passed, report.report


def test_unknown_release_or_action_is_refused(tmp_path: Path) -> None:
    with serving_query(tmp_path, log=False) as (h, _st, _log, _b):
        audit = AuditService(h.ctx)
        rid = h.holder.current().release_id
        for action in (3, -1):
            with pytest.raises(InvalidArgument, match=f"unknown action {action}: release") as ei:
                audit.noise_points(rid, action)
            assert ei.value.reason == "UNKNOWN_ACTION" and ei.value.field == "action"
            assert "has actions 0..2" in str(ei.value)
            with pytest.raises(InvalidArgument):
                audit.verify(rid, action)
        with pytest.raises(NotFound):
            audit.noise_points("no-such-release", 0)
        with pytest.raises(NotFound):
            audit.report("no-such-release")
