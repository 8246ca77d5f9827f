"""``qveil serve --min-latency-ms X`` pads every value-returning response
(GetValues, GetBestActions; errors too) to at least X ms, measured at the client of a real
server process. The lower bound is a correctness property, not a speed measurement: a server
that skipped the pad on any path (stored states, new states, an error) answers in ~1-6 ms and
fails. How much the pad hides is measured by benchmarks/bench_timing.py, not here."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from server_helpers import make_bundle, start_server

from qveil.client.sync import ValueClient
from qveil.errors import InvalidArgument

PAD_MS = 60.0


def _timed(fn, *args, **kw) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    try:
        fn(*args, **kw)
    except InvalidArgument:
        pass
    return (time.perf_counter() - t0) * 1e3


def test_min_latency_pads_values_best_actions_and_errors(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    srv = start_server(tmp_path, bundle, "--min-latency-ms", f"{PAD_MS:g}")
    try:
        with ValueClient(srv.target) as c:
            c.values([0.1, 0.2])  # store two states
            rng = np.random.default_rng(0)
            lat = {
                "stored": [_timed(c.values, [0.1]) for _ in range(5)],
                "new": [_timed(c.values, [float(x)]) for x in rng.uniform(-1, 2, 5)],
                "best": [_timed(c.best_actions, [0.2]) for _ in range(3)],
                "error": [_timed(c.values, [float("nan")]) for _ in range(3)],  # not finite
            }
            for kind, ms in lat.items():
                assert min(ms) >= PAD_MS * 0.99, (kind, ms)
            with pytest.raises(InvalidArgument):
                c.values([float("nan")])
    finally:
        assert srv.terminate() == 0


def test_min_latency_refuses_bad_values(tmp_path: Path) -> None:
    import subprocess

    from server_helpers import QVEIL

    bundle = make_bundle(tmp_path / "b")
    for bad in ("-1", "nan", "1e9"):
        r = subprocess.run(
            [QVEIL, "serve", "--bundle", str(bundle), "--min-latency-ms", bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode != 0 and "min latency" in r.stderr, (bad, r.stderr)
