"""Plain tables as datasets: Parquet written by pandas, pyarrow, Polars or Spark, and CSV.

A table holds one row per transition, in columns named as the arrays of
:mod:`qveil.dataset_types` (any order; other columns are ignored):

============  ========================================  =====================================
column        type                                      meaning
============  ========================================  =====================================
user          integer                                   the owner of the row
a             integer                                   the action, in [0, n_actions)
r             number                                    the reward, inside the declared range
terminal      bool (or integer 0/1)                     the episode terminated at s2
s, s2         a list of d numbers per row               the state and the next state
s_0 .. s_k    or one number column per coordinate       (k = d - 1), and s2_0 .. s2_k
============  ========================================  =====================================

Each user's rows are in episode order (one episode after another, each step after the one
before); users may come in any order. A null anywhere, a missing or mistyped column, state
lists of different lengths, or a state given both as a list and per coordinate is refused
naming the column (and the row).

The public metadata is not in the rows. A Parquet file may declare it as key-value metadata
(strings): ``n_actions``, ``reward_low`` and ``reward_high``, ``env_id``, ``population`` and
``rewards_are_population_averages`` (``true``/``false``), or the same keys in pandas'
``DataFrame.attrs`` (which ``to_parquet`` stores); what a file does not declare, the caller
gives (``--reward-range``, the config's ``reward_range`` and ``actions``). A CSV file
declares nothing. A directory ``NAME.parquet`` (Spark's output) is read as its part files in
name order. Tables are read whole into memory; :mod:`qveil.dataset_parquet` is the layout
streamed one row group at a time (``qveil dataset convert`` writes it).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import numpy as np

from qveil.dataset_types import (
    ArrowArray,
    ArrowTable,
    Dataset,
    DatasetRows,
    Transitions,
    _echo,
    check_population_name,
)
from qveil.errors import FailedPrecondition, InvalidArgument, NotFound

N = TypeVar("N", int, float)

__all__ = ["TABLE_METADATA", "declared_table", "load_table", "read_table", "table_users"]

#: The key-value metadata a table may declare (each a string).
TABLE_METADATA = (
    "n_actions",
    "reward_low",
    "reward_high",
    "env_id",
    "population",
    "rewards_are_population_averages",
)
#: Where pandas' ``to_parquet`` stores ``DataFrame.attrs`` (a JSON object).
_PANDAS_ATTRS = b"PANDAS_ATTRS"


def _pyarrow() -> ModuleType:
    try:
        # here, not at the top: pyarrow is an optional dependency (the trainer extra)
        import pyarrow as pa
    except ImportError:
        raise FailedPrecondition(
            "Parquet and CSV datasets need pyarrow: pip install 'qveil[trainer]'"
        ) from None
    module: ModuleType = pa  # its objects: dataset_types' Arrow aliases
    return module


def _is_csv(p: Path) -> bool:
    return p.suffix == ".csv"


def _parts(p: Path) -> list[Path]:
    """The Parquet files of ``p``: itself, or a directory's part files in name order."""
    try:
        if p.is_file():
            return [p]
        if p.is_dir():
            parts = sorted(
                f for f in p.iterdir() if f.is_file() and not f.name.startswith(("_", "."))
            )
            if parts:
                return parts
            raise InvalidArgument(f"{_echo(str(p))} is a directory without Parquet part files")
    except OSError:  # e.g. a name too long for the file system
        pass
    raise NotFound(f"dataset file {_echo(str(p))} does not exist")


def _raw_metadata(p: Path) -> dict[bytes, bytes]:
    """The key-value metadata of a Parquet table (its first part's), read alone."""
    import pyarrow.parquet as pq  # here, not at the top: optional dependency (see _pyarrow)

    _pyarrow()
    first = _parts(p)[0]
    try:
        return dict(pq.read_metadata(first).metadata or {})
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for bad files
        raise InvalidArgument(
            f"{_echo(str(p))} is not a readable Parquet dataset: {str(exc)[:80]}"
        ) from None


def _declared(p: Path, raw: dict[bytes, bytes]) -> dict[str, str]:
    """The declared metadata (:data:`TABLE_METADATA`) of a table, as strings."""
    out: dict[str, str] = {}
    attrs = raw.get(_PANDAS_ATTRS)
    if attrs is not None:
        try:
            obj = json.loads(attrs)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            out.update({k: str(v).lower() if isinstance(v, bool) else str(v)
                        for k, v in obj.items() if k in TABLE_METADATA})  # fmt: skip
    for key in TABLE_METADATA:
        value = raw.get(key.encode())
        if value is not None:
            out[key] = value.decode("utf-8", "replace")
    return out


