"""Offline datasets for the ``fqi`` mode, wherever they live: one interface over every file
format (the data itself, :class:`Dataset`, is :mod:`qveil.dataset_types`).

=====================  ===================================================================
location               read and written by
=====================  ===================================================================
``PATH.npz``           :mod:`qveil.dataset_npz`: the plain format (numpy only)
``PATH.parquet``       :mod:`qveil.dataset_parquet` when the file has qveil's metadata (row
                       groups of whole users, streamed by the fit); otherwise a plain table
                       written by pandas, pyarrow, Polars or Spark, :mod:`qveil.dataset_table`
                       (read whole; a directory of part files too)
``PATH.csv``           :mod:`qveil.dataset_table` (read only: a CSV file cannot carry the
                       declared metadata)
``DIR/NAME-vN``,       :mod:`qveil.dataset_minari`: Minari datasets
``minari:ID``
=====================  ===================================================================

The format modules import the types from :mod:`qveil.dataset_types` and nothing from this
module, so there is no import cycle. pyarrow and Minari are imported only when a file of
theirs is used: importing this module needs only numpy.

What a file does not declare, the caller gives: ``reward_range`` (``--reward-range``, the
config's ``reward_range``) and ``n_actions`` (the config's ``actions``); a value the file
declares too must agree.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from qveil.dataset_minari import declared_minari, load_minari, save_minari
from qveil.dataset_npz import declared_npz, load_npz, npz_users, read_npz, save_npz
from qveil.dataset_parquet import ParquetSource, is_qveil_parquet, save_parquet
from qveil.dataset_table import declared_table, read_table, table_users
from qveil.dataset_types import (
    FORMAT,
    Dataset,
    DatasetRows,
    Transitions,
    _echo,
    check_population_name,
    validate_arrays,
)
from qveil.errors import InvalidArgument
from qveil.json_types import JSONObject

__all__ = [
    "Dataset",
    "DatasetRows",
    "Declared",
    "FORMAT",
    "Transitions",
    "check_population_name",
    "count_users",
    "dataset_kind",
    "declared_metadata",
    "describe_dataset",
    "iter_states",
    "load_dataset",
    "load_npz",
    "open_dataset",
    "save_dataset",
    "save_npz",
    "validate_arrays",
]


def dataset_kind(path: str | os.PathLike[str]) -> str:
    """``"npz"``, ``"parquet"``, ``"csv"`` or ``"minari"`` for a dataset location (module
    docstring)."""
    text = os.fspath(path)
    if text.startswith("minari:"):
        return "minari"
    for kind in ("npz", "parquet", "csv"):
        if text.endswith(f".{kind}"):
            return kind
    p = Path(text)
    if p.is_dir() or not p.suffix:
        return "minari"
    raise InvalidArgument(
        f"unknown dataset location {_echo(text)}: give PATH.npz, PATH.parquet, PATH.csv, a "
        "Minari dataset directory (.../NAME-vN) or minari:DATASET_ID"
    )


def _streamed(path: str | os.PathLike[str]) -> bool:
    """True for a Parquet file in qveil's streamed layout (qveil metadata)."""
    return dataset_kind(path) == "parquet" and is_qveil_parquet(path)


class Declared(NamedTuple):
    """What a dataset file declares about itself in its metadata (None: not declared; a
    Minari dataset's action count is its action space, read with its episodes)."""

    population: str | None
    reward_range: tuple[float, float] | None
    n_actions: int | None = None


def declared_metadata(path: str | os.PathLike[str]) -> Declared:
    """The population, reward range and action count a dataset file declares, read from its
    metadata alone (no private rows are read: an ``.npz``'s metadata members, a Parquet
    file's footer, the Minari metadata; a CSV file declares nothing)."""
    kind = dataset_kind(path)
    if kind == "npz":
        return Declared(*declared_npz(path))
    if _streamed(path):
        src = ParquetSource(path)
        return Declared(src.population, src.reward_range, src.n_actions)
    if kind in ("parquet", "csv"):
        return Declared(*declared_table(path))
    return Declared(*declared_minari(path))


def _rows(path: str | os.PathLike[str]) -> DatasetRows | None:
    """The rows of a file read whole before its metadata is settled (npz, plain tables);
    None for the formats that always declare it (qveil Parquet, Minari)."""
    kind = dataset_kind(path)
    if kind == "npz":
        return read_npz(path)
    if kind in ("parquet", "csv") and not _streamed(path):
        return read_table(path)
    return None


