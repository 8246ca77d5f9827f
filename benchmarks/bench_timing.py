"""The timing channel: can a client tell from a call's latency whether anyone asked about a
state before? -> docs/benchmarks.md, section "timing", and the figure docs/timing_channel.png.

    .venv/bin/python benchmarks/bench_timing.py [--queries 2000] [--repeats 3]

An answer is a pure function of the release and the state (the model's mean at the snapped
state plus the release's keyed noise): nothing is looked up or stored before it is answered,
and the answer log writes what was answered off the answer path. So a state asked before and
a new one should take the same time, with no padding. Each repeat starts a real
`qveil serve` over a fresh SQLite store, asks a pool of states once (``--queries / 2`` of
them: these are now "asked before"), then sends ``--queries`` single-state GetValues calls,
half for pool states and half for never-asked ones, in random order, one at a time, timing
each at the client. The attacker's best threshold rule ("new iff latency > t", or "new iff
latency < t", whichever fits better; t and the direction chosen on the first half of the
calls) is scored on the second half: 50 % is chance. The held-out score is the honest one;
the in-sample score of the best rule is shown too (it is above 50 % even for identical
distributions). Target: held-out accuracy at most 55 %.
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
from _report import load_average, save_figure, subplots, table, write_section  # noqa: E402
from bench_server import bench_home, make_bundle, serve_args, spawn, wait_ready  # noqa: E402

from qveil.v1 import value_service_pb2 as pb  # noqa: E402
from qveil.v1 import value_service_pb2_grpc as pb_grpc  # noqa: E402

QVEIL = str(Path(sys.executable).parent / "qveil")
FIG = Path(__file__).resolve().parent.parent / "docs" / "timing_channel.png"
TARGET = 0.55


def best_threshold(lat: np.ndarray, new: np.ndarray) -> tuple[float, int, float]:
    """(threshold, direction, accuracy) of the best rule "new iff direction * (latency - t)
    > 0" (direction +1: slower is new; -1: faster is new) on (lat, new)."""
    order = np.argsort(lat)
    s, y = lat[order], new[order].astype(int)
    n = len(s)
    # predicting "new" for indices >= i: correct = known below i + new from i on
    known_below = np.concatenate([[0], np.cumsum(1 - y)])
    new_from = np.concatenate([np.cumsum(y[::-1])[::-1], [0]])
    acc_up = (known_below + new_from) / n
    acc_down = 1.0 - acc_up  # the opposite rule at every cut
    best = []
    for acc, direction in ((acc_up, 1), (acc_down, -1)):
        i = int(np.argmax(acc))
        t = float(s[i - 1]) if i > 0 else float(s[0]) - 1.0
        best.append((float(acc[i]), t, direction))
    acc, t, direction = max(best)
    return t, direction, acc


