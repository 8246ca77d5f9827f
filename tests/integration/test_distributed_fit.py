"""The kernel fit and the collection as map-reduce tasks on Dask distributed
(qveil.trainer.distributed): the same bits in process, on a local cluster of worker
processes and on a real ``dask scheduler`` with two ``dask worker`` processes; a worker
killed mid-fit changes nothing; shards never split a user. The in-process engine (the sums
of shards against the single-process build, progress, Parquet against memory):
tests/unit/trainer/test_trainer_distributed.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from qveil.additive import StateBox
from qveil.dataset import Dataset, load_dataset
from qveil.dataset_parquet import ParquetSource, save_parquet
from qveil.errors import InvalidArgument
from qveil.kfqi import fold_tree
from qveil.kfqi_config import load_fqi_config
from qveil.trainer.distributed import Engine, collect_parquet, fit_operators
from qveil.trainer.kfqi import fit_kernel
from qveil.transitions import Transitions

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "cartpole-private.toml"
DASK = Path(sys.executable).with_name("dask")
USERS = 300
SHARD = 60  # 5 shards


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 CartPole users as Parquet, row groups of 60 users (collected in process)."""
    path = tmp_path_factory.mktemp("data") / "cartpole.parquet"
    collect_parquet(
        "CartPole-v1",
        USERS,
        7,
        str(path),
        reward_range=(0.0, 1.0),
        engine=Engine(shard_users=SHARD),
    )
    return path


def _same_operators(a: object, b: object) -> None:
    for x, y in zip(a.actions, b.actions, strict=True):  # type: ignore[attr-defined]
        assert np.array_equal(x.c_sum, y.c_sum) and np.array_equal(x.covered, y.covered)
        assert (x.p != y.p).nnz == 0 and np.array_equal(x.p.toarray(), y.p.toarray())


def _fit(data: object, engine: Engine, neighbour: str = "user") -> object:
    cfg = load_fqi_config(CONFIG).replace(neighbour=neighbour)
    return fit_operators(
        data,
        n_actions=2,
        reward_range=(0.0, 1.0),
        box=StateBox.of(cfg.state_intervals),
        spec=cfg.spec(4),
        engine=engine,
    )


# --------------------------------------------------------------------------- pure parts
def test_shards_never_split_a_user() -> None:
    rng = np.random.default_rng(3)
    n = 2000
    user = rng.integers(0, 97, n) * 13  # unsorted, sparse ids
    # the row number as the state: which rows each shard took, in its order
    rows = Transitions(
        user=user, s=np.arange(n), a=np.zeros(n, np.int64), r=np.zeros(n), s2=np.arange(n),
        terminal=np.zeros(n, bool),
    )  # fmt: skip
    for size in (1, 7, 50, 97, 1000):
        shards = rows.shards(size)
        taken = np.concatenate([sh.s[:, 0] for sh in shards]).astype(np.int64)
        assert np.array_equal(np.sort(taken), np.arange(n))  # every row once
        owners: dict[int, int] = {}
        for k, sh in enumerate(shards):
            idx = sh.s[:, 0].astype(np.int64)
            assert np.array_equal(sh.user, user[idx])
            for u in np.unique(sh.user).tolist():
                assert owners.setdefault(u, k) == k, f"user {u} in shards {owners[u]} and {k}"
            assert len(np.unique(sh.user)) == min(size, 97 - k * size)
            assert np.all(np.diff(idx[sh.user == sh.user[0]]) > 0)  # a user's row order kept


def test_fold_tree_is_a_fixed_tree() -> None:
    for n in range(1, 12):
        names = [str(i) for i in range(n)]
        expr = fold_tree(names, lambda a, b: f"({a}+{b})")
        assert expr.replace("(", "").replace(")", "").split("+") == names
    assert fold_tree(list("abcde"), lambda a, b: f"({a}+{b})") == "(((a+b)+(c+d))+e)"


