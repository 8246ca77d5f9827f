"""Crash safety of the log: a writer SIGKILLed 32 times while logging new points (SQLite
file; and 10 times on PostgreSQL, where the server rolls back the killed client's open
transaction and releases its advisory lock).

Each writer announces every call (its path, states and values) before making it and reports
when it returned (after the durable commit). After the kills: every point of a returned call
is in the log unchanged; the call in flight at the kill is in the log whole or not at all (no
partial rows); nothing is logged that was not handed over; the chains verify; each new writer
recovers the database a killed one left behind (hot WAL, open transaction), and the next
write succeeds. Writers are forked (no interpreter start-up per cycle) and killed at a random
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
from store_helpers import RID, keyed_paths, log_values, make_release
from store_worker import crash_writer, forking, run_forked

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
        if timeout > 1 and b'"done"' in buf:  # first call returned
            break
    return buf


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sigkill_during_logging_loses_nothing_committed(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        url, kills = f"sqlite:///{tmp_path / 'store.sqlite'}", KILLS
    else:
        url, kills = str(request.getfixturevalue("pg_url")), 10
    with open_store(url) as s:
        kp = keyed_paths(make_release(s))
    done: dict[tuple[int, float], float] = {}  # points of calls that returned
    in_flight: list[dict] = []  # the call each killed writer was making
    rng = np.random.default_rng(2)
    calls = 0
    with forking():  # 32 forks: one full garbage collection, not 32
        for i in range(kills):
            r, w = os.pipe()
            pid = run_forked(crash_writer, url, RID, 100 + i, w)
            os.close(w)
            data = _read_lines(r, 20.0)  # wait for the writer's first committed call
            assert b'"done"' in data, f"writer {i} reported nothing"
            time.sleep(float(rng.uniform(0, 0.04)))
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            data += _read_lines(r, 0.2)
            os.close(r)
            last = None
            for line in data.split(b"\n")[:-1]:  # complete lines only
                d = json.loads(line)
                if d["t"] == "try":
                    last = d
                    continue
                assert last is not None
                calls += 1
                for x, g in zip(last["x"], last["g"], strict=True):
                    assert done.setdefault((last["a"], x), g) == g
                last = None
            if last is not None:
                in_flight.append(last)
    assert calls >= kills
    with open_store(url) as s:
        rep = s.verify(RID)
        assert rep.ok, rep
        value = {(a, p.x): p.g for a in (0, 1) for p in s.iter_points(RID, a)}
        assert len(value) == s.count_points(RID)  # one row per state
        missing = [k for k in done if k not in value]
        changed = [k for k in done if k in value and value[k] != done[k]]
        assert not missing and not changed, (len(missing), len(changed))
        whole = 0
        for d in in_flight:  # the call cut by the kill: all of it or none of it
            there = [(d["a"], x) in value for x in d["x"]]
            assert all(there) or not any(there), (d, there)
            whole += all(there)
            for x, g in zip(d["x"], d["g"], strict=True):
                done.setdefault((d["a"], x), g)
        extra = [k for k in value if k not in done]
        assert not extra, f"{len(extra)} logged points were never handed over"
        assert all(value[k] == done[k] for k in value)
        # and the log still takes writes: a new point is logged
        assert log_values(s, kp, RID, [0], [[0.123456789]])[2:] == (1, 0)
        assert s.verify(RID).ok
    print(f"{calls} calls returned, {len(in_flight)} cut by a kill ({whole} committed whole)")