def measure(queries: int, tmp: Path, bundle: Path, seed: int) -> dict[str, object]:
    """One repeat: a fresh server and store, the pool asked once, then the timed calls."""
    store = tmp / f"store-{seed}.sqlite"
    port_file = tmp / f"port-{seed}"
    proc, port = spawn(serve_args([QVEIL], bundle, f"sqlite:///{store}", port_file), port_file)
    rng = np.random.default_rng(seed)
    try:
        wait_ready(f"127.0.0.1:{port}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = pb_grpc.ValueServiceStub(ch)
            pool = rng.random(queries // 2)
            for chunk in np.array_split(pool, max(1, pool.size // 500)):  # asked once
                stub.GetValues(pb.GetValuesRequest(states=chunk.tolist()), timeout=30)
            for x in rng.random(50):  # warm the call path (states asked once, not timed)
                stub.GetValues(pb.GetValuesRequest(states=[float(x)]), timeout=30)
            time.sleep(1.0)  # the answer log has written the pool
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
    t, direction, _ = best_threshold(lat[:half], is_new[:half])
    held_out = float(np.mean((direction * (lat[half:] - t) > 0) == is_new[half:]))
    _, _, in_sample = best_threshold(lat, is_new)
    return {
        "seed": seed,
        "lat": lat,
        "new": is_new,
        "known_med": float(np.median(lat[~is_new])),
        "new_med": float(np.median(lat[is_new])),
        "known_p99": float(np.percentile(lat[~is_new], 99)),
        "new_p99": float(np.percentile(lat[is_new], 99)),
        "held_out": held_out,
        "in_sample": in_sample,
        "n_held_out": len(lat) - half,
    }


def plot(results: list[dict[str, object]]) -> None:
    """Latency histograms of asked-before and new states, all repeats pooled."""
    lat = np.concatenate([np.asarray(r["lat"]) for r in results])
    new = np.concatenate([np.asarray(r["new"]) for r in results])
    fig, ax = subplots(figsize=(6.4, 4.2))
    bins = np.linspace(np.percentile(lat, 0.5), np.percentile(lat, 99.5), 60)
    ax.hist(lat[~new], bins=bins, alpha=0.55, label="state asked before")
    ax.hist(lat[new], bins=bins, alpha=0.55, label="state never asked")
    accs = ", ".join(f"{100 * float(str(r['held_out'])):.1f} %" for r in results)
    ax.set_title(
        "qveil serve, single-state GetValues, no padding\n"
        f"held-out guess accuracy per repeat: {accs} (chance 50 %)",
        fontsize=9,
    )
    ax.set_xlabel("GetValues latency at the client (ms)")
    ax.set_ylabel("calls")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    save_figure(fig, FIG, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, default=2000, help="timed calls per repeat (even)")
    ap.add_argument("--repeats", type=int, default=3, help="independent servers and stores")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    load_before = load_average()
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bench_home(tmp)  # the benchmark's own registry, for this process and its servers
        bundle = make_bundle(tmp / "bundle")
        for i in range(args.repeats):
            print(f"repeat {i + 1}/{args.repeats}: {args.queries} calls ...", file=sys.stderr)
            results.append(measure(args.queries, tmp, bundle, args.seed + i))
    load_after = load_average()
    rows = [
        (
            i + 1,
            r["known_med"],
            r["new_med"],
            r["known_p99"],
            r["new_p99"],
            f"{100 * float(str(r['held_out'])):.1f} %",
            f"{100 * float(str(r['in_sample'])):.1f} %",
        )
        for i, r in enumerate(results)
    ]
    accs = [float(str(r["held_out"])) for r in results]
    n_held = int(str(results[0]["n_held_out"]))
    sd = 0.5 / np.sqrt(n_held)
    verdict = (
        f"Held-out accuracy: {', '.join(f'{100 * a:.1f} %' for a in accs)} (mean "
        f"{100 * float(np.mean(accs)):.1f} %; target at most {100 * TARGET:.0f} %: "
        f"{'met' if max(accs) <= TARGET else 'MISSED'} in every repeat"
        if max(accs) <= TARGET
        else f"Held-out accuracy: {', '.join(f'{100 * a:.1f} %' for a in accs)} (target at "
        f"most {100 * TARGET:.0f} %: MISSED in {sum(a > TARGET for a in accs)} of {len(accs)} "
        "repeats"
    )
    body = (
        f"Load average (1, 5, 15 min) before the run: {load_before}; after: {load_after} (2 "
        "cores shared with other work).\n\n"
        + table(
            [
                "repeat",
                "asked before: median ms",
                "new: median ms",
                "asked before: p99 ms",
                "new: p99 ms",
                "guess accuracy (held out)",
                "best rule (in sample)",
            ],
            rows,
        )
        + f"\n\n{args.queries} single-state GetValues calls per repeat (half for states asked "
        "once before the timed calls, half for states never asked, in random order, one at a "
        "time), each repeat its own `qveil serve` and SQLite store on loopback, no padding "
        '(there is none to set). Accuracy: the best rule "new iff latency > t" or "new '
        'iff latency < t", t and the direction fitted on the first half of the calls and '
        f"scored on the second ({n_held} calls; 50 % is chance, its standard deviation "
        f"there {100 * sd:.1f} points). {verdict}). Both kinds take the same path: the "
        "answer is computed from the release's key, never looked up, and the answer log "
        "writes new states to the store off the answer path, after the reply."
        "\n\n![latency histograms](timing_channel.png)"
    )
    if args.no_write:
        print(body)
        return 0
    plot(results)
    write_section(
        "timing",
        "Timing channel: states asked before vs new states",
        f".venv/bin/python benchmarks/bench_timing.py --queries {args.queries} "
        f"--repeats {args.repeats}",
        body,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