def _number(p: Path, key: str, text: str, kind: Callable[[str], N]) -> N:
    try:
        return kind(text)
    except ValueError:
        raise InvalidArgument(
            f"{_echo(str(p))}: metadata {key} must be a number, got {_echo(text)}"
        ) from None


def _reward_range(p: Path, meta: dict[str, str]) -> tuple[float, float] | None:
    if "reward_low" not in meta and "reward_high" not in meta:
        return None
    if "reward_low" not in meta or "reward_high" not in meta:
        raise InvalidArgument(
            f"{_echo(str(p))}: give both reward_low and reward_high in its metadata, or neither"
        )
    return (
        _number(p, "reward_low", meta["reward_low"], float),
        _number(p, "reward_high", meta["reward_high"], float),
    )


def _flag(p: Path, meta: dict[str, str]) -> bool:
    text = meta.get("rewards_are_population_averages", "false").strip().lower()
    if text not in ("true", "false"):
        raise InvalidArgument(
            f"{_echo(str(p))}: metadata rewards_are_population_averages must be true or "
            f"false, got {_echo(text)}"
        )
    return text == "true"


def declared_table(
    path: str | os.PathLike[str],
) -> tuple[str | None, tuple[float, float] | None, int | None]:
    """The population, reward range and action count a table declares (its metadata
    alone; a CSV file declares none)."""
    p = Path(os.fspath(path))
    if _is_csv(p):
        _parts(p)  # exists?
        return None, None, None
    meta = _declared(p, _raw_metadata(p))
    pop = meta.get("population")
    n = _number(p, "n_actions", meta["n_actions"], int) if "n_actions" in meta else None
    return (None if pop is None else check_population_name(pop)), _reward_range(p, meta), n


def _read(p: Path, columns: list[str] | None = None) -> ArrowTable:
    """The Arrow table of a CSV or Parquet table (``columns`` only, when given)."""
    pa = _pyarrow()
    # here, not at the top: optional dependency (see _pyarrow)
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    parts = _parts(p)
    try:
        if _is_csv(p):
            types = {"user": pa.int64(), "a": pa.int64(), "r": pa.float64(), "terminal": pa.bool_()}
            opts = pcsv.ConvertOptions(column_types=types, include_columns=columns)
            return pcsv.read_csv(parts[0], convert_options=opts)
        tables = [pq.read_table(f, columns=columns) for f in parts]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    except (InvalidArgument, NotFound):
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for bad files
        what = "CSV" if _is_csv(p) else "Parquet"
        reason = str(exc).replace(str(p), "<path>").strip().splitlines()[0][:160]
        raise InvalidArgument(
            f"{_echo(str(p))} is not a readable {what} dataset: {reason}"
        ) from None


def _null_row(col: ArrowArray) -> int | None:
    if not col.null_count:
        return None
    return int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])


def _column(table: ArrowTable, name: str, where: str) -> ArrowArray:
    if name not in table.column_names:
        raise InvalidArgument(
            f"{_echo(where)} has no column {name!r} (columns: "
            f"{', '.join(table.column_names)[:120]}; docs/datasets.md names the columns)"
        )
    col = table.column(name).combine_chunks()
    row = _null_row(col)
    if row is not None:
        raise InvalidArgument(f"{_echo(where)}: column {name!r} is null at row {row}")
    return col


def _typed(table: ArrowTable, name: str, where: str, kinds: str) -> np.ndarray:
    """Column ``name`` as numpy, its Arrow type one of ``kinds`` (i: integer, f: floating,
    b: bool)."""
    pa = _pyarrow()
    col = _column(table, name, where)
    t = col.type
    ok = (
        ("i" in kinds and pa.types.is_integer(t))
        or ("f" in kinds and pa.types.is_floating(t))
        or ("b" in kinds and pa.types.is_boolean(t))
    )
    if not ok:
        want = {"i": "integers", "if": "numbers", "bi": "booleans (or integers 0/1)"}[kinds]
        raise InvalidArgument(f"{_echo(where)}: column {name!r} must hold {want}, got {t}")
    return np.asarray(col.to_numpy(zero_copy_only=False))


