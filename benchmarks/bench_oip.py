"""The Open Inference Protocol against qveil's own API: the median latency of one
call of n states (all actions, the same states on every call) to a real
``qveil serve --http-port``,
through ValueService (``ValueClient.values``, the ceiling), the v2 gRPC binding (qveil's
stub with raw contents; tritonclient.grpc), and the v2 REST binding (httpx with JSON;
tritonclient.http with its binary extension). Ratios are against the ceiling of the same run.
tritonclient runs in its own process (its protobuf file and the server's stubs cannot share
one). Writes the "oip" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from _report import table, write_section  # noqa: E402
from server_helpers import make_bundle, running  # noqa: E402

from qveil.client.sync import ValueClient  # noqa: E402

COMMAND = "python benchmarks/bench_oip.py"

TRITON = """
import statistics, sys, time
import numpy as np
import tritonclient.grpc as g, tritonclient.http as h
grpc_url, http_url, n, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
xs = np.linspace(-0.9, 1.9, n).reshape(n, 1)
out = {}
for name, mod, url in (("tritonclient.grpc", g, grpc_url), ("tritonclient.http", h, http_url)):
    c = mod.InferenceServerClient(url)
    i = mod.InferInput("STATE", [n, 1], "FP64")
    i.set_data_from_numpy(xs)
    for _ in range(20):
        c.infer("qveil", [i])
    ts = []
    for _ in range(calls):
        s = time.perf_counter()
        c.infer("qveil", [i])
        ts.append(time.perf_counter() - s)
    out[name] = statistics.median(ts)
    c.close()
print(out)
"""


def median_seconds(fn: Callable[[], object], calls: int) -> float:
    for _ in range(20):
        fn()
    ts = []
    for _ in range(calls):
        s = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - s)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--states", type=int, nargs="+", default=[1, 64, 1024])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--no-write", action="store_true", help="print, do not write the doc")
    args = ap.parse_args()
    import grpc
    import httpx

    from qveil.oip import grpc_predict_v2_pb2 as pb
    from qveil.oip import grpc_predict_v2_pb2_grpc as pb_grpc

    tmp = Path(tempfile.mkdtemp(prefix="qveil-bench-oip-"))
    # the benchmark's own registry (make_bundle charges the release there; the server trusts it)
    os.environ["QVEIL_HOME"] = str(tmp / "qveil-home")
    (tmp / "qveil-home").mkdir()
    bundle = make_bundle(tmp / "bundle", seed=0)
    rows = []
    # every state counts against the caller's quota: lifted, the transports are measured
    extra = ("--http-port", "0", "--state-rate", "1e12")
    with running(tmp, bundle, *extra, store=f"sqlite:///{tmp / 's.sqlite'}") as sp:
        m = re.search(r"v2 REST on http://127\.0\.0\.1:(\d+)", sp.output())
        assert m, sp.output()
        http_url = f"127.0.0.1:{m.group(1)}"
        for n in args.states:
            xs = np.linspace(-0.9, 1.9, n)
            print(f"n = {n}: ValueService, v2 gRPC, v2 REST, tritonclient ...", flush=True)
            with ValueClient(sp.target) as c:
                ceiling = median_seconds(lambda c=c, xs=xs: c.values(xs), args.calls)
            with grpc.insecure_channel(sp.target) as ch:
                stub = pb_grpc.GRPCInferenceServiceStub(ch)
                t = pb.ModelInferRequest.InferInputTensor(name="STATE", datatype="FP64")
                t.shape.extend([n, 1])
                req = pb.ModelInferRequest(
                    model_name="qveil", inputs=[t], raw_input_contents=[xs.astype("<f8").tobytes()]
                )
                v2_grpc = median_seconds(lambda s=stub, r=req: s.ModelInfer(r), args.calls)
            state = {"name": "STATE", "datatype": "FP64", "shape": [n, 1], "data": xs.tolist()}
            body = {"inputs": [state]}
            with httpx.Client(base_url=f"http://{http_url}") as h:
                v2_rest = median_seconds(
                    lambda h=h, b=body: h.post("/v2/models/qveil/infer", json=b), args.calls
                )
            out = subprocess.run(
                [sys.executable, "-c", TRITON, sp.target, http_url, str(n), str(args.calls)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            tc = ast.literal_eval(out.strip().splitlines()[-1])
            for name, sec in (
                ("ValueService GetValues (ValueClient.values): ceiling", ceiling),
                ("v2 gRPC ModelInfer (qveil.oip stub, raw contents)", v2_grpc),
                ("v2 gRPC ModelInfer (tritonclient.grpc)", tc["tritonclient.grpc"]),
                ("v2 REST infer (httpx, JSON data)", v2_rest),
                ("v2 REST infer (tritonclient.http, binary data)", tc["tritonclient.http"]),
            ):
                rows.append((n, name, sec * 1e3, sec / ceiling))
    body = (
        "Median latency of one call over loopback (one client, one call at a time, the same "
        "states on every call, all actions), and its ratio to ValueService in the same "
        "run. The v2 bindings call the same query service; what differs is encoding and "
        "transport.\n\n" + table(["states", "path", "median ms", "x ValueService"], rows)
    )
    if args.no_write:
        print(body)
        return
    write_section("oip", "Open Inference Protocol (KServe v2) vs ValueService", COMMAND, body)


if __name__ == "__main__":
    main()
