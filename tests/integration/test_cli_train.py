"""`qveil train --dataset` on the files people bring, through the real CLI: a
Parquet table written by pandas (the reward range from the config, or --reward-range, which
must agree with the file's), an npz without a reward range, rows outside the config's state
intervals (warned, refused above the threshold unless --allow-clipping: nothing written,
nothing charged), a coordinate-count mismatch and a CSV saved as .npz (exit 2, one line),
and a crafted Parquet file whose row groups split a user. Each command path runs once as a
real subprocess; the refusals and other variations run the same entry point in this process
(cli_helpers.qveil_main)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_helpers import assert_one_line_error, qveil_main
from config_helpers import CARTPOLE_CONFIG
from server_helpers import ensure_population

from qveil.dataset import Dataset, save_dataset
from qveil.dataset_parquet import save_parquet
from qveil.trainer.collect import collect

QVEIL = str(Path(sys.executable).with_name("qveil"))
USERS = 60


def qveil(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([QVEIL, *argv], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cartpole() -> Dataset:
    return collect("CartPole-v1", USERS, 3, reward_range=(0.0, 1.0))


def _frame(ds: Dataset, *, scale: float = 1.0) -> pd.DataFrame:
    """The dataset as pandas users make one: a column per coordinate."""
    cols = {"user": ds.user, "a": ds.a, "r": ds.r, "terminal": ds.terminal}
    for name in ("s", "s2"):
        arr = getattr(ds, name) * scale
        cols |= {f"{name}_{j}": arr[:, j] for j in range(ds.d)}
    return pd.DataFrame(cols)


def _charges() -> int:
    """Releases charged in this test's registry (QVEIL_HOME, tests/conftest.py)."""
    path = Path(os.environ["QVEIL_HOME"]) / "registry.sqlite"
    if not path.exists():
        return 0
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM ledger_events").fetchone()[0])


def _train(dataset: Path, out: Path, *extra: str, config: str = CARTPOLE_CONFIG) -> list[str]:
    return [
        "train", "--dataset", str(dataset), "--config", config, "--epsilon", "1",
        "--out", str(out), "--force", "--no-progress", *ensure_population(), *extra,
    ]  # fmt: skip


def test_a_pandas_parquet_file_trains(cartpole: Dataset, tmp_path: Path) -> None:
    """No qveil metadata: n_actions from DataFrame.attrs, the reward range from the config
    (a file that declares none), or --reward-range, which must agree with a declared one."""
    df = _frame(cartpole)
    df.attrs = {"n_actions": 2}
    path = tmp_path / "pandas.parquet"
    df.to_parquet(path)
    r = qveil(*_train(path, tmp_path / "b1"))
    assert r.returncode == 0, r.stderr
    assert f"users={USERS}" in r.stdout and (tmp_path / "b1").is_dir()
    df.attrs = {"n_actions": 2, "reward_low": 0.0, "reward_high": 1.0}
    df.to_parquet(path)
    r = qveil_main(*_train(path, tmp_path / "b2", "--reward-range", "0,2"))
    assert_one_line_error(r, "train", "declares the reward range [0, 1], not [0, 2]")
    assert not (tmp_path / "b2").exists()


def test_an_npz_without_a_reward_range(cartpole: Dataset, tmp_path: Path) -> None:
    path = tmp_path / "bare.npz"
    np.savez(path, **{k: getattr(cartpole, k) for k in ("user", "s", "a", "r", "s2", "terminal")},
             n_actions=2)  # fmt: skip
    before = _charges()
    r = qveil(*_train(path, tmp_path / "b", "--reward-range", "0,1"))
    assert r.returncode == 0, r.stderr
    assert _charges() == before + 1
    r = qveil_main("dataset", "info", str(path))
    assert r.returncode == 0, r.stderr
    assert "reward       none declared (qveil train needs --reward-range" in r.stdout
    assert "fingerprint  (none until the reward range is declared)" in r.stdout


