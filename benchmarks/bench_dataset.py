"""Offline datasets: how fast ``qveil.trainer.collect`` gathers random-
policy episodes, against a ceiling measured in the same run (the bare Gymnasium loop: the same
envs and episodes, stepping and discarding, no recording), and what writing and reading the
npz and Minari formats cost.

Writes the "dataset" section of docs/benchmarks.md. Target: 1000 LineWalk users (50 steps
each) well under 5 s; 1e5 users feasible.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _report import load_line, table, write_section  # noqa: E402

import qveil.trainer  # noqa: E402,F401  (registers LineWalk)
from qveil.dataset import load_dataset, save_dataset  # noqa: E402
from qveil.trainer.collect import collect  # noqa: E402

COMMAND = "python benchmarks/bench_dataset.py"
LW = "qveil/LineWalk-v0"


def _bare(env_id: str, users: int) -> tuple[float, int]:
    """Seconds for the bare loop: one seeded episode per user, random actions, nothing kept."""
    env = gym.make(env_id)
    n = int(env.action_space.n)  # type: ignore[attr-defined]
    acts = np.random.default_rng(0).integers(0, n, size=4096)
    steps = 0
    t0 = time.perf_counter()
    for u in range(users):
        env.reset(seed=u)
        while True:
            _, _, term, trunc, _ = env.step(acts[steps % 4096])
            steps += 1
            if term or trunc:
                break
    return time.perf_counter() - t0, steps


def _collect_row(env_id: str, users: int, rr: tuple[float, float] | None) -> list[object]:
    t0 = time.perf_counter()
    ds = collect(env_id, users, seed=1, reward_range=rr)
    took = time.perf_counter() - t0
    bare, steps = _bare(env_id, users)
    return [
        env_id,
        users,
        ds.n,
        round(took, 3),
        round(bare, 3),
        f"{took / bare:.2f}",
        round(took / ds.n * 1e6, 2),
        f"{steps / ds.n:.2f}",
    ]


def _round_trip(ds: Any, path: Path) -> tuple[float, float]:
    """Seconds to write ``ds`` to ``path`` and to read it back (checked equal)."""
    t0 = time.perf_counter()
    save_dataset(ds, path)
    w = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = load_dataset(path)
    r = time.perf_counter() - t0
    assert back == ds
    return w, r


def _io_rows(users: int, minari_users: int, tmp: Path) -> list[list[object]]:
    rows: list[list[object]] = []
    ds = collect(LW, users, seed=2)
    w, r = _round_trip(ds, tmp / "d.npz")
    size = (tmp / "d.npz").stat().st_size / 1e6
    rows.append(["npz", users, ds.n, round(w, 3), round(r, 3), round(size, 2)])
    small = collect(LW, minari_users, seed=2)
    w, r = _round_trip(small, tmp / "d-v0")
    size = sum(p.stat().st_size for p in (tmp / "d-v0").rglob("*") if p.is_file()) / 1e6
    rows.append(["Minari (HDF5)", minari_users, small.n, round(w, 3), round(r, 3), round(size, 2)])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--max-users", type=int, default=100_000, help="largest LineWalk run")
    ap.add_argument("--minari-users", type=int, default=1000, help="users in the Minari row")
    args = ap.parse_args()
    sizes = [u for u in (1000, 10_000, 100_000) if u <= args.max_users]
    rows = [_collect_row(LW, u, None) for u in sizes]
    rows.append(_collect_row("CartPole-v1", 1000, (0.0, 1.0)))
    tmp = Path(tempfile.mkdtemp(prefix="qveil-bench-dataset-"))
    try:
        io = _io_rows(max(sizes), args.minari_users, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    body = (
        load_line()
        + "`collect` (one random-policy episode per user, validated `Dataset` returned) against "
        "the bare Gymnasium loop over the same envs and the same number of episodes in the "
        "same run (reset, step, discard); 'ratio' = collect / bare, the cost of recording, "
        "per-episode seeding and validation. Target: 1000 LineWalk users well under 5 s.\n\n"
        + table(
            [
                "env",
                "users",
                "samples",
                "collect s",
                "bare loop s",
                "ratio",
                "us / sample",
                "bare steps / sample",
            ],
            rows,
        )
        + "\n\nFormats: writing (validation included, atomic) and reading (validation "
        "included) a LineWalk dataset; the Minari row writes one HDF5 group per episode.\n\n"
        + table(["format", "users", "samples", "write s", "read s", "size MB"], io)
    )
    write_section("dataset", "Offline datasets", COMMAND, body)


if __name__ == "__main__":
    main()
