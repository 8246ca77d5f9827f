"""Query throughput for states of d = 4, 8 and 16 coordinates against d = 1, same run ->
docs/benchmarks.md, section "multid", and docs/img/bench_multid.png.

    .venv/bin/python benchmarks/bench_multid.py [--seconds 2] [--rounds 3] [--concurrency 4]
        [--dims 1,4,8,16]

One `qveil serve` process per d, each on its own SQLite store: a 1-D MLP release (the
bench_server bundle, 2 actions) and the kernel fqi releases of CartPole-v1 (d = 4, 2
actions), LunarLander-v3 (d = 8, 4 actions) and qveil/Reach16-v0 (d = 16, 2 actions), each
trained here on 200 users by the CLI from its public config in configs/. Closed loop of
``concurrency`` grpc.aio GetValues calls (all actions, batch 1024) for ``seconds`` per cell,
``rounds`` interleaved rounds (median). Kinds: *known* states (a pool of 4096 asked
beforehand) and *new* states (fresh uniform draws in the interval / box). An answer is a pure
function of the release and the state, so both take the same path: the additive noise costs
d keyed path values per state and action (each a descent of 20 levels below the key's table),
and the kernel mean costs O(d * inducing) per state against the MLP's 64 x 64 forward; a new
state also adds up to d points per action to the answer log, written off the answer path.
Ratios are d over d = 1 in the same run. After each cell the run waits until the servers are
idle (their answer logs have written the cell's new points), so a backlog does not slow the
next cell.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import save_figure, subplots, table, write_section  # noqa: E402
from bench_server import (  # noqa: E402
    bench_home,
    ensure_population,
    make_bundle,
    serve_args,
    settle,
    spawn,
    stop_all,
    wait_released,
)

from qveil.v1 import value_service_pb2 as pb  # noqa: E402
from qveil.v1 import value_service_pb2_grpc as pb_grpc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: d -> the public config of its kernel fqi release
CONFIGS = {
    4: ROOT / "configs" / "cartpole-private.toml",
    8: ROOT / "configs" / "lunarlander-sobol.toml",
    16: ROOT / "configs" / "reach16-private.toml",
}
COMMAND = ".venv/bin/python benchmarks/bench_multid.py"
BATCH, POOL = 1024, 4096
PNG = ROOT / "docs" / "img" / "bench_multid.png"


def request(states: np.ndarray) -> pb.GetValuesRequest:
    if states.ndim == 1:
        return pb.GetValuesRequest(states=states.tolist())
    return pb.GetValuesRequest(
        state_matrix=pb.StateMatrix(values=states.reshape(-1).tolist(), dims=states.shape[1])
    )


async def closed_loop(target: str, draw: Any, seconds: float, concurrency: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.ValueServiceStub(ch)
        calls = 0
        stop_at = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal calls
            while time.perf_counter() < stop_at:
                await stub.GetValues(request(draw()), timeout=120)
                calls += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"states_s": calls * BATCH / wall}


def kernel_bundle(tmp: Path, qveil: str, d: int = 4) -> Path:
    """The kernel fqi release of ``CONFIGS[d]``, trained on 200 simulated users by the CLI
    (its environment and reward range from the config), charged and receipted in the
    benchmark's own registry (``QVEIL_HOME`` under ``tmp``, :func:`bench_home`)."""
    bench_home(tmp)  # the benchmark's own registry, for this process and its servers
    pop = ensure_population()
    env = dict(os.environ)
    cfg = CONFIGS[d]
    env_id = tomllib.loads(cfg.read_text())["env_id"]
    data, out = tmp / f"data{d}.npz", tmp / f"kbundle{d}"
    steps = [
        ["dataset", "collect", "--env", env_id, "--users", "200", "--seed", "1",
         "--config", str(cfg), "--clip-rewards", "--out", str(data), "--no-progress"],
        ["train", "--mode", "fqi", "--dataset", str(data), "--config", str(cfg),
         "--epsilon", "1", "--delta", "1e-5", "--out", str(out), "--force", *pop],
    ]  # fmt: skip
    for argv in steps:
        r = subprocess.run(
            [qveil, *argv], capture_output=True, text=True, cwd=tmp, check=False, env=env
        )
        if r.returncode:
            raise RuntimeError(r.stderr)
    return out


class Workload:
    """The states a cell asks: the known pool of each d (asked before the rounds) and fresh
    uniform draws in the release's interval (d = 1) or box (its public state intervals)."""

    def __init__(self, boxes: dict[int, np.ndarray]) -> None:
        self.rng = np.random.default_rng(1)
        self.boxes = boxes
        #: the servers' processes (to wait for their answer logs between cells)
        self.pids: list[int] = []
        self.pools = {d: self._uniform(d, POOL) for d in boxes}

    def _uniform(self, d: int, n: int) -> np.ndarray:
        box = self.boxes[d]
        if d == 1:
            return self.rng.uniform(box[0, 0], box[0, 1], n)
        return self.rng.uniform(box[:, 0], box[:, 1], (n, d))

    def fresh(self, d: int) -> np.ndarray:
        return self._uniform(d, BATCH)

    def draw(self, d: int, kind: str) -> Any:
        if kind == "known":
            return self.pools[d][self.rng.integers(0, POOL, BATCH)]
        return self.fresh(d)


def box_of(bundle: Path) -> np.ndarray:
    """[d, 2] public state intervals of a release bundle."""
    from qveil.bundle import load_bundle

    box = load_bundle(bundle, verify=False).box
    return np.stack([box.lo, box.hi], axis=1)


