"""Export and import of a release's logged values, on every backend (memory, SQLite file,
PostgreSQL): the export is an owner-only JSONL file; a changed value, a missing line or a
truncated file is refused on import with nothing stored; an import is a verified plain copy
(rows and hashes bit for bit) whose log goes on like the original's; a second import, or an
import under another server key, is refused."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
from store_helpers import (
    RID,
    keyed_paths,
    log_values,
    logged,
    make_release,
)

from qveil.errors import IntegrityError, InvalidArgument
from qveil.server.store import open_store
from qveil.server.store.export import export_release, import_release


def test_integrity_and_export_import(store_url: str, tmp_path: Path) -> None:
    with open_store(store_url) as s:
        kp = keyed_paths(make_release(s))
        log_values(s, kp, RID, [0], [np.linspace(0, 1, 25)])
        log_values(s, kp, RID, [1], [[0.3, 0.7]])
        rep = s.verify(RID)
        assert rep.ok and rep.high_water == {0: 25, 1: 2}
        assert s.verify(RID, 1).high_water == {1: 2}
        out = tmp_path / "r.jsonl"
        assert export_release(s, RID, out) == 27
        assert out.stat().st_mode & 0o777 == 0o600
        lines = out.read_text().splitlines()
        assert len(lines) == 29
        # a changed value, a missing line, a truncated file: each is refused, nothing stored
        with open_store(f"memory://{uuid.uuid4().hex}") as t:
            bad = tmp_path / "bad.jsonl"
            d = json.loads(lines[5])
            d["g"] += 1e-12
            bad.write_text("\n".join(lines[:5] + [json.dumps(d)] + lines[6:]) + "\n")
            with pytest.raises(IntegrityError, match="broken at seq 5"):
                import_release(t, bad)
            bad.write_text("\n".join(lines[:7] + lines[8:]) + "\n")
            with pytest.raises(IntegrityError):
                import_release(t, bad)
            bad.write_text("\n".join(lines[:-1]) + "\n")
            with pytest.raises(IntegrityError, match="truncated"):
                import_release(t, bad)
            assert t.releases.list_releases() == [] and t.count_points() == 0
            rec = import_release(t, out)
            assert rec == s.releases.get_release(RID)
            assert t.verify(RID).ok
            for p in (0, 1):  # the rows round-trip bit for bit, hashes and all
                assert [(q.seq, q.x, q.g, q.hash) for q in t.iter_points(RID, p)] == [
                    (q.seq, q.x, q.g, q.hash) for q in s.iter_points(RID, p)
                ]
            # a plain copy: both logs go on, and the copy does not log its states again
            assert log_values(t, kp, RID, [0], [np.linspace(0, 1, 25)])[2:] == (0, 0)
            assert log_values(t, kp, RID, [0], [[0.123]])[2:] == (1, 0)
            assert log_values(s, kp, RID, [0], [[0.123]])[2:] == (1, 0)
            assert t.verify(RID).ok and s.verify(RID).ok
            assert logged(t, RID, 0) == logged(s, RID, 0)
            with pytest.raises(InvalidArgument, match="already exists"):
                import_release(t, out)
        with open_store(f"memory://{uuid.uuid4().hex}", key=b"other-key") as t:
            with pytest.raises(IntegrityError, match="server key"):
                import_release(t, out)
