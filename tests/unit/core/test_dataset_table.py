"""Plain tables as datasets (qveil.dataset_table): Parquet files written by pandas, pyarrow
and Polars themselves (list columns, a column per coordinate, the exact qveil schema without
qveil's metadata, a directory of part files as Spark writes), and CSV; the same fingerprint as
the npz twin; errors naming the missing or mistyped column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from qveil.dataset import (
    Dataset,
    count_users,
    declared_metadata,
    describe_dataset,
    load_dataset,
    open_dataset,
    save_dataset,
)
from qveil.errors import InvalidArgument

META = {"n_actions": 3, "reward_low": 0.0, "reward_high": 1.0}


def _ds(n: int = 120, users: int = 9, d: int = 2, seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    return Dataset(
        user=np.sort(rng.integers(0, users, n)) * 5 + 3,
        s=rng.normal(size=(n, d)),
        a=rng.integers(0, 3, n),
        r=rng.uniform(0, 1, n),
        s2=rng.normal(size=(n, d)),
        terminal=rng.uniform(size=n) < 0.1,
        n_actions=3,
        reward_range=(0.0, 1.0),
    )


def _frame(ds: Dataset, *, per_coordinate: bool) -> pd.DataFrame:
    cols: dict[str, Any] = {"user": ds.user, "a": ds.a, "r": ds.r, "terminal": ds.terminal}
    for name in ("s", "s2"):
        arr = getattr(ds, name)
        if per_coordinate:
            cols |= {f"{name}_{j}": arr[:, j] for j in range(ds.d)}
        else:
            cols[name] = list(arr)
    cols["episode_step"] = np.arange(ds.n)  # other columns are ignored
    return pd.DataFrame(cols)


@pytest.mark.parametrize("per_coordinate", [False, True])
def test_pandas_files_load_with_the_npz_fingerprint(tmp_path: Path, per_coordinate: bool) -> None:
    ds = _ds()
    df = _frame(ds, per_coordinate=per_coordinate)
    df.attrs = dict(META)  # pandas stores DataFrame.attrs in the file
    path = tmp_path / "pandas.parquet"
    df.to_parquet(path)
    back = load_dataset(path)
    save_dataset(ds, tmp_path / "twin.npz")
    assert back == ds and back.fingerprint() == load_dataset(tmp_path / "twin.npz").fingerprint()
    assert count_users(path) == ds.users
    assert declared_metadata(path).reward_range == (0.0, 1.0)
    assert isinstance(open_dataset(path), Dataset)  # a plain table is read whole


def test_pyarrow_file_with_the_qveil_schema_and_key_value_metadata(tmp_path: Path) -> None:
    ds = _ds(d=3)
    state = pa.list_(pa.float64(), 3)
    table = pa.table(
        {
            "user": pa.array(ds.user),
            "s": pa.FixedSizeListArray.from_arrays(pa.array(ds.s.ravel()), 3),
            "a": pa.array(ds.a.astype(np.int32)),  # any integer width
            "r": pa.array(ds.r),
            "s2": pa.FixedSizeListArray.from_arrays(pa.array(ds.s2.ravel()), 3),
            "terminal": pa.array(ds.terminal),
        }
    ).replace_schema_metadata(
        {"n_actions": "3", "reward_low": "0", "reward_high": "1", "population": "pop-t"}
    )
    assert table.schema.field("s").type == state
    path = tmp_path / "arrow.parquet"
    pq.write_table(table, path, row_group_size=17)  # row groups that split users: fine here
    back = load_dataset(path)
    assert back == ds and back.population == "pop-t"
    assert declared_metadata(path) == ("pop-t", (0.0, 1.0), 3)


def test_polars_file(tmp_path: Path) -> None:
    pl = pytest.importorskip("polars")
    ds = _ds()
    frame = pl.DataFrame(
        {
            "user": ds.user,
            "s": ds.s.tolist(),
            "a": ds.a,
            "r": ds.r,
            "s2": ds.s2.tolist(),
            "terminal": ds.terminal,
        }
    )
    path = tmp_path / "polars.parquet"
    frame.write_parquet(path, metadata={k: str(v) for k, v in META.items()})
    assert load_dataset(path) == ds


def test_a_directory_of_part_files_reads_in_name_order(tmp_path: Path) -> None:
    """Spark writes NAME.parquet/part-00000-....parquet files (and _SUCCESS)."""
    ds = _ds()
    df = _frame(ds, per_coordinate=True)
    out = tmp_path / "spark.parquet"
    out.mkdir()
    (out / "_SUCCESS").write_text("")
    for k, lo in enumerate(range(0, ds.n, 50)):
        df.iloc[lo : lo + 50].to_parquet(out / f"part-{k:05d}-x.snappy.parquet", index=False)
    assert load_dataset(out, reward_range=(0.0, 1.0), n_actions=3) == ds


def test_csv_reads_through_the_same_path(tmp_path: Path) -> None:
    ds = _ds()
    path = tmp_path / "d.csv"
    df = _frame(ds, per_coordinate=True)
    df["terminal"] = df["terminal"].astype(int)  # 0/1 in CSV
    df.to_csv(path, index=False, float_format="%.17g")
    with pytest.raises(InvalidArgument, match="declares no reward range"):
        load_dataset(path, n_actions=3)
    with pytest.raises(InvalidArgument, match="declares no action count"):
        load_dataset(path, reward_range=(0.0, 1.0))
    assert load_dataset(path, reward_range=(0.0, 1.0), n_actions=3) == ds
    assert declared_metadata(path) == (None, None, None)
    with pytest.raises(InvalidArgument, match="reads CSV but does not write it"):
        save_dataset(ds, tmp_path / "copy.csv")


def test_a_file_without_a_reward_range_is_described(tmp_path: Path) -> None:
    ds = _ds()
    path = tmp_path / "bare.parquet"
    _frame(ds, per_coordinate=False).to_parquet(path)
    s = describe_dataset(path)
    assert s["reward_range"] is None and s["fingerprint"] is None and s["n_actions"] is None
    assert s["users"] == ds.users and s["samples"] == ds.n
    assert s["reward_observed"] == [float(ds.r.min()), float(ds.r.max())]
    full = describe_dataset(path, reward_range=(0.0, 1.0), n_actions=3)
    assert full == ds.summary()


def _write(tmp_path: Path, df: pd.DataFrame, name: str = "bad.parquet") -> Path:
    df.attrs = dict(META)
    path = tmp_path / name
    df.to_parquet(path)
    return path


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (lambda df: df.drop(columns=["a"]), r"has no column 'a' \(columns: user, r, terminal"),
        (lambda df: df.drop(columns=["s2_0"]), r"has no column s2_0"),
        (lambda df: df.drop(columns=["s2_1"]), r"s has 2 coordinates but the next state s2 has 1"),
        (lambda df: df.drop(columns=["s_0", "s_1"]), r"has no state column 's'.*s_0 \.\."),
        (lambda df: df.assign(a=df["a"] + 0.5), r"column 'a' must hold integers, got double"),
        (lambda df: df.assign(user=df["user"].astype(str)), r"'user' must hold integers, got"),
        (lambda df: df.assign(terminal=2), r"column 'terminal' holds 2 at row 0"),
        (lambda df: df.assign(s=[[1.0]] * len(df)), r"state 's' both as a list column and"),
        (lambda df: df.assign(r=df["r"].where(df.index != 7)), r"column 'r' is null at row 7"),
        (lambda df: df.assign(r=df["r"] + 2), r"r\[0\] = .* is outside the declared reward"),
    ],
)
def test_bad_columns_are_named(tmp_path: Path, edit: Any, pattern: str) -> None:
    path = _write(tmp_path, edit(_frame(_ds(), per_coordinate=True)))
    with pytest.raises(InvalidArgument, match=pattern):
        load_dataset(path)


def test_ragged_or_non_numeric_state_lists_are_named(tmp_path: Path) -> None:
    df = _frame(_ds(), per_coordinate=False)
    ragged = df.copy()
    ragged.at[5, "s2"] = [0.0, 1.0, 2.0]
    with pytest.raises(InvalidArgument, match=r"column 's2' has 3 numbers at row 5 but 2 at row 0"):
        load_dataset(_write(tmp_path, ragged, "ragged.parquet"))
    text = df.assign(s=[["x", "y"]] * len(df))
    with pytest.raises(InvalidArgument, match=r"column 's' must hold a list of numbers per row"):
        load_dataset(_write(tmp_path, text, "text.parquet"))


def test_metadata_must_agree_with_what_is_given(tmp_path: Path) -> None:
    path = _write(tmp_path, _frame(_ds(), per_coordinate=True), "ok.parquet")
    with pytest.raises(InvalidArgument, match=r"declares the reward range \[0, 1\], not \[0, 2\]"):
        load_dataset(path, reward_range=(0.0, 2.0))
    with pytest.raises(InvalidArgument, match=r"declares 3 actions \(n_actions\), not 2"):
        load_dataset(path, n_actions=2)
