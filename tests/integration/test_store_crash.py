"""Crash safety: a writer SIGKILLed 32 times while streaming new points (SQLite file; and 10
times on PostgreSQL, where the server rolls back the killed client's open transaction and
releases its advisory lock).

Every value a writer reported (it reports only after get_or_sample returned, i.e. after the
durable commit) must be in the store unchanged after the kills, the chains must verify, and
each new writer must recover the database a killed one left behind (hot WAL, open
transaction). Writers are forked (no interpreter start-up per cycle) and killed at a random
moment 0-40 ms after their first report, so kills land inside transactions and commits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from store_helpers import RID, make_release
from store_worker import crash_writer, run_forked

from qveil.server.store import open_store

KILLS = 32


def _read_lines(fd: int, timeout: float) -> bytes:
    buf = b""
    end = time.time() + timeout
    while time.time() < end:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.time()))
        if not ready:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
        if timeout > 1 and b"\n" in buf:  # first report seen
            break
    return buf


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sigkill_during_stream_loses_nothing_reported(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        url, kills = f"sqlite:///{tmp_path / 'store.sqlite'}", KILLS
    else:
        url, kills = str(request.getfixturevalue("pg_url")), 10
    with open_store(url, rng=1) as s:
        make_release(s)
    reported: dict[tuple[int, float], float] = {}
    rng = np.random.default_rng(2)
    total_lines = 0
    for i in range(kills):
        r, w = os.pipe()
        pid = run_forked(crash_writer, url, RID, 100 + i, w)
        os.close(w)
        data = _read_lines(r, 20.0)  # wait for the writer's first report
        assert data, f"writer {i} reported nothing"
        time.sleep(float(rng.uniform(0, 0.04)))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        data += _read_lines(r, 0.2)
        os.close(r)
        for line in data.split(b"\n")[:-1]:  # complete lines only
            d = json.loads(line)
            total_lines += 1
            for x, g in zip(d["x"], d["g"], strict=True):
                assert reported.setdefault((d["a"], x), g) == g
    assert total_lines >= kills
    with open_store(url) as s:
        rep = s.verify(RID)
        assert rep.ok, rep
        for a in (0, 1):
            value = {p.x: p.g for p in s.iter_points(RID, a)}
            mine = {x: g for (aa, x), g in reported.items() if aa == a}
            missing = [x for x in mine if x not in value]
            changed = [x for x in mine if x in value and value[x] != mine[x]]
            assert not missing and not changed, (len(missing), len(changed))
        # and the store still works: a new point is stored and answered
        s.get_or_sample(RID, 0, [0.123456789])
        assert s.verify(RID).ok
