"""Writer processes for the store's concurrency and crash tests.

The tests start these with the ``fork`` start method (the child has the parent's imports, so
30+ kill/restart cycles take seconds, not minutes); each child opens its *own* store (its own
connections: nothing is shared with the parent but the database) and leaves with
``os._exit``. ``python tests/store_worker.py concurrent|crash ...`` runs the same code in a
fresh interpreter.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def concurrent_writer(
    url: str,
    rid: str,
    action: int,
    seed: int,
    rounds: int,
    grid: list[float],
    log_path: str,
    broken: bool = False,
    start_at: float = 0.0,
    sweep: bool = False,
    rendezvous: str = "",
    parties: int = 1,
) -> None:
    """Query random small batches of ``grid`` (overlapping with the other writers); log every
    insertion's seen neighbours (debug hook, written after its commit) and every answer.

    ``sweep``: all writers move through the (sorted) grid together, 4 grid points per round
    with a random offset of 0-3 and 1-3 points per batch, so concurrent new points are
    immediate neighbours of each other (the hardest case for serialisation).

    ``rendezvous``: a folder where each of the ``parties`` writers announces itself once its
    store is open; every writer starts its rounds only when all have (then at ``start_at`` at
    the earliest), so they overlap however slowly the forks and the opens come."""
    from qveil.errors import IntegrityError
    from qveil.server.store import open_store

    if broken:
        from broken_store import BrokenSQLStore

        store = BrokenSQLStore(url, rng=seed)
    else:
        store = open_store(url, rng=seed)
    rng = np.random.default_rng(seed + 1000)
    g_arr = np.asarray(grid)
    with open(log_path, "w", encoding="utf-8") as log:

        def hook(_r: str, _a: int, recs: list) -> None:  # type: ignore[type-arg]
            for r in recs:
                log.write(
                    json.dumps(
                        {"t": "ins", "seq": r.seq, "x": r.x, "left": r.left, "right": r.right}
                    )
                    + "\n"
                )

        store.set_debug_hook(hook)
        if rendezvous:
            _meet(Path(rendezvous), seed, parties)
        while time.time() < start_at:
            time.sleep(0.001)
        for _ in range(rounds):  # noqa: B007
            k = int(rng.integers(1, 4))
            if sweep:
                lo = min(4 * _ + int(rng.integers(0, 4)), len(g_arr) - k)
                xs = g_arr[lo : lo + k]
            else:
                xs = rng.choice(g_arr, size=k)
            try:
                gs = store.get_or_sample(rid, action, xs)
            except IntegrityError as exc:
                if not broken:
                    raise
                # the broken mode stored a state twice (no lock, and the append log has no
                # unique x): the store refuses the path from then on
                log.write(json.dumps({"t": "refused", "msg": str(exc)}) + "\n")
                break
            log.write(json.dumps({"t": "ans", "x": xs.tolist(), "g": gs.tolist()}) + "\n")
        log.flush()
    store.close()


def same_x_writer(
    url: str, rid: str, action: int, seed: int, xs: list[float], log_path: str, start_at: float
) -> None:
    """Ask ``xs`` one state per call, in order, from ``start_at`` on; log every answer. Several
    of these with the same ``xs`` race on the same new state at every call."""
    from qveil.server.store import open_store

    store = open_store(url, rng=seed)
    with open(log_path, "w", encoding="utf-8") as log:
        while time.time() < start_at:
            time.sleep(0.001)
        for x in xs:
            g = float(store.get_or_sample(rid, action, [x])[0])
            log.write(json.dumps({"x": x, "g": g}) + "\n")
        log.flush()
    store.close()


def crash_writer(url: str, rid: str, seed: int, fd: int) -> None:
    """Stream new points forever; after each answer, report it on ``fd`` (one JSON line).

    The parent SIGKILLs this process at random moments; whatever it reported must survive."""
    from qveil.server.store import open_store

    store = open_store(url, rng=seed)
    rng = np.random.default_rng(seed)
    while True:
        xs = rng.uniform(size=int(rng.integers(1, 12)))
        a = int(rng.integers(0, 2))
        gs = store.get_or_sample(rid, a, xs)
        os.write(fd, (json.dumps({"a": a, "x": xs.tolist(), "g": gs.tolist()}) + "\n").encode())


def _meet(folder: Path, me: int, parties: int, timeout: float = 300.0) -> None:
    """Announce ``me`` in ``folder`` and wait until ``parties`` writers have."""
    folder.mkdir(exist_ok=True)
    (folder / f"{me}").touch()
    deadline = time.time() + timeout
    while sum(1 for _ in folder.iterdir()) < parties:
        if time.time() > deadline:
            raise TimeoutError(f"only some of {parties} writers reached {folder}")
        time.sleep(0.002)


def run_forked(target, *args):  # type: ignore[no-untyped-def]
    """Start ``target(*args)`` in a forked child that leaves with os._exit (code 0 / 1).

    The parent collects its garbage first and the child freezes what it inherited: a child
    that garbage-collects objects of an earlier test's gRPC server or channel (cyclic garbage
    still waiting in the parent at fork time) spins forever inside gRPC's core."""
    gc.collect()
    pid = os.fork()
    if pid == 0:  # child
        gc.freeze()
        code = 0
        try:
            target(*args)
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    return pid


if __name__ == "__main__":  # pragma: no cover - manual use
    mode, *rest = sys.argv[1:]
    if mode == "crash":
        crash_writer(rest[0], rest[1], int(rest[2]), sys.stdout.fileno())
    elif mode == "concurrent":
        grid = np.linspace(0, 1, 200).tolist()
        concurrent_writer(
            rest[0],
            rest[1],
            0,
            int(rest[2]),
            int(rest[3]),
            grid,
            rest[4],
            broken=len(rest) > 5 and rest[5] == "broken",
        )