# --------------------------------------------------------------------------- clusters
def test_local_cluster_fit_and_collection_are_bit_for_bit(cartpole: Path, tmp_path: Path) -> None:
    """--workers 2 (a LocalCluster of two processes) against the in-process run."""
    cfg = load_fqi_config(CONFIG)
    src = ParquetSource(cartpole)
    one = fit_kernel(cfg, src)
    two = fit_kernel(cfg, src, engine=Engine(workers=2))
    assert np.array_equal(one.result.alpha, two.result.alpha)
    assert np.array_equal(one.result.q_anchors, two.result.q_anchors)
    assert (
        one.dataset_fingerprint == two.dataset_fingerprint == load_dataset(cartpole).fingerprint()
    )
    assert (one.users, one.samples, one.states_clipped) == (
        two.users,
        two.samples,
        two.states_clipped,
    )
    out = tmp_path / "two.parquet"
    collect_parquet(
        "CartPole-v1", USERS, 7, str(out), reward_range=(0.0, 1.0),
        engine=Engine(workers=2, shard_users=SHARD),
    )  # fmt: skip
    assert out.read_bytes() == cartpole.read_bytes()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """A real ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1, stopped at
    the end (each in its own process group)."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    log = (tmp_path / "dask.log").open("wb")
    procs = [
        subprocess.Popen(
            [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
        )  # fmt: skip
    ]
    try:
        from distributed import Client

        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or procs[0].poll() is not None:
                    raise RuntimeError((tmp_path / "dask.log").read_text()[-2000:]) from None
                time.sleep(0.1)
        for _ in range(2):
            procs.append(
                subprocess.Popen(
                    [
                        str(DASK),
                        "worker",
                        address,
                        "--nworkers",
                        "1",
                        "--nthreads",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--no-dashboard",
                        "--local-directory",
                        str(tmp_path),
                    ],
                    stdout=log,
                    stderr=log,
                    env=env,
                    start_new_session=True,
                )  # fmt: skip
            )
        with Client(address, timeout="30s") as c:
            c.wait_for_workers(2, timeout=60)
        yield address, procs
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        log.close()


def test_fit_on_a_real_scheduler_with_two_workers(
    cartpole: Path, scheduler: tuple[str, list[subprocess.Popen[bytes]]]
) -> None:
    address, _ = scheduler
    cfg = load_fqi_config(CONFIG)
    local = fit_kernel(cfg, ParquetSource(cartpole))
    remote = fit_kernel(cfg, ParquetSource(cartpole), engine=Engine(cluster=address))
    assert np.array_equal(local.result.alpha, remote.result.alpha)
    # the reward relation's two passes (pooled denominators, then the sums), in memory
    ds = load_dataset(cartpole)
    pooled = Dataset(
        user=ds.user, s=ds.s, a=ds.a, r=ds.r, s2=ds.s2, terminal=ds.terminal, n_actions=2,
        reward_range=(0.0, 1.0), env_id=ds.env_id, rewards_are_population_averages=True,
    )  # fmt: skip
    here = _fit(pooled, Engine(shard_users=SHARD), "reward")
    there = _fit(pooled, Engine(cluster=address, shard_users=SHARD), "reward")
    _same_operators(here.operators, there.operators)  # type: ignore[attr-defined]


def test_a_worker_killed_mid_fit_changes_nothing(
    cartpole: Path, scheduler: tuple[str, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    """One ``dask worker`` is SIGKILLed as soon as tasks run on the cluster; the scheduler
    recomputes the lost tasks (they re-read their row groups) on the other worker and the
    operators are the same bits."""
    address, procs = scheduler
    path = tmp_path / "small-groups.parquet"
    save_parquet(load_dataset(cartpole), path, users_per_group=5)  # 60 shards
    reference = _fit(ParquetSource(path), Engine())
    victim = procs[1]
    from distributed import Client

    killed_at: list[float] = []
    with Client(address) as c:

        def kill_when_busy() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if any(c.processing().values()):
                    os.killpg(victim.pid, signal.SIGKILL)
                    killed_at.append(time.monotonic())
                    return
                time.sleep(0.005)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        try:
            again = _fit(ParquetSource(path), Engine(cluster=address))
            finished = time.monotonic()
        finally:
            killer.join()
        assert killed_at and killed_at[0] < finished, "the kill did not land mid-fit"
        assert victim.wait(timeout=10) == -signal.SIGKILL
    _same_operators(reference.operators, again.operators)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- split users
def _split_user_without_statistics(src: Path, dst: Path) -> int:
    """A crafted copy of ``src``: written without row-group statistics, the last row of
    row group 0 given the first user of row group 1 (the user order stays non-decreasing, so
    only the row-group boundary tells); returns that user."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = pq.ParquetFile(src)
    shared = int(f.read_row_group(1, columns=["user"]).column(0)[0].as_py())
    with pq.ParquetWriter(dst, f.schema_arrow, write_statistics=False) as w:
        for g in range(f.num_row_groups):
            t = f.read_row_group(g)
            if g == 0:
                user = t.column("user").to_pylist()
                user[-1] = shared
                t = t.set_column(0, t.schema.field("user"), pa.array(user, pa.int64()))
            w.write_table(t, row_group_size=t.num_rows)
        w.add_key_value_metadata({b"qveil": f.metadata.metadata[b"qveil"]})
    meta = pq.ParquetFile(dst).metadata
    assert all(
        meta.row_group(g).column(0).statistics is None
        or not meta.row_group(g).column(0).statistics.has_min_max
        for g in range(meta.num_row_groups)
    )
    return shared


def test_a_user_in_two_row_groups_is_refused_by_every_reader(
    cartpole: Path, tmp_path: Path
) -> None:
    """Without statistics a reader cannot learn the previous row group's last user from the
    footer: every path that reads a row group alone reads it from that group's user column
    instead, so the user counted in two shards (N one too large, the release moved by more
    than the card's sensitivity) is refused by the whole-file load, by a row group read
    alone, and by the streamed fit (its tasks read one row group each)."""
    bad = tmp_path / "split.parquet"
    shared = _split_user_without_statistics(cartpole, bad)
    spans = rf"row group 1, row 0 .*user {shared} also has rows in row group 0"
    with pytest.raises(InvalidArgument, match=spans):
        ParquetSource(bad).load()
    with pytest.raises(InvalidArgument, match=spans):
        ParquetSource(bad).read_group(1)  # alone, as one task of the fit reads it
    with pytest.raises(InvalidArgument, match=spans):
        _fit(ParquetSource(bad), Engine())
    with pytest.raises(InvalidArgument, match=spans):
        fit_kernel(load_fqi_config(CONFIG), ParquetSource(bad))
    ParquetSource(bad).read_group(2)  # the groups that do not follow the split still read
