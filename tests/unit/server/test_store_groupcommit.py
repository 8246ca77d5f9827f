"""Group commit across concurrent callers and actions.

The contract: new points of concurrent requests that arrive while a commit is in flight are
drawn and written together in the next transaction; each caller is answered only after the
commit that holds its points; the points of one action are drawn one after another, each
conditioned on everything stored or earlier in the batch; two requests for one new state get
one value; a crash before the commit loses only points nobody was answered with.

Checked here:

* in process (SQLite, PostgreSQL): 16 threads ask overlapping single states of two actions
  through ``get_or_sample_paths``: every answer equals the one stored value, every
  insertion saw its true nearest committed-or-earlier-in-batch neighbours (``check_seen``: a
  batch drawn without conditioning on its earlier members fails it), the whitened paths are
  N(0, 1), and transactions did carry several callers' points of both actions;
* a real `qveil serve` SIGKILLed again and again while 16 callers stream single new states:
  every value any caller was answered is stored, unchanged, after the restarts (a server that
  answered a follower before the commit holding its point would lose it on SIGKILL, and the
  restarted server would draw a different value: the re-check reports it as changed), and
  the chains verify (no gap, no reorder);
* two `qveil serve` replicas on one PostgreSQL store, 16 callers asking the same single new
  states of both at once: identical answers, one stored value per state, the GP law holds.

The servers draw from OS entropy and thread interleavings vary, so the law checks are not
reproducible draws; they use :func:`noise_helpers.assert_unseeded_law` (a level whose
false-alarm rate over the whole suite is below 1e-4, and a sampler with sigma x 1.3 shown to
fail it on the same points). They are a sanity check: a sampler that ignored its batch's
earlier draws, with these random states (batch members are rarely each other's neighbours),
still scores var ~1.05-1.15 and var_p ~0.01-0.1 (simulated), which no practical level
rejects. The sharp checks are ``check_seen`` (each insertion's actual neighbours against the
log, exact) and the equality of answers across callers and replicas.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import grpc
import numpy as np
import pytest
from noise_helpers import assert_unseeded_law
from reliability_helpers import (
    AnswerBook,
    assert_answers_kept,
    bundle_for_test,
    get_values,
    kill_under_load,
    query_workers,
    recheck,
    release_info,
    replicas,
    scale,
    sqlite_url,
    start_server,
    value_stubs,
)
from store_helpers import RID, check_seen, make_release
from thread_helpers import run_threads

from qveil.bundle import load_bundle
from qveil.errors import InvalidArgument
from qveil.server.store import InsertRecord, open_store

BETA, SIGMA = 40.0, 1.0


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'store.sqlite'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_16_threads_two_actions_one_commit(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(kind, tmp_path, request)
    grid = np.random.default_rng(7).uniform(size=600)
    records: dict[int, list[InsertRecord]] = {0: [], 1: []}
    answers: list[tuple[int, float, float]] = []
    commits: list[tuple[int, ...]] = []
    lock = threading.Lock()
    with open_store(url, rng=11) as s:
        make_release(s, n_actions=2, beta=BETA, sigma=SIGMA)

        def hook(_r: str, a: int, recs: list[InsertRecord]) -> None:
            with lock:
                records[a].extend(recs)

        s.set_debug_hook(hook)

        def work(i: int) -> None:
            rng = np.random.default_rng(300 + i)
            for _ in range(25):
                xs = rng.choice(grid, size=int(rng.integers(1, 3)))
                g = np.column_stack(s.get_or_sample_paths(RID, [1, 0], [xs, xs]))
                with lock:
                    for k, x in enumerate(xs.tolist()):
                        answers.append((1, x, float(g[k, 0])))
                        answers.append((0, x, float(g[k, 1])))

        run_threads(16, work)
        with pytest.raises(InvalidArgument):  # bad input stores nothing
            s.get_or_sample_paths(RID, [0, 0], [[0.123], [0.123]])
        with pytest.raises(InvalidArgument):
            s.get_or_sample_paths(RID, [0, 2], [[0.123], [0.123]])
        assert all(0.123 not in {p.x for p in s.iter_points(RID, a)} for a in (0, 1))
        created: dict[float, set[int]] = {}
        for a in (0, 1):
            for p in s.iter_points(RID, a):
                created.setdefault(p.created_at, set()).add(a)
        commits = [tuple(sorted(v)) for v in created.values()]
        assert s.verify(RID).ok
        for a in (0, 1):
            pts = list(s.iter_points(RID, a))
            value = {p.x: p.g for p in pts}
            assert len(value) == len(pts)  # one row per state
            mine = [(x, g) for b, x, g in answers if b == a]
            for x, g in mine:  # every answer is the one stored value
                assert value[x] == g, (a, x, g, value[x])
            assert {x for x, _ in mine} == set(value)  # nothing stored that was not asked
            assert len(records[a]) == len(pts)
            assert check_seen([(p.seq, p.x) for p in pts], records[a]) == []
            xs = np.array([p.x for p in pts])
            gs = np.array([p.g for p in pts])
            assert_unseeded_law(xs, gs, beta=BETA, sigma=SIGMA)
    # the two actions' new points went into the same transactions (one created_at each)
    assert all(c == (0, 1) for c in commits), commits[:5]
    # and transactions carried several callers' points: fewer commits than calls
    assert len(commits) < 16 * 25


def test_one_caller_same_values_per_action_or_together(tmp_path: Path) -> None:
    """With one seeded source the batch API draws exactly what per-action calls would: the
    actions are drawn in sorted order, each state in first-occurrence order."""
    out = []
    for k, how in enumerate(("together", "apart")):
        with open_store(f"sqlite:///{tmp_path / f'{how}.sqlite'}", rng=5) as s:
            make_release(s, n_actions=3)
            xs = np.random.default_rng(1).uniform(size=40)
            if how == "together":
                g = np.column_stack(s.get_or_sample_paths(RID, [2, 0, 1], [xs] * 3))[:, [1, 2, 0]]
            else:
                g = np.stack([s.get_or_sample(RID, a, xs) for a in range(3)], axis=1)
            assert k == 1 or s.count_points(RID) == 120
            out.append(g)
    assert np.array_equal(out[0], out[1])


@pytest.fixture
def bundle(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    """A fresh unbound copy per test: a bundle binds to the first store that serves it."""
    return bundle_for_test(tmp_path_factory, tmp_path)


@pytest.mark.slow
def test_sigkill_while_16_callers_stream_single_new_states(tmp_path: Path, bundle: Path) -> None:
    kills = int(scale(6, 30))
    store_url = sqlite_url(tmp_path / "store.sqlite")
    # 16 store threads, so all 16 callers can wait in one group commit at once
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
    try:
        assert_answers_kept(book, unexpected, srv.target, min_ok=20 * kills)
    finally:
        srv.terminate()
    b = load_bundle(bundle)
    rid = rel.release_id
    store = open_store(store_url, create=False)
    try:
        stored = {
            a: {float(p.x): (float(p.g), p.created_at) for p in store.iter_points(rid, a)}
            for a in range(b.n_actions)
        }
        assert store.verify(rid).ok
    finally:
        store.close()
    unit = dict(
        zip(book.states(), b.box.to_unit(np.array(book.states()))[:, 0].tolist(), strict=True)
    )
    missing = [(s, a) for (s, a) in book.values if unit[s] not in stored[a]]
    assert not missing, f"{len(missing)} answered states have no stored noise: {missing[:5]}"
    # group commit happened: one commit (one created_at) held several callers' states
    per_commit: dict[float, int] = {}
    for _g, c in stored[0].values():
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
        for s in srvs:
            s.stop()
    b = load_bundle(bundle)
    store = open_store(pg_url, create=False)
    try:
        for a in range(b.n_actions):
            pts = list(store.iter_points(rel.release_id, a))
            assert len(pts) == 8 * n == len({p.x for p in pts}), "one value per state"
            xs = np.array([p.x for p in pts])
            gs = np.array([p.g for p in pts])
            assert_unseeded_law(xs, gs, beta=b.beta, sigma=b.sigma)
        assert store.verify(rel.release_id).ok
    finally:
        store.close()
