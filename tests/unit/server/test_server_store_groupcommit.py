"""Group commit of the answer log across concurrent callers and paths.

The contract: the answered points of concurrent ``record_paths`` calls that arrive while a
commit is in flight are written together by the next transaction; a call returns only after
the commit that holds its points; a state logged once is not logged again, whoever asks; a
crash before a commit loses only points not logged yet, never the log's consistency.

Checked here:

* in process (SQLite, PostgreSQL): 16 threads log overlapping single states of two paths:
  the log holds exactly the values handed over, one row per state, the chains verify, and
  transactions carried several callers' points of both paths;
* a real `qveil serve` SIGKILLed again and again while 16 callers stream single new states:
  every answer is the same when asked again (answers are a pure function of the release),
  the log the killed servers left verifies with one row per state, and once the last server
  has answered every recorded state and stopped gracefully, every one of them is logged with
  the key's value; one commit held several callers' states;
* two `qveil serve` replicas on one PostgreSQL log, 16 callers asking the same single new
  states of both at once: identical answers, and every answered state logged exactly once.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from reliability_helpers import (
    AnswerBook,
    assert_answers_kept,
    get_values,
    kill_under_load,
    query_workers,
    recheck,
    release_info,
    replicas,
    scale,
    shared_bundle,
    sqlite_url,
    start_server,
    value_stubs,
)
from server_helpers import fresh_bundle
from store_helpers import RID, keyed_paths, log_values, logged, make_release
from thread_helpers import run_threads

from qveil.answer import released_values
from qveil.bundle import load_bundle
from qveil.errors import InvalidArgument
from qveil.keyed import snap
from qveil.server.store import open_store

BETA, SIGMA = 40.0, 1.0


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_16_threads_two_paths_one_commit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(kind, tmp_path, request)
    grid = np.random.default_rng(7).uniform(size=600)
    handed: dict[int, dict[float, float]] = {0: {}, 1: {}}
    lock = threading.Lock()
    with open_store(url) as s:
        kp = keyed_paths(make_release(s, n_actions=2, beta=BETA, sigma=SIGMA))

        def work(i: int) -> None:
            rng = np.random.default_rng(300 + i)
            for _ in range(25):
                units = rng.choice(grid, size=int(rng.integers(1, 3)))
                xs, gs, _written, mism = log_values(s, kp, RID, [1, 0], [units, units])
                assert mism == 0
                with lock:
                    for k, p in enumerate((1, 0)):
                        handed[p].update(zip(xs[k].tolist(), gs[k].tolist(), strict=True))

        run_threads(16, work)
        with pytest.raises(InvalidArgument):  # bad input stores nothing
            s.record_paths(RID, [0, 0], [[0.123], [0.123]], [[0.0], [0.0]])
        with pytest.raises(InvalidArgument):
            s.record_paths(RID, [0, 2], [[0.123], [0.123]], [[0.0], [0.0]])
        assert all(0.123 not in {p.x for p in s.iter_points(RID, a)} for a in (0, 1))
        assert s.verify(RID).ok
        for a in (0, 1):  # exactly what was handed over, one row per state
            assert logged(s, RID, a) == handed[a]
        assert s.committer.points_logged == s.count_points(RID) == len(handed[0]) + len(handed[1])
        created: dict[float, set[int]] = {}
        for a in (0, 1):
            for p in s.iter_points(RID, a):
                created.setdefault(p.created_at, set()).add(a)
        commits = [tuple(sorted(v)) for v in created.values()]
    # the two paths' new points went into the same transactions (one created_at each)
    assert all(c == (0, 1) for c in commits), commits[:5]
    # and transactions carried several callers' points: fewer commits than calls
    assert len(commits) < 16 * 25


def test_one_caller_same_log_per_path_or_together(tmp_path: Path) -> None:
    """Paths logged in one call (in any order) or one call each give the same rows: seqs
    follow each path's states in the order given, the chain links are the same."""
    out = []
    for how in ("together", "apart"):
        with open_store(f"sqlite:///{tmp_path / f'{how}.sqlite'}") as s:
            kp = keyed_paths(make_release(s, n_actions=3))
            units = np.random.default_rng(1).uniform(size=40)
            if how == "together":
                assert log_values(s, kp, RID, [2, 0, 1], [units] * 3)[2:] == (120, 0)
            else:
                for a in range(3):
                    assert log_values(s, kp, RID, [a], [units])[2:] == (40, 0)
            out.append(
                [[(p.seq, p.x, p.g, p.hash) for p in s.iter_points(RID, a)] for a in range(3)]
            )
    assert out[0] == out[1]


