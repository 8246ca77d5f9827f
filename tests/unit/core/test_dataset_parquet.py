"""Parquet datasets (qveil.dataset_parquet): round trips with the npz fingerprint, row groups
of whole users, validation naming the file, row group and row, info from metadata alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qveil.dataset import Dataset, declared_metadata, load_dataset, save_dataset
from qveil.dataset_parquet import ParquetDatasetWriter, ParquetSource, save_parquet
from qveil.errors import FailedPrecondition, InvalidArgument


def _ds(n: int = 400, users: int = 53, d: int = 3, seed: int = 0, **kw: Any) -> Dataset:
    rng = np.random.default_rng(seed)
    return Dataset(
        user=np.sort(rng.integers(0, users, n)) * 7 + 11,  # sparse, sorted ids
        s=rng.normal(size=(n, d)),
        a=rng.integers(0, 2, n),
        r=rng.uniform(0, 1, n),
        s2=rng.normal(size=(n, d)),
        terminal=rng.uniform(size=n) < 0.1,
        n_actions=2,
        reward_range=(0.0, 1.0),
        env_id="CartPole-v1",
        **kw,
    )


def test_round_trip_keeps_fingerprint_and_metadata(tmp_path: Path) -> None:
    ds = _ds(population="pop-a", rewards_are_population_averages=True)
    npz, parquet = tmp_path / "x.npz", tmp_path / "x.parquet"
    save_dataset(ds, npz)
    save_dataset(load_dataset(npz), parquet)
    back = load_dataset(parquet)
    assert back == ds and back.fingerprint() == load_dataset(npz).fingerprint()
    assert back.population == "pop-a" and back.rewards_are_population_averages
    for name in ("user", "s", "a", "r", "s2", "terminal"):
        assert np.array_equal(getattr(back, name), getattr(ds, name))
    src = ParquetSource(parquet)
    assert src.fingerprint() == ds.fingerprint()  # streamed, column by column
    assert src.summary() == ds.summary()
    assert declared_metadata(parquet).population == "pop-a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npz", "x.parquet"]  # no spool left


@pytest.mark.parametrize("per_group", [1, 5, 16, 1000])
def test_row_groups_hold_whole_users(tmp_path: Path, per_group: int) -> None:
    ds = _ds()
    path = tmp_path / "x.parquet"
    save_parquet(ds, path, users_per_group=per_group)
    meta = pq.ParquetFile(path).metadata
    src = ParquetSource(path)
    seen: set[int] = set()
    counts = []
    for g, arrays in enumerate(src.iter_groups()):
        users = set(np.unique(arrays.user).tolist())
        assert not users & seen, f"row group {g} repeats a user"
        seen |= users
        counts.append(len(users))
        assert meta.row_group(g).num_rows == arrays.n
    assert seen == set(np.unique(ds.user).tolist())
    # exactly per_group users per group, the last one holds the rest
    assert all(c == per_group for c in counts[:-1]) and 1 <= counts[-1] <= per_group


def test_chunking_of_the_writer_does_not_change_the_file(tmp_path: Path) -> None:
    """Row groups are cut by user count, not by how the rows arrived (the collection's
    shards of any worker count give one file)."""
    ds = _ds()
    whole, parts = tmp_path / "whole.parquet", tmp_path / "parts.parquet"
    save_parquet(ds, whole, users_per_group=10)
    blocks = np.flatnonzero(np.diff(ds.user)) + 1
    with ParquetDatasetWriter(
        parts, d=3, n_actions=2, reward_range=(0.0, 1.0), env_id="CartPole-v1", users_per_group=10
    ) as w:
        for lo, hi in zip(np.r_[0, blocks[2::3]], np.r_[blocks[2::3], len(ds.user)], strict=True):
            w.write(ds.transitions.take(slice(lo, hi)))
    assert whole.read_bytes() == parts.read_bytes()


def test_unsorted_users_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    ds = _ds()
    user = ds.user.copy()
    user[[5, 300]] = user[[300, 5]]
    bad = Dataset(
        user=user, s=ds.s, a=ds.a, r=ds.r, s2=ds.s2, terminal=ds.terminal, n_actions=2,
        reward_range=(0.0, 1.0),
    )  # fmt: skip
    with pytest.raises(InvalidArgument, match=r"user\[6\] = .* follows user .*sort the rows"):
        save_dataset(bad, tmp_path / "x.parquet")
    assert list(tmp_path.iterdir()) == []


def _rewrite(src: Path, dst: Path, edit: Any) -> None:
    """A copy of ``src`` with its row groups kept and ``edit(table, group)`` applied, the
    qveil metadata kept (a file damaged by another tool)."""
    f = pq.ParquetFile(src)
    with pq.ParquetWriter(dst, f.schema_arrow) as w:
        for g in range(f.num_row_groups):
            t = edit(f.read_row_group(g), g)
            w.write_table(t, row_group_size=t.num_rows)
        w.add_key_value_metadata({b"qveil": f.metadata.metadata[b"qveil"]})


def _set(table: Any, name: str, row: int, value: Any) -> Any:
    col = table.column(name).to_pylist()
    col[row] = value
    i = table.schema.get_field_index(name)
    return table.set_column(
        i, table.schema.field(name), pa.array(col, table.schema.field(name).type)
    )


@pytest.mark.parametrize(
    ("name", "value", "pattern"),
    [
        ("r", 2.0, r"r\[4\] = 2 is outside the declared reward range"),
        ("a", 7, r"a\[4\] = 7 is outside the env's actions"),
        ("r", float("nan"), r"r\[4\] = nan is not finite"),
        ("user", 0, r"user 0 follows user"),
    ],
)
def test_bad_rows_name_file_row_group_and_row(
    tmp_path: Path, name: str, value: Any, pattern: str
) -> None:
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    save_parquet(_ds(), good, users_per_group=10)
    _rewrite(good, bad, lambda t, g: _set(t, name, 4, value) if g == 2 else t)
    src = ParquetSource(bad)  # the metadata alone is fine
    start = sum(pq.ParquetFile(bad).metadata.row_group(g).num_rows for g in range(2))
    where = rf"bad\.parquet', row group 2, row 4 \(row {start + 4} of the file\)"
    with pytest.raises(InvalidArgument, match=where + ".*" + pattern):
        list(src.iter_groups())
    with pytest.raises(InvalidArgument, match=where):
        load_dataset(bad)
    with pytest.raises(InvalidArgument, match=where):
        save_dataset(load_dataset(bad), tmp_path / "copy.npz")
    assert not (tmp_path / "copy.npz").exists()


def test_a_user_split_across_row_groups_is_refused(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    save_parquet(_ds(), good, users_per_group=10)
    first_of_group_1 = ParquetSource(good).read_group(1).user[0]

    def edit(t: Any, g: int) -> Any:
        if g != 0:
            return t
        return _set(t, "user", t.num_rows - 1, int(first_of_group_1))  # sorted, but spans

    _rewrite(good, bad, edit)
    with pytest.raises(InvalidArgument, match=r"row group 1, row 0 .*also has rows in row group 0"):
        list(ParquetSource(bad).iter_groups())


def test_foreign_or_damaged_files_are_refused(tmp_path: Path) -> None:
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"user": [1, 2]}), plain)
    with pytest.raises(InvalidArgument, match="no qveil metadata"):
        ParquetSource(plain)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet at all")
    with pytest.raises(InvalidArgument, match="not a readable Parquet dataset"):
        load_dataset(junk)
    exists = tmp_path / "x.parquet"
    save_parquet(_ds(), exists)
    with pytest.raises(FailedPrecondition, match="exists"):
        save_parquet(_ds(), exists)


def test_info_reads_the_metadata_only(tmp_path: Path) -> None:
    """``qveil dataset info`` prints the writer's record (and whether the data carries a
    reward signal, read from that record): it works with every data page of the file
    destroyed (the footer intact)."""
    path = tmp_path / "x.parquet"
    ds = _ds(population="pop-b")
    save_parquet(ds, path)
    raw = bytearray(path.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little") + 8
    raw[4 : len(raw) - footer] = b"\0" * (len(raw) - footer - 4)  # every page zeroed
    path.write_bytes(bytes(raw))
    out = subprocess.run(
        [sys.executable, "-m", "qveil.cli", "dataset", "info", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    from qveil.commands.dataset import no_signal_note

    want = ds.summary() | {"reward_signal": no_signal_note(ds.summary()) is None}
    assert json.loads(out.stdout) == json.loads(json.dumps(want))
    with pytest.raises(InvalidArgument):
        load_dataset(path)  # the rows themselves are gone