def load_dataset(
    path: str | os.PathLike[str],
    *,
    reward_range: tuple[float, float] | None = None,
    n_actions: int | None = None,
) -> Dataset:
    """Read a whole dataset from any location (module docstring) and validate it.

    Minari locations: a dataset directory (``ROOT/NAME-vN``, the folder holding ``data/``) or
    ``minari:DATASET_ID``, resolved under Minari's root (``$MINARI_DATASETS_PATH``, default
    ``~/.minari/datasets``). Nothing is ever downloaded. ``reward_range`` and ``n_actions``
    supply what the file does not declare; each must agree with a value the file declares.
    """
    rows = _rows(path)
    if rows is not None:
        return rows.dataset(reward_range=reward_range, n_actions=n_actions)
    if dataset_kind(path) == "parquet":
        return ParquetSource(path, reward_range=reward_range, n_actions=n_actions).load()
    return load_minari(path, reward_range=reward_range, n_actions=n_actions)


def open_dataset(
    path: str | os.PathLike[str],
    *,
    reward_range: tuple[float, float] | None = None,
    n_actions: int | None = None,
    stream: bool = True,
) -> Dataset | ParquetSource:
    """The dataset at ``path`` for a fit: a Parquet file in qveil's layout as a
    :class:`~qveil.dataset_parquet.ParquetSource` (its row groups read one per task) when
    ``stream``, anything else read whole (:func:`load_dataset`)."""
    if stream and _streamed(path):
        return ParquetSource(path, reward_range=reward_range, n_actions=n_actions)
    return load_dataset(path, reward_range=reward_range, n_actions=n_actions)


def describe_dataset(
    path: str | os.PathLike[str],
    *,
    reward_range: tuple[float, float] | None = None,
    n_actions: int | None = None,
) -> JSONObject:
    """:meth:`Dataset.summary` of the file (``qveil dataset info``): a qveil Parquet file's
    from its metadata alone; an ``.npz`` or a table that declares no reward range (none given)
    is described all the same, with ``reward_range`` and ``fingerprint`` None
    (:meth:`~qveil.dataset_types.DatasetRows.summary`)."""
    rows = _rows(path)
    if rows is not None:
        return rows.summary(reward_range=reward_range, n_actions=n_actions)
    if dataset_kind(path) == "parquet":
        return ParquetSource(path, reward_range=reward_range, n_actions=n_actions).summary()
    return load_dataset(path, reward_range=reward_range, n_actions=n_actions).summary()


def iter_states(
    path: str | os.PathLike[str],
    *,
    reward_range: tuple[float, float] | None = None,
) -> Iterator[tuple[NDArray[np.float64], NDArray[np.float64]]]:
    """The states and next states of the file's rows as float64 [n, d] blocks: a qveil
    Parquet file one validated row group at a time, an ``.npz`` or a table as read (whatever
    its reward range and action count), a Minari dataset whole."""
    rows = _rows(path)
    if rows is not None:
        yield rows.arrays.s, rows.arrays.s2
    elif dataset_kind(path) == "parquet":
        for group in ParquetSource(path, reward_range=reward_range).iter_groups():
            yield group.s, group.s2
    else:
        ds = load_dataset(path, reward_range=reward_range)
        yield ds.s, ds.s2


def count_users(path: str | os.PathLike[str]) -> int:
    """N, the number of users, read from the file's user column alone (a qveil Parquet
    file: its recorded count), for public uses such as the utility forecast."""
    kind = dataset_kind(path)
    if kind == "npz":
        return npz_users(path)
    if _streamed(path):
        return ParquetSource(path).users
    if kind in ("parquet", "csv"):
        return table_users(path)
    return load_dataset(path).users


def save_dataset(ds: Dataset, path: str | os.PathLike[str]) -> None:
    """Write ``ds`` to ``PATH.npz``, ``PATH.parquet`` (qveil's streamed layout; needs the
    user column non-decreasing) or a Minari location. A CSV file is never written: it cannot
    carry the declared metadata.

    The dataset is validated again first and the file appears atomically (written to a
    temporary name beside it, then ``os.replace``), so bad data writes nothing and a crash
    leaves either no file or a complete one.
    """
    if not isinstance(ds, Dataset):
        raise InvalidArgument(f"save_dataset needs a Dataset, got {type(ds).__name__}")
    # re-check: a Dataset is validated on construction, but object.__setattr__ can bypass it
    validate_arrays(ds.transitions, n_actions=ds.n_actions, reward_range=ds.reward_range)
    kind = dataset_kind(path)
    if kind == "npz":
        save_npz(ds, path)
    elif kind == "parquet":
        save_parquet(ds, path, force=True)
    elif kind == "csv":
        raise InvalidArgument(
            f"{_echo(os.fspath(path))}: qveil reads CSV but does not write it (a CSV file "
            "cannot carry the declared metadata); write PATH.parquet or PATH.npz"
        )
    else:
        save_minari(ds, path)