def test_rows_outside_the_state_intervals(cartpole: Dataset, tmp_path: Path) -> None:
    """States in the wrong units (x 10): most rows fall outside the config's intervals."""
    df = _frame(cartpole, scale=10.0)
    df.attrs = {"n_actions": 2}
    path = tmp_path / "wide.parquet"
    df.to_parquet(path)
    before = _charges()
    r = qveil_main(*_train(path, tmp_path / "b"))
    assert_one_line_error(r, "train", "refusing: ", "outside the config's state_intervals",
                          "--allow-clipping")  # fmt: skip
    assert not (tmp_path / "b").exists() and _charges() == before
    r = qveil("dataset", "info", str(path), "--config", CARTPOLE_CONFIG)
    assert r.returncode == 0, r.stderr
    assert "clipped      " in r.stdout and "qveil train refuses above 25 %" in r.stdout
    r = qveil(*_train(path, tmp_path / "b", "--allow-clipping"))
    assert r.returncode == 0, r.stderr
    assert "WARNING: " in r.stderr and "outside the config's state_intervals" in r.stderr
    assert _charges() == before + 1


def test_a_coordinate_count_mismatch_names_both_files(cartpole: Dataset, tmp_path: Path) -> None:
    path = tmp_path / "d4.npz"
    save_dataset(cartpole, path)
    config = tmp_path / "three.toml"
    config.write_text(
        Path(CARTPOLE_CONFIG)
        .read_text()
        .replace("[[-0.3, 0.3], ", "[")
        .replace("betas = [1024.0, ", "betas = [")
    )
    r = qveil_main(*_train(path, tmp_path / "b", config=str(config)))
    assert_one_line_error(r, "train", "d4.npz", "has 4 state coordinates", "three.toml",
                          "state_intervals for 3")  # fmt: skip


def test_a_csv_file_named_npz(cartpole: Dataset, tmp_path: Path) -> None:
    path = tmp_path / "table.npz"
    _frame(cartpole).to_csv(path, index=False)
    r = qveil_main(*_train(path, tmp_path / "b"))
    assert_one_line_error(r, "train", "table.npz", "is not an .npz file", "looks like CSV",
                          "PATH.csv")  # fmt: skip
    r = qveil_main("dataset", "info", str(path))
    assert_one_line_error(r, "dataset", "looks like CSV")
    csv = tmp_path / "table.csv"
    path.rename(csv)
    r = qveil_main("dataset", "info", str(csv), "--config", CARTPOLE_CONFIG)
    assert r.returncode == 0, r.stderr
    assert f"users        {USERS}" in r.stdout


def test_a_parquet_file_whose_row_groups_split_a_user(cartpole: Dataset, tmp_path: Path) -> None:
    """Written without statistics, the last row of row group 0 owned by the first user of
    row group 1: the streamed fit refuses it (exit 2), nothing written, nothing charged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    save_parquet(cartpole, good, users_per_group=20)
    f = pq.ParquetFile(good)
    shared = f.read_row_group(1, columns=["user"]).column(0)[0].as_py()
    with pq.ParquetWriter(bad, f.schema_arrow, write_statistics=False) as w:
        for g in range(f.num_row_groups):
            t = f.read_row_group(g)
            if g == 0:
                user = t.column("user").to_pylist()
                user[-1] = shared
                t = t.set_column(0, t.schema.field("user"), pa.array(user, pa.int64()))
            w.write_table(t, row_group_size=t.num_rows)
        w.add_key_value_metadata({b"qveil": f.metadata.metadata[b"qveil"]})
    before = _charges()
    r = qveil_main(*_train(bad, tmp_path / "b"))
    assert_one_line_error(r, "train", "row group 1, row 0",
                          f"user {shared} also has rows in row group 0")  # fmt: skip
    assert not (tmp_path / "b").exists() and _charges() == before