@pytest.fixture
def bundle(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    """A copy of the session's test bundle, charged in this test's registry."""
    return fresh_bundle(shared_bundle(tmp_path_factory), tmp_path / "release-bundle")


def _check_log(store_url: str, bundle: Path, rid: str) -> dict[int, dict[float, tuple]]:
    """The release's log: chains verify, one row per state, every value the key's.
    Returns path -> {state: (value, created_at)}."""
    b = load_bundle(bundle)
    store = open_store(store_url, create=False)
    try:
        assert store.verify(rid).ok
        out = {}
        for a in range(b.n_actions):
            pts = list(store.iter_points(rid, a))
            xs = np.array([p.x for p in pts])
            idx, snapped = snap(xs)
            assert np.array_equal(snapped, xs), "a logged state is not on the grid"
            want = b.noise_paths.path_values(a, idx)
            assert np.array([p.g for p in pts]).tobytes() == want.tobytes()
            out[a] = {p.x: (p.g, p.created_at) for p in pts}
            assert len(out[a]) == len(pts), "a state logged twice"
        return out
    finally:
        store.close()


def _unit(bundle: Path, states: list[float]) -> dict[float, float]:
    """Raw state -> its snapped unit state (what the log keys)."""
    b = load_bundle(bundle)
    _idx, snapped = snap(b.box.to_unit(np.array(states))[:, 0])
    return dict(zip(states, snapped.tolist(), strict=True))


def _answers_are_released_values(book: AnswerBook, bundle: Path) -> None:
    b = load_bundle(bundle)
    states = book.states()
    want = released_values(b, b.box.to_unit(np.array(states)))
    for i, s in enumerate(states):
        for a in range(b.n_actions):
            if (s, a) in book.values:
                assert book.values[(s, a)] == want[i, a], (s, a)


@pytest.mark.slow
def test_sigkill_while_16_callers_stream_single_new_states(tmp_path: Path, bundle: Path) -> None:
    kills = int(scale(6, 30))
    store_url = sqlite_url(tmp_path / "store.sqlite")
    srv = start_server(tmp_path, bundle=bundle, store=store_url, extra=["--workers", "16"])
    rel = release_info(srv.target)
    book = AnswerBook()
    unexpected: list[str] = []
    stop = threading.Event()
    workers = query_workers(
        book, [srv.target], stop, clients=16, seed=500,
        low=rel.state_low, high=rel.state_high, n_new=1, n_known=0, unexpected=unexpected,
    )  # fmt: skip
    kill_under_load(srv, workers, stop, kills=kills, rnd=random.Random(99), gap=(0.2, 0.8))
    rid = rel.release_id
    killed = _check_log(store_url, bundle, rid)  # what the killed servers left: consistent
    try:
        # the last server answers every recorded state again, identically
        assert_answers_kept(book, unexpected, srv.target, min_ok=20 * kills)
    finally:
        assert srv.terminate() == 0  # a graceful stop writes what the answer log holds
    _answers_are_released_values(book, bundle)
    final = _check_log(store_url, bundle, rid)
    for a in killed:  # rows already logged did not change
        assert all(final[a][x] == v for x, v in killed[a].items())
    unit = _unit(bundle, book.states())
    missing = [(s, a) for (s, a) in book.values if unit[s] not in final[a]]
    assert not missing, f"{len(missing)} answered states are not logged: {missing[:5]}"
    # group commit happened: one commit (one created_at) held several callers' states
    per_commit: dict[float, int] = {}
    for _g, c in killed[0].values():
        per_commit[c] = per_commit.get(c, 0) + 1
    assert max(per_commit.values()) >= 4, sorted(per_commit.values())[-5:]


def _single_state_walker(
    book: AnswerBook,
    targets: list[str],
    states: list[float],
    start: int,
    unexpected: list[str],
) -> None:
    with value_stubs(targets) as stubs:
        for i, x in enumerate(states):
            k = (start + i) % len(stubs)  # alternate replicas call by call
            try:
                reply = get_values(stubs[k], [x], timeout=30.0)
            except grpc.RpcError as exc:
                unexpected.append(f"{targets[k]}: {exc.code().name}: {exc.details()}")
                continue
            book.add(reply.release_id, [x], list(reply.actions), list(reply.values))


@pytest.mark.slow
@pytest.mark.postgres
def test_two_replicas_single_new_states_identical(
    tmp_path: Path, bundle: Path, pg_url: str
) -> None:
    srvs = replicas(tmp_path, 2, bundle=bundle, store=pg_url, extra=["--workers", "16"])
    n = int(scale(300, 1000))
    try:
        for s in srvs:
            s.start(wait=False)
        for s in srvs:
            s.wait_serving(timeout=90)
        targets = [s.target for s in srvs]
        rel = release_info(targets[0])
        # 16 callers, 8 distinct walks over the same states, each walk taken by two callers
        # that start on different replicas: every new state is asked of both at once
        walks = [
            np.random.default_rng(40 + w).uniform(rel.state_low, rel.state_high, size=n).tolist()
            for w in range(8)
        ]
        book = AnswerBook()
        unexpected: list[str] = []
        threads = [
            threading.Thread(
                target=_single_state_walker,
                args=(book, targets, walks[i // 2], i % 2, unexpected),
                daemon=True,
            )
            for i in range(16)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not unexpected, unexpected[:5]
        assert not book.conflicts, f"replicas gave different values: {book.conflicts[:5]}"
        for s in srvs:
            checked, mism = recheck(book, s.target)
            assert not mism, f"{s.target} answers differently: {mism[:5]}"
    finally:
        codes = [s.terminate() for s in srvs if s.alive()]
    assert codes == [0, 0]  # graceful: each replica wrote what its answer log held
    _answers_are_released_values(book, bundle)
    final = _check_log(pg_url, bundle, rel.release_id)
    unit = _unit(bundle, book.states())
    for a in final:  # both replicas logged every state; the log holds each once
        assert set(final[a]) == {unit[s] for (s, b), _v in book.values.items() if b == a}
        assert len(final[a]) == 8 * n