def _terminal(table: ArrowTable, where: str) -> np.ndarray:
    arr = _typed(table, "terminal", where, "bi")
    if arr.dtype.kind == "b":
        return arr
    bad = (arr != 0) & (arr != 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgument(
            f"{_echo(where)}: column 'terminal' holds {int(arr[i])} at row {i} (booleans, or "
            "integers 0/1)"
        )
    return arr.astype(bool)


def _state(table: ArrowTable, base: str, where: str) -> np.ndarray:
    """The [n, d] state of ``base`` (``s`` or ``s2``): a list column, or one column per
    coordinate ``base_0 .. base_{d-1}``."""
    pa = _pyarrow()
    pattern = re.compile(rf"^{base}_(\d+)$")
    coords = sorted(
        (int(m.group(1)), c) for c in table.column_names if (m := pattern.match(c)) is not None
    )
    if base in table.column_names and coords:
        raise InvalidArgument(
            f"{_echo(where)} gives the state {base!r} both as a list column and as columns "
            f"{base}_0 ..: keep one"
        )
    if coords:
        index = [i for i, _ in coords]
        if index != list(range(len(index))):
            missing = sorted(set(range(max(index) + 1)) - set(index))
            raise InvalidArgument(
                f"{_echo(where)} has no column {base}_{missing[0]} (the coordinate columns "
                f"are {base}_0 .. {base}_{{d-1}})"
            )
        return np.column_stack([_typed(table, c, where, "if") for _, c in coords])
    if base not in table.column_names:
        raise InvalidArgument(
            f"{_echo(where)} has no state column {base!r} (a list of d numbers per row) nor "
            f"columns {base}_0 .. {base}_{{d-1}} (one per coordinate); columns: "
            f"{', '.join(table.column_names)[:120]}"
        )
    col = _column(table, base, where)
    t = col.type
    listy = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    if not listy or not (pa.types.is_floating(t.value_type) or pa.types.is_integer(t.value_type)):
        raise InvalidArgument(
            f"{_echo(where)}: column {base!r} must hold a list of numbers per row (or give "
            f"columns {base}_0 .. {base}_{{d-1}}), got {t}"
        )
    import pyarrow.compute as pc  # here, not at the top: optional dependency (see _pyarrow)

    lengths = np.asarray(pc.list_value_length(col).to_numpy(zero_copy_only=False))
    d = int(lengths[0]) if len(lengths) else 1
    bad = lengths != d
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgument(
            f"{_echo(where)}: column {base!r} has {int(lengths[i])} numbers at row {i} but "
            f"{d} at row 0 (every state has the same d coordinates)"
        )
    values = col.flatten()
    row = _null_row(values)
    if row is not None:
        raise InvalidArgument(f"{_echo(where)}: column {base!r} is null at row {row // d}")
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64).reshape(-1, d)


def read_table(path: str | os.PathLike[str]) -> DatasetRows:
    """The rows and declarations of a Parquet or CSV table (module docstring), validated by
    :meth:`~qveil.dataset_types.DatasetRows.dataset`."""
    p = Path(os.fspath(path))
    meta = {} if _is_csv(p) else _declared(p, _raw_metadata(p))
    table = _read(p)
    where = str(p)
    if table.num_rows == 0:
        raise InvalidArgument(f"{_echo(where)}: the dataset is empty (0 rows)")
    s, s2 = _state(table, "s", where), _state(table, "s2", where)
    if s.shape[1] != s2.shape[1]:
        raise InvalidArgument(
            f"{_echo(where)}: the state s has {s.shape[1]} coordinates but the next state s2 "
            f"has {s2.shape[1]} (the same d for both)"
        )
    arrays = Transitions(
        user=_typed(table, "user", where, "i"),
        s=s,
        a=_typed(table, "a", where, "i"),
        r=_typed(table, "r", where, "if"),
        s2=s2,
        terminal=_terminal(table, where),
    )
    n_actions = _number(p, "n_actions", meta["n_actions"], int) if "n_actions" in meta else None
    return DatasetRows(
        where=where,
        arrays=arrays,
        n_actions=n_actions,
        reward_range=_reward_range(p, meta),
        env_id=meta.get("env_id") or None,
        population=meta.get("population"),
        rewards_are_population_averages=_flag(p, meta),
    )


def load_table(
    path: str | os.PathLike[str],
    *,
    reward_range: tuple[float, float] | None = None,
    n_actions: int | None = None,
) -> Dataset:
    """A Parquet or CSV table as a validated :class:`Dataset` (the reward range and the
    action count: the file's, else the caller's; both given must agree)."""
    return read_table(path).dataset(reward_range=reward_range, n_actions=n_actions)


def table_users(path: str | os.PathLike[str]) -> int:
    """The number of distinct users of a table, from its ``user`` column alone."""
    p = Path(os.fspath(path))
    table = _read(p, columns=["user"] if not _is_csv(p) else None)
    return int(np.unique(_typed(table, "user", str(p), "i")).size)
