"""Writer processes for the store's concurrency and crash tests.

The tests start these with the ``fork`` start method (the child has the parent's imports, so
30+ kill/restart cycles take seconds, not minutes); each child opens its *own* store (its own
connections: nothing is shared with the parent but the database) and leaves with
``os._exit``. ``python tests/store_worker.py concurrent|crash ...`` runs the same code in a
fresh interpreter.

Every writer logs what a server would have answered: the values of the release's paths
under the store tests' seeded key (:func:`store_helpers.keyed_paths`), so all writers hand
over the same value for one state, as replicas of one release do.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
    """Log random small batches of ``grid`` (overlapping with the other writers); record
    every call's states, values and (written, mismatched) counts in ``log_path``.

    ``sweep``: all writers move through the (sorted) grid together, 4 grid points per round
    with a random offset of 0-3 and 1-3 points per batch, so the writers race on the same
    new states round after round.

    ``rendezvous``: a folder where each of the ``parties`` writers announces itself once its
    store is open; every writer starts its rounds only when all have (then at ``start_at`` at
    the earliest), so they overlap however slowly the forks and the opens come."""
    from store_helpers import keyed_paths, path_values

    from qveil.errors import IntegrityError
    from qveil.server.store import open_store

    if broken:
        from broken_store import BrokenSQLStore

        store = BrokenSQLStore(url)
    else:
        store = open_store(url)
    kp = keyed_paths(store.releases.get_release(rid))
    rng = np.random.default_rng(seed + 1000)
    g_arr = np.asarray(grid)
    with open(log_path, "w", encoding="utf-8") as log:
        if rendezvous:
            _meet(Path(rendezvous), seed, parties)
        while time.time() < start_at:
            time.sleep(0.001)
        for r in range(rounds):
            k = int(rng.integers(1, 4))
            if sweep:
                lo = min(4 * r + int(rng.integers(0, 4)), len(g_arr) - k)
                units = g_arr[lo : lo + k]
            else:
                units = rng.choice(g_arr, size=k)
            xs, gs = path_values(kp, action, units)
            try:
                written, mism = store.record_paths(rid, [action], [xs], [gs])
            except IntegrityError as exc:
                if not broken:
                    raise
                # the broken mode logged a state twice (no lock, and the append log has no
                # unique x): the store refuses the path from then on
                log.write(json.dumps({"t": "refused", "msg": str(exc)}) + "\n")
                break
            log.write(
                json.dumps(
                    {"t": "log", "x": xs.tolist(), "g": gs.tolist(), "w": written, "m": mism}
                )
                + "\n"
            )
        log.flush()
    store.close()


def same_x_writer(
    url: str, rid: str, action: int, xs: list[float], log_path: str, start_at: float
) -> None:
    """Log ``xs`` one state per call, in order, from ``start_at`` on; record every call's
    value and written count. Several of these with the same ``xs`` race on the same new
    state at every call."""
    from store_helpers import keyed_paths, path_values

    from qveil.server.store import open_store

    store = open_store(url)
    kp = keyed_paths(store.releases.get_release(rid))
    with open(log_path, "w", encoding="utf-8") as log:
        while time.time() < start_at:
            time.sleep(0.001)
        for u in xs:
            x, g = path_values(kp, action, [u])
            written, mism = store.record_paths(rid, [action], [x], [g])
            log.write(json.dumps({"x": float(x[0]), "g": float(g[0]), "w": written}) + "\n")
        log.flush()
    store.close()


def crash_writer(url: str, rid: str, seed: int, fd: int) -> None:
    """Log new states forever: before each call, report its (path, states, values) on ``fd``
    as ``{"t": "try", ...}``; after the call returned (the commit is durable), ``{"t": "done"}``
    (one JSON line each).

    The parent SIGKILLs this process at random moments: whatever was done must survive, and
    the call in flight must be in the log whole or not at all."""
    from store_helpers import keyed_paths, path_values

    from qveil.server.store import open_store

    store = open_store(url)
    kp = keyed_paths(store.releases.get_release(rid))
    rng = np.random.default_rng(seed)
    while True:
        a = int(rng.integers(0, 2))
        xs, gs = path_values(kp, a, rng.uniform(size=int(rng.integers(1, 12))))
        try_line = {"t": "try", "a": a, "x": xs.tolist(), "g": gs.tolist()}
        os.write(fd, (json.dumps(try_line) + "\n").encode())
        store.record_paths(rid, [a], [xs], [gs])
        os.write(fd, b'{"t": "done"}\n')


def _meet(folder: Path, me: int, parties: int, timeout: float = 300.0) -> None:
    """Announce ``me`` in ``folder`` and wait until ``parties`` writers have."""
    folder.mkdir(exist_ok=True)
    (folder / f"{me}").touch()
    deadline = time.time() + timeout
    while sum(1 for _ in folder.iterdir()) < parties:
        if time.time() > deadline:
            raise TimeoutError(f"only some of {parties} writers reached {folder}")
        time.sleep(0.002)


@contextmanager
def forking() -> Iterator[None]:
    """A block of :func:`run_forked` calls: the parent's garbage is collected once at its
    start and what survives is frozen (unfrozen at the end), so the collection before each
    fork scans only the objects made since. A full collection of a test process that has
    imported the server and the trainer takes ~0.3 s; 32 of them were half of a 32-fork
    test. The block must not release objects it did not make (a server, a channel)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_forked(target, *args):  # type: ignore[no-untyped-def]
    """Start ``target(*args)`` in a forked child that leaves with os._exit (code 0 / 1).

    The parent collects its garbage first and the child freezes what it inherited: a child
    that garbage-collects objects of an earlier test's gRPC server or channel (cyclic garbage
    still waiting in the parent at fork time) spins forever inside gRPC's core. Inside
    :func:`forking` that collection is of the objects made since the block began."""
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
    sys.path.insert(0, str(Path(__file__).resolve().parent))
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
