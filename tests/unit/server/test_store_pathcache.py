"""The path cache's witness rule and admission under concurrent new states.

* No value is answered above the witnessed head: 16 threads ask single new states of two
  paths at once (group commit puts several callers in one transaction, and a caller that
  waited for the witness while another published skips its own publication); when a call
  returns, the witness has recorded, for every path, a seq at least the seq of the point it
  answered, with the hash the store holds at that seq.
* Admission does not wait for a commit in flight (``refresh(wait=False)``) and still
  counts what other writers stored: a state stored through another store object on the
  same file is known, not new, after the next reservation.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from qveil.server.quotas import QuotaConfig, Quotas
from qveil.server.store import open_store

CALLERS, CALLS = 16, 12


def _store(url: str, seed: int) -> Any:
    st = open_store(url, rng=seed)
    st.create_release(
        release_id="r", fingerprint="f", sigma=1.0, beta=1.0, interval=(0.0, 1.0), n_actions=2
    )
    return st


def test_every_answer_is_witnessed_before_it_returns(tmp_path: Path) -> None:
    st = _store(f"sqlite:///{tmp_path / 's.sqlite'}", 5)
    recorded: dict[int, tuple[int, str]] = {}
    published = [0]
    guard = threading.Lock()

    def witness(rid: str, heads: dict[int, tuple[int, str]]) -> None:
        assert rid == "r"
        time.sleep(0.002)  # a publication takes a while (a durable write): callers overlap it
        with guard:
            published[0] += 1
            for p, (seq, head) in heads.items():
                assert seq >= recorded.get(p, (0, ""))[0]
                recorded[p] = (seq, head)

    st.set_witness(witness)
    answered: list[tuple[float, dict[int, int]]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(CALLERS)

    def caller(i: int) -> None:
        rng = np.random.default_rng(100 + i)
        try:
            start.wait()
            for _ in range(CALLS):
                x = float(rng.uniform())
                st.get_or_sample_paths("r", [0, 1], [np.array([x])] * 2)
                with guard:
                    answered.append((x, {p: recorded[p][0] for p in recorded}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for path in (0, 1):
        points = {p.x: p for p in st.iter_points("r", path)}
        seq, head = recorded[path]
        assert [p.hash for p in points.values() if p.seq == seq] == [head]
        for x, seen in answered:
            assert seen[path] >= points[x].seq, (path, x)
    assert 1 <= published[0] <= CALLERS * CALLS
    st.close()


def test_admission_counts_points_another_store_object_stored(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.sqlite'}"
    a = _store(url, 1)
    b = open_store(url, rng=2, create=False)
    quotas = Quotas(QuotaConfig(max_stored_points=10**6, new_state_rate=1e9))
    xs = np.array([0.25, 0.5])
    b.get_or_sample_paths("r", [0, 1], [xs, xs])
    # a has not seen b's points: its reservation reads them, so nothing is new
    ticket = a.reserve("r", [(0, xs), (1, xs)], quotas=quotas, caller="c")
    assert ticket == 0
    assert a.known_values("r", [0, 1], [xs, xs]) is not None
    fresh = np.array([0.75])
    ticket = a.reserve("r", [(0, fresh), (1, fresh)], quotas=quotas, caller="c")
    assert ticket > 0
    quotas.done("r", ticket)
    a.close()
    b.close()