def serve(
    tmp: Path, qveil: str, bundles: dict[int, Path], work: Workload, procs: list[Any]
) -> dict[int, str]:
    """A `qveil serve` per bundle on its own SQLite store (started processes appended to
    ``procs``), each released and its known pool asked once; the targets by d."""
    targets: dict[int, str] = {}
    for d, b in bundles.items():
        pf = tmp / f"s{d}.port"
        p, port = spawn(
            serve_args([qveil], b, f"sqlite:///{tmp / f's{d}.sqlite'}", pf, "--state-rate", "1e12"),
            pf,
        )
        procs.append(p)
        work.pids.append(p.pid)
        targets[d] = f"127.0.0.1:{port}"
        wait_released(targets[d])
        with grpc.insecure_channel(targets[d]) as ch:  # ask the known pool once
            stub = pb_grpc.ValueServiceStub(ch)
            for chunk in np.array_split(work.pools[d], 4):
                stub.GetValues(request(chunk), timeout=300)
    return targets


def rounds(
    targets: dict[int, str], work: Workload, args: argparse.Namespace
) -> dict[tuple[int, str], float]:
    """``args.rounds`` interleaved rounds of every (d, kind) cell; the median states/s of each."""
    res: dict[tuple[int, str], list[float]] = {}
    for r in range(args.rounds):
        for kind in ("known", "new"):
            for d in targets:

                def draw(d: int = d, kind: str = kind) -> Any:
                    return work.draw(d, kind)

                out = asyncio.run(closed_loop(targets[d], draw, args.seconds, args.concurrency))
                settle(work.pids)  # the answer logs have written this cell's new points
                res.setdefault((d, kind), []).append(out["states_s"])
                print(f"round {r + 1}/{args.rounds} d={d} {kind}: "
                      f"{out['states_s']:.0f} states/s", flush=True)  # fmt: skip
    return {k: float(np.median(v)) for k, v in res.items()}


def section_body(med: dict[tuple[int, str], float], args: argparse.Namespace) -> str:
    dims = sorted({d for d, _ in med})
    rows = [
        [
            kind,
            *(med[(d, kind)] for d in dims),
            *(med[(d, kind)] / med[(1, kind)] for d in dims[1:]),
        ]
        for kind in ("known", "new")
    ]
    head = [
        "states",
        *(f"d = {d} states/s" for d in dims),
        *(f"d = {d} / d = 1" for d in dims[1:]),
    ]
    return (
        "GetValues, batch 1024 states, all actions, concurrency "
        f"{args.concurrency}, median of {args.rounds} rounds of {args.seconds:g} s (after each "
        "cell the run waits until the servers are idle, their answer logs written); d = 1: the "
        "MLP release of the server section (2 actions); d = 4, 8, 16: the kernel fqi releases "
        "of CartPole-v1 (2 actions), LunarLander-v3 (4 actions) and qveil/Reach16-v0 (2 "
        "actions) (additive noise sum_j g_{a,j}(x_j), one 1-D OU path per action and "
        "coordinate).\n\n"
        + table(head, rows)
        + "\n\nKnown states (the pool, asked again and again) and new states take the same "
        "path: an answer is a pure function of the release and the state (no cache, no store "
        "on the answer path), d keyed path values per state and action. A new state also "
        "hands up to d new points per action to the answer log, which writes them to the "
        "store off the answer path (its CPU is the server's too). LunarLander answers 4 "
        "actions per state, the others 2."
        "\n\n![states/s against d](img/bench_multid.png)\n"
    )


def plot(med: dict[tuple[int, str], float], path: Path) -> None:
    dims = sorted({d for d, _ in med})
    fig, ax = subplots(figsize=(6, 3.4))
    xs = np.arange(2)
    w = 0.8 / len(dims)
    for i, d in enumerate(dims):
        ax.bar(xs + (i - (len(dims) - 1) / 2) * w, [med[(d, k)] for k in ("known", "new")], w,
               label=f"d = {d}")  # fmt: skip
    ax.set_xticks(xs, ["known states", "new states"])
    ax.set_ylabel("states / s (batch 1024)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("GetValues throughput against d")
    save_figure(fig, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="per cell and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--dims", default="1,4,8,16", help="d of the releases (1 and any of 4, 8, 16)")
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    args = ap.parse_args()
    dims = [int(d) for d in args.dims.split(",")]
    if dims[0] != 1 or any(d not in CONFIGS for d in dims[1:]):
        ap.error(f"--dims: 1, then any of {sorted(CONFIGS)}")
    qveil = str(Path(sys.executable).parent / "qveil")
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="qveil-bench-md-") as tmpd:
        tmp = Path(tmpd)
        bench_home(tmp)  # the benchmark's own registry, for this process and its servers
        print("building the bundles ...", flush=True)
        bundles = {1: make_bundle(tmp / "bundle1")}
        for d in dims[1:]:
            print(f"training the d = {d} release ...", flush=True)
            bundles[d] = kernel_bundle(tmp, qveil, d)
        boxes = {d: box_of(b) for d, b in bundles.items()}
        work = Workload(boxes)
        try:
            med = rounds(serve(tmp, qveil, bundles, work, procs), work, args)
        finally:
            stop_all(procs)
    body = section_body(med, args)
    if args.no_write:
        print(body)
        return 0
    plot(med, PNG)
    write_section("multid", "Query throughput against d", COMMAND, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
