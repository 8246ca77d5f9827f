"""Trace one GetValues for one new state through a real in-process server and print the qveil
files its calls enter, per thread: the thread that answers the call, and the answer log's
thread that logs what was answered. (docs/architecture.md, "One query's path".)

    .venv/bin/python scripts/trace_query_path.py

A hop is a call entering a function of another file than the previous call's; "back" counts
hops into a file the thread had left before (a helper called, returned from, then another
called from the same file counts one). Seeded bundle, throwaway registry and store in a
temporary directory.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ["QVEIL_HOME"] = tempfile.mkdtemp(prefix="qveil-trace-")

from server_helpers import make_bundle  # noqa: E402

from qveil.client.sync import ValueClient  # noqa: E402
from qveil.server.local import LocalServer  # noqa: E402

EVENTS: list[tuple[int, str]] = []
ON = threading.Event()


def tracer(frame: FrameType, event: str, arg: object) -> None:
    if ON.is_set() and event == "call":
        f = frame.f_code.co_filename
        if f.startswith(str(ROOT)) and "/qveil/" in f and "_pb2" not in f:
            EVENTS.append((threading.get_ident(), f[len(str(ROOT)) + 1 :]))


def main() -> None:
    d = Path(tempfile.mkdtemp(prefix="qveil-trace-"))
    bundle = make_bundle(d / "bundle", seed=1)
    threading.settrace(tracer)  # the server's threads start below
    with LocalServer(bundle, f"sqlite:///{d / 'store.sqlite'}") as srv:
        with ValueClient(srv.target) as client:
            client.get_values([[0.25]])  # warm: channel, active release, caches
            time.sleep(0.5)
            ON.set()
            client.get_values([[0.625]])  # one new state
            time.sleep(1.0)  # the answer log's thread logs it
            ON.clear()
    by_thread: dict[int, list[str]] = {}
    for t, f in EVENTS:
        by_thread.setdefault(t, []).append(f)
    for n, files in enumerate(by_thread.values(), 1):
        seq = [f for i, f in enumerate(files) if i == 0 or f != files[i - 1]]
        left: set[str] = set()
        back = 0
        for i in range(1, len(seq)):
            back += seq[i] in left
            left.add(seq[i - 1])
        print(
            f"thread {n}: {len(set(files))} files, {len(seq) - 1} hops between files, "
            f"{back} back into a file left before"
        )
        print("  " + " > ".join(Path(f).name for f in seq))


if __name__ == "__main__":
    main()
