"""Activation under load: clients query a real ``qveil serve`` continuously while an
admin activates releases back and forth through AdminService. Counts responses and errors,
responses per release, and the latency of each ActivateRelease call.

Writes the "activation" section of docs/benchmarks.md. (Correctness, i.e. that every response
is exactly one release's network + keyed noise, is asserted by
tests/integration/test_admin_server.py::test_activation_under_load_no_error_one_release_per_response.)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from _report import table, write_section  # noqa: E402
from server_helpers import make_bundle, make_tokens, running  # noqa: E402

from qveil.bundle import load_bundle  # noqa: E402
from qveil.client.sync import AdminClient, ValueClient  # noqa: E402

COMMAND = "python benchmarks/bench_activation.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--activations", type=int, default=6)
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between activations")
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qveil-bench-activation-"))
    # the benchmark's own registry (make_bundle charges the releases there; the server trusts it)
    os.environ["QVEIL_HOME"] = str(tmp / "qveil-home")
    (tmp / "qveil-home").mkdir()
    a = make_bundle(tmp / "bundles" / "a", seed=0, sigma=2.0)
    b = make_bundle(tmp / "bundles" / "b", seed=1, sigma=3.0)
    tok = make_tokens(tmp / "tokens.toml")
    ida, idb = load_bundle(a).bundle_id, load_bundle(b).bundle_id
    # every state counts against the caller's quota: lifted, the activations are measured
    with running(tmp, a, "--tokens-file", str(tok.path), "--state-rate", "1e12") as srv:
        seen: list[str] = []
        errors: list[BaseException] = []
        stop = threading.Event()

        def query(k: int) -> None:
            rng = np.random.default_rng(k)
            with ValueClient(srv.target, token=tok.query) as c:
                while not stop.is_set():
                    states = np.concatenate([np.linspace(-1, 2, 7), rng.uniform(-1, 2, 3)])
                    try:
                        seen.append(c.get_values(states).release_id)
                    except BaseException as exc:  # noqa: BLE001 - counted
                        errors.append(exc)

        threads = [threading.Thread(target=query, args=(k,)) for k in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(args.pause)
        lat = []
        with AdminClient(srv.target, token=tok.admin) as ad:
            for i in range(args.activations):
                s = time.perf_counter()
                ad.activate(idb if i % 2 == 0 else ida)
                lat.append(time.perf_counter() - s)
                time.sleep(args.pause)
        stop.set()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    lat_ms = np.array(lat) * 1e3
    rows = [
        [
            args.clients,
            args.activations,
            len(seen),
            len(errors),
            seen.count(ida),
            seen.count(idb),
            len(seen) / wall,
            float(np.median(lat_ms)),
            float(lat_ms.max()),
        ]
    ]
    body = (
        f"{args.clients} client threads, each querying 10 states per call (7 fixed, 3 fresh), "
        f"while release A and B are activated alternately {args.activations} times, "
        f"{args.pause:g} s apart, through AdminService (bundles made by "
        "tests/server_helpers.make_bundle; SQLite store beside them).\n\n"
        + table(
            [
                "clients",
                "activations",
                "responses",
                "errors",
                "from A",
                "from B",
                "responses/s",
                "activate p50 (ms)",
                "activate max (ms)",
            ],
            rows,
        )
    )
    if args.no_write:
        print(body)
        return
    write_section("activation", "Activation under load", COMMAND, body)


if __name__ == "__main__":
    main()
