"""Shared by the store tests: small releases, the whitening check, the seen-neighbour check."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from qveil.server.store import InsertRecord, SamplePathStore

try:  # the core's statistical helpers (issue: noise tests); a local fallback otherwise
    from qveil.stats import normality_report, whiten
except ImportError:  # pragma: no cover - only before core/stats.py exists
    from scipy import stats as _st

    from qveil.noise import conditional_moments

    def whiten(xs, gs, *, beta, sigma):  # type: ignore[no-untyped-def]
        seen: dict[float, float] = {}
        z = []
        for x, g in zip(xs, gs, strict=True):
            left = max((k for k in seen if k < x), default=None)
            right = min((k for k in seen if k > x), default=None)
            m, s = conditional_moments(
                beta=beta,
                sigma=sigma,
                d_left=None if left is None else x - left,
                g_left=None if left is None else seen[left],
                d_right=None if right is None else right - x,
                g_right=None if right is None else seen[right],
            )
            z.append((g - m) / s)
            seen[x] = g
        return np.asarray(z)

    def normality_report(z):  # type: ignore[no-untyped-def]
        z = np.asarray(z)
        p = float(_st.kstest(z, "norm").pvalue)
        return {
            "n": z.size,
            "ks_p": p,
            "mean": float(z.mean()),
            "var": float(z.var()),
            "passed": p >= 1e-3,
        }


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
) -> None:
    store.create_release(
        release_id=rid,
        fingerprint="f" * 64,
        sigma=sigma,
        beta=beta,
        interval=(-1.0, 2.0),
        n_actions=n_actions,
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
