"""Shared by the store tests: small releases, stored points, the seen-neighbour check."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from qveil.server.store import InsertRecord, SamplePathStore

RID = "rel-1"
SIGMA = 0.7
BETA = 3.0


def make_release(
    store: SamplePathStore,
    rid: str = RID,
    *,
    n_actions: int = 2,
    sigma: float = SIGMA,
    beta: float = BETA,
    interval: tuple[float, float] = (-1.0, 2.0),
    betas: Sequence[float] | None = None,
    status: str = "staged",
) -> None:
    """Create release ``rid`` in ``store`` (``betas``: one OU beta per coordinate of a
    d-coordinate release)."""
    store.create_release(
        release_id=rid,
        fingerprint="f" * 64,
        sigma=sigma,
        beta=beta,
        interval=interval,
        n_actions=n_actions,
        status=status,
        betas=betas,
    )


def stored(store: SamplePathStore, rid: str, action: int) -> tuple[np.ndarray, np.ndarray]:
    """(xs, gs) in insertion order."""
    pts = list(store.iter_points(rid, action))
    return (np.array([p.x for p in pts]), np.array([p.g for p in pts]))


def check_seen(rows: Sequence[tuple[int, float]], records: Iterable[InsertRecord]) -> list[str]:
    """Each insertion must have been conditioned on the nearest points committed before it.

    ``rows``: (seq, x) of every stored point; ``records``: what each insertion saw. Replays
    the rows in seq order and compares the true nearest left/right point among seqs < s with
    the recorded ones. Returns the violations (empty when serialisation held)."""
    from sortedcontainers import SortedList

    by_seq = {r.seq: r for r in records}
    index: SortedList = SortedList()
    bad = []
    for seq, x in sorted(rows):
        rec = by_seq.get(seq)
        if rec is not None:
            i = index.bisect_left(x)
            left = index[i - 1] if i > 0 else None
            right = index[i] if i < len(index) else None
            if rec.x != x:
                bad.append(f"seq {seq}: recorded x {rec.x} but stored {x}")
            elif (left, right) != (rec.left, rec.right):
                bad.append(
                    f"seq {seq} x={x}: saw {(rec.left, rec.right)}, "
                    f"committed before it: {(left, right)}"
                )
        index.add(x)
    return bad
