"""Audit: what the statistical test detects, how often it false-alarms, and how fast
a whole-store audit runs.

1. Rejection rates of the audit's per-path test (qveil.stats.whiten + normality_report at the
   audit's pass level) on paths with the *true* law and with wrong ones (sigma x 1.3,
   sigma x 0.7, beta x 2, beta / 2), over path sizes n; R paths each: the keyed noise of a
   release (qveil.keyed.KeyedPaths, one seeded key per path) at n snapped uniform states,
   whitened in a random order (the order in which a log may hold them).
2. Wall time of ``qveil audit`` (audit_store: integrity + statistics, no plot) on a SQLite store
   logging n points in one path (written by ``record_paths``, as the server's answer log
   does), with and without the release's key (``--bundle``: every logged value recomputed
   from it), against the time to read the rows (iter_points) alone.

Writes the "audit" section of docs/benchmarks.md and docs/bench_audit.png.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import DOC, load_average, table, write_section  # noqa: E402

from qveil.keyed import KeyedPaths, seeded_key, snap  # noqa: E402
from qveil.server.governance.audit import POWER_FACTOR, variance_test_power  # noqa: E402
from qveil.stats import DEFAULT_PASS_LEVEL, normality_report, whiten  # noqa: E402

COMMAND = ".venv/bin/python benchmarks/bench_audit.py"
SIGMA, BETA = 1.0, 5.0
ALTERNATIVES = {  # name -> (true sigma, true beta); the claimed law is (SIGMA, BETA)
    "healthy": (SIGMA, BETA),
    "sigma x 1.3": (1.3 * SIGMA, BETA),
    "sigma x 0.7": (0.7 * SIGMA, BETA),
    "beta x 2": (SIGMA, 2 * BETA),
    "beta / 2": (SIGMA, BETA / 2),
}


def rejection_rates(
    ns: list[int],
    reps: int,
    level: float,
    *,
    only: tuple[str, ...] | None = None,
    seed: int = 20261122,
) -> list[list[object]]:
    rng = np.random.default_rng(seed)
    rows = []
    k = 0  # one key per path
    for name, (s, b) in ALTERNATIVES.items():
        if only is not None and name not in only:
            continue
        row: list[object] = [name]
        for n in ns:
            rej = 0
            for _ in range(reps):
                k += 1
                idx, xs = snap(rng.random(n))
                path = KeyedPaths(key=seeded_key(seed + k), betas=[b], sigma=s, n_actions=1)
                gs = path.path_values(0, idx)
                z = whiten(xs, gs, beta=BETA, sigma=SIGMA)
                rej += not normality_report(z, level=level)["passed"]
            row.append(rej / reps)
        rows.append(row)
    return rows


def audit_speed(ns: list[int]) -> list[list[object]]:
    from qveil.server.governance.admin_db import admin_db_for
    from qveil.server.governance.audit import audit_store
    from qveil.server.store import open_store

    paths = KeyedPaths(key=seeded_key(1), betas=[BETA], sigma=SIGMA, n_actions=1)
    rows = []
    for n in ns:
        with tempfile.TemporaryDirectory() as d:
            os.environ["QVEIL_HOME"] = f"{d}/home"  # the audit's admin database: its own
            url = f"sqlite:///{d}/s.sqlite"
            st = open_store(url)
            st.releases.create_release(
                release_id="r",
                fingerprint="f",
                sigma=SIGMA,
                beta=BETA,
                interval=(0.0, 1.0),
                n_actions=1,
            )
            rng = np.random.default_rng(2)
            idx, xs = snap(rng.random(n + n // 100 + 10))
            keep = np.sort(np.unique(idx, return_index=True)[1])[:n]  # n distinct grid points
            idx, xs = idx[keep], xs[keep]
            for chunk in np.array_split(np.arange(n), max(1, n // 1000)):
                st.record_paths("r", [0], [xs[chunk]], [paths.path_values(0, idx[chunk])])
            st.close()
            st = open_store(url)
            db = admin_db_for(st, url)
            t0 = time.perf_counter()
            k = sum(1 for _ in st.iter_points("r", 0))
            t_read = time.perf_counter() - t0
            t0 = time.perf_counter()
            rep = audit_store(st, db, record=False)
            t_audit = time.perf_counter() - t0
            t0 = time.perf_counter()
            rep_key = audit_store(st, db, record=False, keys={"r": paths})
            t_key = time.perf_counter() - t0
            db.close()
            st.close()
            assert k == n and rep.passed, rep.failures()
            assert rep_key.passed, rep_key.failures()
            rows.append([n, t_read, t_audit, n / t_audit, t_audit / t_read, t_key, n / t_key])
    return rows


def plot(ns: list[int], rows: list[list[object]], out: Path, level: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for row in rows:
        ax.plot(ns, row[1:], marker="o", label=str(row[0]))
    ax.plot(
        ns,
        [variance_test_power(n, factor=POWER_FACTOR, level=level) for n in ns],
        "k--",
        lw=1,
        label="exact power of the variance test alone, sigma x 1.3",
    )
    ax.set_xscale("log")
    ax.set_xlabel("points in the path (n)")
    ax.set_ylabel("rejection rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"audit test at pass level {level:g}: rejection rate by true law", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and sizes")
    ap.add_argument(
        "--false-alarms",
        type=int,
        default=2000,
        metavar="R",
        help="healthy paths per size for the false-alarm rate (0: skip)",
    )
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    args = ap.parse_args()
    level = DEFAULT_PASS_LEVEL
    load_before = load_average()
    ns = [30, 100, 300, 1000] if not args.quick else [30, 300]
    reps = 40 if args.quick else args.reps
    t0 = time.perf_counter()
    rates = rejection_rates(ns, reps, level)
    t_rates = time.perf_counter() - t0
    fa_rows: list[list[object]] = []
    if args.false_alarms > 0:
        fa_ns = [30, 100, 300]
        fa = rejection_rates(fa_ns, args.false_alarms, level, only=("healthy",), seed=99)
        fa_rows = [[n, args.false_alarms, fa[0][i + 1]] for i, n in enumerate(fa_ns)]
    sizes = [10_000, 100_000] if not args.quick else [10_000]
    speed = audit_speed(sizes)
    png = DOC.parent / "bench_audit.png"
    body = (
        f"Load average (1, 5, 15 min) before the run: {load_before}; after: {load_average()} "
        "(2 cores shared with other work).\n\n"
        f"Rejection rate of the audit's per-path test at pass level {level:g} (one path; a "
        f"store with P paths tests each at {level:g}/P), {reps} paths per cell, claimed law "
        f"sigma = {SIGMA:g}, beta = {BETA:g}; each path the keyed noise of its own seeded key "
        "at n snapped states uniform on [0, 1], whitened in random order "
        f"(took {t_rates:.1f} s). The `healthy` row is the false-alarm rate "
        f"(bound: 4 x {level:g} = {4 * level:g}). Plot: [bench_audit.png](bench_audit.png).\n\n"
        + table(["true law", *[f"n = {n}" for n in ns]], rates)
        + "\n\nExact power of the variance test alone against sigma x 1.3 at the same level "
        "(what each audited path reports as `variance_test_power`): "
        + ", ".join(
            f"n = {n}: {variance_test_power(n, factor=POWER_FACTOR, level=level):.3f}" for n in ns
        )
        + ".\n\n"
        + (
            "False alarms of the same test on healthy paths, more repetitions (bound "
            f"{4 * level:g}):\n\n" + table(["n", "paths", "rejection rate"], fa_rows) + "\n\n"
            if fa_rows
            else ""
        )
        + "Whole-store audit (integrity + statistics, no plot) of a SQLite store logging n "
        "points in one path (written by `record_paths`), against reading the rows alone; "
        "'with the key': the same audit given the release's key (`qveil audit --bundle`), "
        "every logged value recomputed from it:\n\n"
        + table(
            [
                "n",
                "read rows (s)",
                "audit (s)",
                "points/s audited",
                "audit / read",
                "audit with the key (s)",
                "points/s with the key",
            ],
            speed,
        )
    )
    if args.no_write:
        print(body)
        return
    plot(ns, rates, png, level)
    write_section("audit", "Audit: detection, false alarms and speed", COMMAND, body)


if __name__ == "__main__":
    main()
