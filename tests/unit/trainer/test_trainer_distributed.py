"""The fit and the collection as map-reduce tasks (qveil.trainer.distributed), on the
in-process engine (no cluster: the same task functions called here): the engine's flags
checked, the sums of any shard size equal to the single-process build, Parquet row groups
and in-memory shards agreeing, a progress line per shard, and the collection's file the same
whatever the shard size. On Dask clusters of real worker processes:
tests/integration/test_distributed_fit.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from qveil.additive import StateBox
from qveil.dataset import Dataset, load_dataset
from qveil.dataset_parquet import ParquetSource, save_parquet
from qveil.errors import InvalidArgument
from qveil.kfqi import KernelFQIOperators, build_operators_nd
from qveil.kfqi_config import load_fqi_config
from qveil.trainer.collect import collect
from qveil.trainer.distributed import Engine, FitSums, collect_parquet, fit_operators, open_client

CONFIG = Path(__file__).resolve().parents[3] / "configs" / "linewalk-private.toml"
LW = "qveil/LineWalk-v0"
USERS = 40
SHARD = 12  # 4 shards, the last one short


@pytest.fixture(scope="module")
def linewalk() -> Dataset:
    return collect(LW, USERS, 5)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"workers": 0}, "--workers must be an integer >= 1, got 0"),
        ({"workers": True}, "--workers must be an integer >= 1, got True"),
        ({"workers": 2, "cluster": "tcp://h:1"}, "give --workers N (a local cluster) or"),
        ({"cluster": "  "}, "--cluster needs the scheduler's address"),
        ({"shard_users": 0}, "shard_users must be >= 1, got 0"),
    ],
)
def test_engine_refuses_bad_flags(kw: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        Engine(**kw)  # type: ignore[arg-type]


def test_only_one_worker_without_a_cluster_is_local() -> None:
    assert Engine().local and not Engine(workers=2).local
    assert not Engine(cluster="tcp://127.0.0.1:1").local
    with open_client(Engine()) as client:
        assert client is None  # no cluster started for the in-process engine


def _fit(data: object, engine: Engine, neighbour: str = "user") -> FitSums:
    cfg = load_fqi_config(CONFIG).replace(neighbour=neighbour)
    return fit_operators(
        data,  # type: ignore[arg-type]
        n_actions=2,
        reward_range=(0.0, 0.5),
        box=StateBox.of(cfg.state_intervals),
        spec=cfg.spec(1),
        engine=engine,
    )


def _same(a: KernelFQIOperators, b: KernelFQIOperators, *, exact: bool) -> None:
    for x, y in zip(a.actions, b.actions, strict=True):
        assert np.array_equal(x.covered, y.covered)
        if exact:
            assert np.array_equal(x.c_sum, y.c_sum) and (x.p != y.p).nnz == 0
        else:  # other shards, another summation order: equal within float rounding
            np.testing.assert_allclose(x.c_sum, y.c_sum, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(x.p.toarray(), y.p.toarray(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("neighbour", ["user", "reward"])
def test_the_sum_of_shard_sums_is_the_single_process_build(
    linewalk: Dataset, neighbour: str
) -> None:
    cfg = load_fqi_config(CONFIG).replace(neighbour=neighbour)
    whole = build_operators_nd(
        linewalk.transitions,
        n_actions=2,
        reward_range=(0.0, 0.5),
        box=StateBox.of(cfg.state_intervals),
        spec=cfg.spec(1),
    )
    one = _fit(linewalk, Engine(shard_users=USERS), neighbour)
    _same(whole, one.operators, exact=True)  # one shard: exactly the same bits
    many = _fit(linewalk, Engine(shard_users=SHARD), neighbour)
    _same(whole, many.operators, exact=False)
    assert (many.shards, many.users, many.samples) == (4, USERS, linewalk.n)
    assert (one.shards, one.clipped) == (1, many.clipped)


def test_parquet_row_groups_and_in_memory_shards_agree(linewalk: Dataset, tmp_path: Path) -> None:
    path = tmp_path / "lw.parquet"
    save_parquet(linewalk, path, users_per_group=SHARD)
    streamed = _fit(ParquetSource(path), Engine())  # the file's row groups are the shards
    memory = _fit(linewalk, Engine(shard_users=SHARD))
    _same(streamed.operators, memory.operators, exact=True)
    assert streamed.shards == 4 and streamed.users == USERS


def test_a_fit_reads_a_dataset_or_a_parquet_source(linewalk: Dataset) -> None:
    with pytest.raises(InvalidArgument, match="a fit reads a Dataset or a ParquetSource, not"):
        _fit(linewalk.transitions, Engine())


def test_progress_is_a_line_per_shard_in_a_log(
    linewalk: Dataset, capsys: pytest.CaptureFixture[str]
) -> None:
    """stderr is not a terminal (a log file): one line per shard done, in order."""
    _fit(linewalk, Engine(shard_users=SHARD, progress=True))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("fit shards: ")]
    assert [ln.split(" done")[0] for ln in lines] == [
        f"fit shards: shard {k}/4" for k in range(1, 5)
    ]
    _fit(linewalk, Engine(shard_users=SHARD, progress=False))
    assert "fit shards" not in capsys.readouterr().err


def test_collection_is_the_same_file_whatever_the_shard_size(tmp_path: Path) -> None:
    a = collect_parquet(LW, 9, 3, str(tmp_path / "a.parquet"), engine=Engine(shard_users=4))
    b = collect_parquet(LW, 9, 3, str(tmp_path / "b.parquet"), engine=Engine(shard_users=9))
    assert a["fingerprint"] == b["fingerprint"] and a["users"] == 9
    assert load_dataset(tmp_path / "a.parquet") == collect(LW, 9, 3)
    assert ParquetSource(tmp_path / "a.parquet").groups == 3  # the shards are its row groups
    with pytest.raises(InvalidArgument, match="users must be >= 1, got 0"):
        collect_parquet(LW, 0, 3, str(tmp_path / "c.parquet"))
    assert not (tmp_path / "c.parquet").exists()
