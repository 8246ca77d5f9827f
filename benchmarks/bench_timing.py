"""The timing channel -> docs/benchmarks.md, section "timing", and the
figure docs/timing_channel.png.

    .venv/bin/python benchmarks/bench_timing.py [--queries 400] [--pads 0,3,25]

A stored state is answered from the store's memory; a new one costs a durable conditional
draw (a SQLite transaction and fsync), so its latency is higher and a client can guess
whether anyone asked about a state before. For each ``--min-latency-ms`` pad this starts a
real `qveil serve` over a fresh SQLite store, stores a pool of states, then sends
``--queries`` single-state GetValues calls, half for stored states and half for new ones,
in random order, one at a time, timing each at the client. The attacker's best threshold rule
("new if latency > t", t chosen on one half of the calls) is scored on the other half: 50 %
is chance, 100 % a perfect distinguisher. The held-out score is the honest one; the in-sample
score of the best threshold is shown too (it is >= 50 % even for identical distributions).
Ceiling of this run: the unpadded server's own accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import grpc  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import save_figure, subplots, table, write_section  # noqa: E402
from bench_server import make_bundle, serve_args, spawn, wait_ready  # noqa: E402

from qveil.v1 import value_service_pb2 as pb  # noqa: E402
from qveil.v1 import value_service_pb2_grpc as pb_grpc  # noqa: E402

QVEIL = str(Path(sys.executable).parent / "qveil")
FIG = Path(__file__).resolve().parent.parent / "docs" / "timing_channel.png"


def best_threshold(lat: np.ndarray, new: np.ndarray) -> tuple[float, float]:
    """(threshold, accuracy) of the best rule "new iff latency > t" on (lat, new)."""
    order = np.argsort(lat)
    s, y = lat[order], new[order].astype(int)
    n = len(s)
    # predicting "new" for indices >= i: correct = known below i + new from i on
    known_below = np.concatenate([[0], np.cumsum(1 - y)])
    new_from = np.concatenate([np.cumsum(y[::-1])[::-1], [0]])
    acc = (known_below + new_from) / n
    i = int(np.argmax(acc))
    t = float(s[i - 1]) if i > 0 else float(s[0]) - 1.0
    return t, float(acc[i])


def measure(pad: float, queries: int, tmp: Path, bundle: Path, seed: int) -> dict[str, object]:
    store = tmp / f"store-{pad:g}.sqlite"
    port_file = tmp / f"port-{pad:g}"
    proc, port = spawn(
        serve_args([QVEIL], bundle, f"sqlite:///{store}", port_file, "--min-latency-ms", str(pad)),
        port_file,
    )
    rng = np.random.default_rng(seed)
    try:
        wait_ready(f"127.0.0.1:{port}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.ValueServiceStub(ch)
            pool = rng.random(queries // 2)
            stub.GetValues(pb.GetValuesRequest(states=pool.tolist()), timeout=30)  # store them
            for x in pool[:20]:  # warm the path
                stub.GetValues(pb.GetValuesRequest(states=[float(x)]), timeout=30)
            is_new = rng.permutation(np.repeat([False, True], queries // 2))
            fresh = iter(rng.random(queries))
            known = iter(rng.permutation(pool))
            lat = np.empty(len(is_new))
            for i, nw in enumerate(is_new):
                x = float(next(fresh) if nw else next(known))
                t0 = time.perf_counter()
                stub.GetValues(pb.GetValuesRequest(states=[x]), timeout=30)
                lat[i] = (time.perf_counter() - t0) * 1e3
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    half = len(lat) // 2
    t, _ = best_threshold(lat[:half], is_new[:half])
    held_out = float(np.mean((lat[half:] > t) == is_new[half:]))
    _, in_sample = best_threshold(lat, is_new)
    return {
        "pad": pad,
        "lat": lat,
        "new": is_new,
        "known_med": float(np.median(lat[~is_new])),
        "new_med": float(np.median(lat[is_new])),
        "new_p99": float(np.percentile(lat[is_new], 99)),
        "held_out": held_out,
        "in_sample": in_sample,
    }


def plot(results: list[dict[str, object]]) -> None:
    fig, axes = subplots(1, len(results), figsize=(4 * len(results), 3))
    for ax, r in zip(np.atleast_1d(axes), results, strict=True):
        lat, new = np.asarray(r["lat"]), np.asarray(r["new"])
        bins = np.linspace(lat.min(), np.percentile(lat, 99.5), 40)
        ax.hist(lat[~new], bins=bins, alpha=0.6, label="stored state")
        ax.hist(lat[new], bins=bins, alpha=0.6, label="new state")
        ax.set_title(f"--min-latency-ms {r['pad']:g}: guess {100 * float(r['held_out']):.0f} %")
        ax.set_xlabel("GetValues latency (ms)")
        ax.legend(fontsize=7)
    save_figure(fig, FIG, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=400, help="timed calls per pad (even)")
    ap.add_argument("--pads", default="0,3,25", help="comma-separated --min-latency-ms values")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    pads = [float(p) for p in args.pads.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["QVEIL_HOME"] = str(tmp / "qveil-home")  # this run's own registry
        for i, pad in enumerate(pads):
            print(f"pad {pad:g} ms: {args.queries} calls ...", file=sys.stderr, flush=True)
            bundle = make_bundle(tmp / f"bundle-{i}")  # one release per store
            results.append(measure(pad, args.queries, tmp, bundle, args.seed + i))
    base = float(results[0]["held_out"]) if pads[0] == 0 else float("nan")
    rows = [
        (
            f"{r['pad']:g}",
            r["known_med"],
            r["new_med"],
            r["new_p99"],
            f"{100 * float(r['held_out']):.1f} %",
            f"{100 * float(r['in_sample']):.1f} %",
            f"{(float(r['held_out']) - 0.5) / (base - 0.5):.2f}" if base == base else "n/a",
        )
        for r in results
    ]
    body = table(
        [
            "--min-latency-ms",
            "stored: median ms",
            "new: median ms",
            "new: p99 ms",
            "guess accuracy (held out)",
            "best threshold (in sample)",
            "advantage vs unpadded",
        ],
        rows,
    )
    body += (
        f"\n\n{args.queries} single-state GetValues calls per row (half stored, half new, random "
        "order), one `qveil serve` with a SQLite store on loopback. Accuracy: the best rule "
        '"new iff latency > t", t fitted on the first half of the calls and scored on the second; '
        "50 % is chance. Advantage: (accuracy - 50 %) relative to the unpadded server's. "
        "A pad below the new-state tail (p99) leaves the tail visible; the pad must exceed it."
        "\n\n![latency histograms](timing_channel.png)"
    )
    if args.no_write:
        print(body)
        return 0
    plot(results)
    write_section(
        "timing",
        "Timing channel: stored vs new states",
        f".venv/bin/python benchmarks/bench_timing.py --queries {args.queries} --pads {args.pads}",
        body,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
