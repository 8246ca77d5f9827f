"""Query throughput for states of d = 4 coordinates against d = 1, same run -> docs/benchmarks.md,
section "multid", and docs/img/bench_multid.png.

    .venv/bin/python benchmarks/bench_multid.py [--seconds 2] [--rounds 3] [--concurrency 4]

Two `qveil serve` processes, each on its own SQLite store: a 1-D MLP release (the
bench_server bundle, 2 actions) and the CartPole-v1 kernel fqi release (d = 4, 2 actions,
configs/cartpole-private.toml, trained here on 200 users by the CLI). Closed loop of
``concurrency`` grpc.aio GetValues calls (all actions, batch 1024) for ``seconds`` per cell,
``rounds`` interleaved rounds (median). Kinds: *known* states (a pool of 4096 stored
beforehand, answered from the store's memory) and *new* states (fresh uniform draws in the
interval / box: each a durable exact conditional sample; for d = 4 one per coordinate, so up
to 4 new points per state and action). Ratios are d = 4 over d = 1 in the same run: the
additive noise costs d path look-ups (known) or up to d draws (new) per state and action,
and the kernel mean costs O(d * inducing) per state against the MLP's 64 x 64 forward.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import table, write_section  # noqa: E402
from bench_server import make_bundle, spawn, wait_released  # noqa: E402

from qveil.v1 import value_service_pb2 as pb  # noqa: E402
from qveil.v1 import value_service_pb2_grpc as pb_grpc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "cartpole-private.toml"
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


def kernel_bundle(tmp: Path, qveil: str) -> Path:
    # the benchmark's own registry, for this process and the servers it starts
    os.environ["QVEIL_HOME"] = str(tmp / "qveil-home")
    env = dict(os.environ)
    for argv in (
        ["budget", "create", "bench-users", "--epsilon", "100", "--delta", "0.1"],
        ["dataset", "collect", "--env", "CartPole-v1", "--users", "200", "--seed", "1",
         "--reward-range", "0,1", "--out", str(tmp / "cp.npz"), "--no-progress"],
        ["train", "--mode", "fqi", "--dataset", str(tmp / "cp.npz"), "--config", str(CONFIG),
         "--epsilon", "1", "--delta", "1e-5", "--out", str(tmp / "kbundle"),
         "--population", "bench-users", "--store", f"sqlite:///{tmp / 's4.sqlite'}"],
    ):  # fmt: skip
        r = subprocess.run(
            [qveil, *argv], capture_output=True, text=True, cwd=tmp, check=False, env=env
        )
        if r.returncode:
            raise RuntimeError(r.stderr)
    return tmp / "kbundle"


# long-function: a benchmark run top to bottom: every measurement feeds the one table and section it
#   writes
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="per cell and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    args = ap.parse_args()
    qveil = str(Path(sys.executable).parent / "qveil")
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="qveil-bench-md-") as tmpd:
        tmp = Path(tmpd)
        print("building the bundles ...", flush=True)
        bundles = {1: make_bundle(tmp / "bundle1"), 4: kernel_bundle(tmp, qveil)}
        rng = np.random.default_rng(1)
        box = np.array([[-0.3, 0.3], [-1.5, 1.5], [-0.2095, 0.2095], [-2.0, 2.0]])
        pools = {1: rng.uniform(0.0, 1.0, POOL), 4: rng.uniform(box[:, 0], box[:, 1], (POOL, 4))}

        def fresh(d: int) -> np.ndarray:
            if d == 1:
                return rng.uniform(0.0, 1.0, BATCH)
            return rng.uniform(box[:, 0], box[:, 1], (BATCH, 4))

        targets: dict[int, str] = {}
        try:
            for d, b in bundles.items():
                pf = tmp / f"s{d}.port"
                p, port = spawn(
                    [qveil, "serve", "--bundle", str(b), "--store",
                     f"sqlite:///{tmp / f's{d}.sqlite'}", "--listen", "127.0.0.1:0",
                     "--port-file", str(pf), "--max-in-flight", "1024",
                     "--new-state-rate", "1e12"],
                    pf,
                )  # fmt: skip
                procs.append(p)
                targets[d] = f"127.0.0.1:{port}"
                wait_released(targets[d])
                with grpc.insecure_channel(targets[d]) as ch:  # store the known pool
                    stub = pb_grpc.ValueServiceStub(ch)
                    for chunk in np.array_split(pools[d], 4):
                        stub.GetValues(request(chunk), timeout=300)
            res: dict[tuple[int, str], list[float]] = {}
            for r in range(args.rounds):
                for kind in ("known", "new"):
                    for d in (1, 4):
                        pool = pools[d]

                        def draw(d: int = d, kind: str = kind, pool: np.ndarray = pool) -> Any:
                            if kind == "known":
                                return pool[rng.integers(0, POOL, BATCH)]
                            return fresh(d)

                        out = asyncio.run(
                            closed_loop(targets[d], draw, args.seconds, args.concurrency)
                        )
                        res.setdefault((d, kind), []).append(out["states_s"])
                        print(f"round {r + 1}/{args.rounds} d={d} {kind}: "
                              f"{out['states_s']:.0f} states/s", flush=True)  # fmt: skip
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(10)
    med = {k: float(np.median(v)) for k, v in res.items()}
    rows = [
        [kind, med[(1, kind)], med[(4, kind)], med[(4, kind)] / med[(1, kind)]]
        for kind in ("known", "new")
    ]
    body = (
        "GetValues, batch 1024 states, all 2 actions, concurrency "
        f"{args.concurrency}, median of {args.rounds} rounds of {args.seconds:g} s; d = 1: the "
        "MLP release of the server section; d = 4: the CartPole kernel fqi release (additive "
        "noise sum_j g_{a,j}(x_j), one 1-D OU path per action and coordinate).\n\n"
        + table(["states", "d = 1 states/s", "d = 4 states/s", "d = 4 / d = 1"], rows)
        + "\n\nKnown states cost d path look-ups per state and action; a new state draws up to "
        "d points per action (one per new coordinate value), each an exact conditional "
        "committed before the answer.\n\n![d = 4 vs d = 1](img/bench_multid.png)\n"
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    xs = np.arange(2)
    ax.bar(xs - 0.2, [med[(1, k)] for k in ("known", "new")], 0.4, label="d = 1")
    ax.bar(xs + 0.2, [med[(4, k)] for k in ("known", "new")], 0.4, label="d = 4")
    ax.set_xticks(xs, ["known states", "new states"])
    ax.set_ylabel("states / s (batch 1024)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("GetValues throughput, d = 4 against d = 1")
    fig.tight_layout()
    PNG.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PNG, dpi=110)
    write_section("multid", "Query throughput for d = 4 states", COMMAND, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
