"""Parquet datasets: the six arrays of :mod:`qveil.dataset` as columns, row-grouped by user.

A ``PATH.parquet`` file holds one row per transition with the columns

=========  ==================================  ================================================
column     Arrow type                          meaning (as in :mod:`qveil.dataset`)
=========  ==================================  ================================================
user       int64                               the owner of the row
s          fixed_size_list<float64>[d]         the state
a          int64                               the action, in [0, n_actions)
r          float64                             the reward, inside the declared range
s2         fixed_size_list<float64>[d]         the next state
terminal   bool                                the episode terminated at s2
=========  ==================================  ================================================

and, in the file's key-value metadata under ``qveil``, a JSON object: ``format``
(``"qveil-dataset-parquet/1"``), ``n_actions``, ``reward_range`` (two floats, also as
``float.hex`` in ``reward_range_hex`` so the range round-trips exactly), ``env_id``,
``population``, ``rewards_are_population_averages``, ``behaviour`` (the declared behaviour
policy, or null), ``users_per_group`` and the writer's
record of the data (``summary``: users, samples, d, the action histogram, observed rewards,
terminal rows, samples per user, the fingerprint), which ``qveil dataset info`` prints without
reading a row.

**Users are never split.** The ``user`` column is non-decreasing over the whole file, so each
user's rows are one block, and row group k holds exactly the users k * U .. (k + 1) * U - 1 in
file order (U = ``users_per_group``, the last group may hold fewer). A row group is therefore
a shard of whole users whose boundaries depend on the content and U only, never on how the
file was written (one process or many): the distributed fit (:mod:`qveil.trainer.distributed`)
uses row groups as its shards. Datasets whose user column is not sorted are refused with the
first offending row (sort them by user first; sorting changes the fingerprint, which covers
the row order).

**Streaming.** :class:`ParquetSource` opens a file by its metadata alone;
:meth:`~ParquetSource.read_group` reads and validates one row group (the checks of
:func:`qveil.dataset.validate_arrays`, nulls, and the user order against the neighbouring
groups), and :meth:`~ParquetSource.fingerprint`
hashes the file column by column, one row group at a time, so no step holds more than one row
group. Errors name the file, the row group and the row. :class:`ParquetDatasetWriter` writes
chunks of whole users as they come (the collection's shards) and makes the file appear
atomically: bad data writes nothing.

The fingerprint is :meth:`qveil.dataset.Dataset.fingerprint` of the same content: a Parquet
file and its ``.npz`` twin have the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, TracebackType

import numpy as np
from numpy.typing import NDArray

from qveil.dataset_types import (
    ECHO,
    FORMAT,
    ArrowArray,
    ArrowSchema,
    ArrowTable,
    Dataset,
    _echo,
    _resolve_actions,
    _resolve_range,
    check_population_name,
    validate_arrays,
)
from qveil.errors import FailedPrecondition, InvalidArgument, NotFound
from qveil.json_types import JSONObject
from qveil.transitions import ARRAYS, Transitions

__all__ = [
    "PARQUET_FORMAT",
    "USERS_PER_GROUP",
    "ParquetDatasetWriter",
    "ParquetSource",
    "is_qveil_parquet",
    "load_parquet",
    "save_parquet",
]

#: The ``format`` tag in a Parquet dataset's metadata.
PARQUET_FORMAT = "qveil-dataset-parquet/1"
#: Users per row group unless the writer is told otherwise (CartPole: ~2e5 rows, ~20 MB).
USERS_PER_GROUP = 10_000
#: The metadata key holding the JSON object.
_META_KEY = b"qveil"


def _pyarrow() -> tuple[ModuleType, ModuleType]:
    """``pyarrow`` and ``pyarrow.parquet`` (their objects: dataset_types' Arrow aliases)."""
    try:
        # here, not at the top: pyarrow is an optional dependency (the trainer extra)
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise FailedPrecondition(
            "Parquet datasets need pyarrow: pip install 'qveil[trainer]'"
        ) from None
    return pa, pq


def is_qveil_parquet(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a Parquet file with qveil's metadata (the layout of this
    module); False for any other file or directory (a plain table, :mod:`qveil.dataset_table`,
    or not Parquet at all: its reader says why)."""
    _, pq = _pyarrow()
    p = Path(os.fspath(path))
    try:
        if not p.is_file():
            return False
        return _META_KEY in (pq.read_metadata(p).metadata or {})
    except Exception:  # noqa: BLE001 - not readable as Parquet: the table reader reports it
        return False


def _schema(d: int, metadata: JSONObject | None = None) -> ArrowSchema:
    pa, _ = _pyarrow()
    state = pa.list_(pa.float64(), d)
    fields = [
        pa.field("user", pa.int64(), nullable=False),
        pa.field("s", state, nullable=False),
        pa.field("a", pa.int64(), nullable=False),
        pa.field("r", pa.float64(), nullable=False),
        pa.field("s2", state, nullable=False),
        pa.field("terminal", pa.bool_(), nullable=False),
    ]
    meta = None if metadata is None else {_META_KEY: json.dumps(metadata).encode()}
    return pa.schema(fields, metadata=meta)


def _table(arrays: Transitions) -> ArrowTable:
    pa, _ = _pyarrow()
    d = arrays.d

    def states(x: NDArray[np.float64]) -> ArrowArray:
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(x).ravel()), d)

    return pa.Table.from_arrays(
        [
            pa.array(arrays.user),
            states(arrays.s),
            pa.array(arrays.a),
            pa.array(arrays.r),
            states(arrays.s2),
            pa.array(arrays.terminal),
        ],
        schema=_schema(d),
    )


def _first_index(message: str) -> int | None:
    """The first row index a :func:`validate_arrays` message names (``r[12]`` -> 12)."""
    m = re.search(r"\[(\d+)", message)
    return int(m.group(1)) if m else None


def _user_blocks(user: NDArray[np.int64]) -> NDArray[np.int64]:
    """Start rows of each user's block (user non-decreasing), plus len(user) at the end."""
    starts = np.flatnonzero(np.diff(user)) + 1
    return np.concatenate(([0], starts, [len(user)])).astype(np.int64)


def _user_decreases_at(user: NDArray[np.int64]) -> int | None:
    """The first row whose user is smaller than the row before's, or None (non-decreasing)."""
    back = np.flatnonzero(np.diff(user) < 0)
    return int(back[0]) + 1 if back.size else None


class _Stats:
    """The writer's running record of the data (the ``summary`` in the metadata)."""

    def __init__(self, n_actions: int) -> None:
        self.users = 0
        self.samples = 0
        self.actions = np.zeros(n_actions, dtype=np.int64)
        self.r_min = np.inf
        self.r_max = -np.inf
        self.terminals = 0
        self.spu_min = np.iinfo(np.int64).max
        self.spu_max = 0

    def add(self, arrays: Transitions, n_actions: int) -> None:
        per_user = np.diff(_user_blocks(arrays.user))
        self.users += len(per_user)
        self.samples += arrays.n
        self.actions += np.bincount(arrays.a, minlength=n_actions)
        self.r_min = min(self.r_min, float(arrays.r.min()))
        self.r_max = max(self.r_max, float(arrays.r.max()))
        self.terminals += int(arrays.terminal.sum())
        self.spu_min = min(self.spu_min, int(per_user.min()))
        self.spu_max = max(self.spu_max, int(per_user.max()))


class ParquetDatasetWriter:
    """Write a Parquet dataset from chunks of whole users, in user order (a context manager).

    ``write`` takes the :class:`~qveil.transitions.Transitions` of one or more whole users
    (validated like a :class:`~qveil.dataset.Dataset`; users must continue the file's
    non-decreasing order, and a user of an earlier chunk may not reappear); rows are cut into
    row groups of exactly ``users_per_group`` users whatever the chunk sizes. :meth:`close`
    writes the metadata, computes the fingerprint (the arrays are spooled beside the file in
    their fingerprint order, then hashed) and moves the file into place; leaving the ``with``
    block on an exception, or :meth:`abort`, leaves nothing behind.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        d: int,
        n_actions: int,
        reward_range: tuple[float, float],
        env_id: str | None = None,
        population: str | None = None,
        rewards_are_population_averages: bool = False,
        users_per_group: int = USERS_PER_GROUP,
        force: bool = False,
        behaviour: str | None = None,
    ) -> None:
        _, pq = _pyarrow()
        self.path = Path(os.fspath(path))
        if self.path.suffix != ".parquet":
            raise InvalidArgument(
                f"a Parquet dataset path must end in .parquet, got {_echo(str(self.path))}"
            )
        if not self.path.parent.is_dir():
            raise NotFound(f"directory {_echo(str(self.path.parent))} does not exist")
        if self.path.exists() and not force:
            raise FailedPrecondition(f"{_echo(str(self.path))} exists; pass --force to replace it")
        if int(users_per_group) < 1:
            raise InvalidArgument(f"users_per_group must be >= 1, got {users_per_group!r}")
        if population is not None:
            check_population_name(population)
        self.d = int(d)
        self.n_actions = int(n_actions)
        self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        self.env_id = env_id
        self.population = population
        self.averages = bool(rewards_are_population_averages)
        self.behaviour = behaviour
        self.users_per_group = int(users_per_group)
        self._tag = uuid.uuid4().hex[:8]
        self._tmp = self.path.parent / f".{self.path.name}.tmp-{self._tag}"
        self._spool = Path(
            tempfile.mkdtemp(prefix=f".{self.path.name}.spool-", dir=self.path.parent)
        )
        self._spools = {name: open(self._spool / name, "wb") for name in ARRAYS}  # noqa: SIM115
        self._writer = pq.ParquetWriter(self._tmp, _schema(self.d), compression="snappy")
        self._pending: list[Transitions] = []
        self._pending_users = 0
        self._last_user: int | None = None
        self._stats = _Stats(self.n_actions)
        self._closed = False

    def __enter__(self) -> ParquetDatasetWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()

    def write(self, rows: Transitions) -> None:
        """Append the rows of whole users (see the class docstring)."""
        arrays, _, _ = validate_arrays(
            rows, n_actions=self.n_actions, reward_range=self.reward_range
        )
        if arrays.s.shape[1] != self.d:
            raise InvalidArgument(f"states have {arrays.s.shape[1]} coordinates, not {self.d}")
        u = arrays.user
        i = _user_decreases_at(u)
        if i is not None:
            raise InvalidArgument(
                f"user[{i}] = {int(u[i])} follows user {int(u[i - 1])}: a Parquet dataset keeps "
                "each user's rows together in user order (sort the rows by user first)"
            )
        if self._last_user is not None and int(u[0]) <= self._last_user:
            raise InvalidArgument(
                f"user[0] = {int(u[0])} does not follow the last user written "
                f"({self._last_user}): chunks must hold whole users in increasing order"
            )
        self._last_user = int(u[-1])
        self._pending.append(arrays)
        self._pending_users += len(_user_blocks(u)) - 1
        while self._pending_users >= self.users_per_group:
            self._flush(self.users_per_group)

    def _flush(self, users: int) -> None:
        """Write the first ``users`` pending users as one row group."""
        merged = Transitions.concat(self._pending)
        blocks = _user_blocks(merged.user)
        cut = int(blocks[min(users, len(blocks) - 1)])
        head, rest = merged.take(slice(None, cut)), merged.take(slice(cut, None))
        self._writer.write_table(_table(head), row_group_size=cut)
        for name, arr in head.columns().items():
            self._spools[name].write(np.ascontiguousarray(arr).tobytes())
        self._stats.add(head, self.n_actions)
        self._pending = [rest] if rest.n else []
        self._pending_users -= users

    def close(self) -> JSONObject:
        """Finish the file (metadata, fingerprint, atomic move); returns its summary."""
        try:
            if self._pending_users:
                self._flush(self._pending_users)
            if self._stats.samples == 0:
                raise InvalidArgument("the dataset is empty (0 rows)")
            for fh in self._spools.values():
                fh.close()
            summary = self._summary(self._fingerprint())
            meta = {
                "format": PARQUET_FORMAT,
                "n_actions": self.n_actions,
                "reward_range": list(self.reward_range),
                "reward_range_hex": [v.hex() for v in self.reward_range],
                "env_id": self.env_id,
                "population": self.population,
                "rewards_are_population_averages": self.averages,
                "behaviour": self.behaviour,
                "users_per_group": self.users_per_group,
                "summary": summary,
            }
            self._writer.add_key_value_metadata({_META_KEY: json.dumps(meta).encode()})
            self._writer.close()
            fd = os.open(self._tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self._tmp, self.path)
            self._closed = True
            return summary
        except BaseException:
            self.abort()
            raise
        finally:
            shutil.rmtree(self._spool, ignore_errors=True)

    def abort(self) -> None:
        """Discard everything written so far (the destination is never touched)."""
        if self._closed:
            return
        self._closed = True
        for fh in self._spools.values():
            fh.close()
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - a half-written temporary file is deleted anyway
            pass
        self._tmp.unlink(missing_ok=True)
        shutil.rmtree(self._spool, ignore_errors=True)

    def _fingerprint(self) -> str:
        n = self._stats.samples
        shapes = {"s": [n, self.d], "s2": [n, self.d]}
        dtypes = {"user": "<i8", "s": "<f8", "a": "<i8", "r": "<f8", "s2": "<f8", "terminal": "|b1"}
        h = _fingerprint_header(
            n_actions=self.n_actions,
            reward_range=self.reward_range,
            env_id=self.env_id,
            arrays=[[name, dtypes[name], shapes.get(name, [n])] for name in ARRAYS],
        )
        for name in ARRAYS:
            with open(self._spool / name, "rb") as fh:
                while block := fh.read(1 << 24):
                    h.update(block)
        return "sha256:" + str(h.hexdigest())

    def _summary(self, fingerprint: str) -> JSONObject:
        st = self._stats
        return {
            "users": st.users,
            "samples": st.samples,
            "d": self.d,
            "n_actions": self.n_actions,
            "actions": st.actions.tolist(),
            "reward_range": list(self.reward_range),
            "reward_observed": [st.r_min, st.r_max],
            "terminals": st.terminals,
            "samples_per_user": {"min": st.spu_min, "max": st.spu_max},
            "env_id": self.env_id,
            "rewards_are_population_averages": self.averages,
            "population": self.population,
            "behaviour": self.behaviour,
            "fingerprint": fingerprint,
        }


def _fingerprint_header(
    *,
    n_actions: int,
    reward_range: tuple[float, float],
    env_id: str | None,
    arrays: list[list[object]],
) -> hashlib._Hash:
    """A sha256 primed with :meth:`Dataset.fingerprint`'s header (same encoding)."""
    header = {
        "format": FORMAT,
        "n_actions": n_actions,
        "reward_range": [float(reward_range[0]).hex(), float(reward_range[1]).hex()],
        "env_id": env_id,
        "arrays": arrays,
    }
    h = hashlib.sha256()
    blob = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h.update(len(blob).to_bytes(8, "little"))
    h.update(blob)
    return h


def save_parquet(
    ds: Dataset,
    path: str | os.PathLike[str],
    *,
    users_per_group: int = USERS_PER_GROUP,
    force: bool = False,
) -> JSONObject:
    """Write ``ds`` as a Parquet dataset (its user column must be non-decreasing)."""
    with ParquetDatasetWriter(
        path,
        d=ds.d,
        n_actions=ds.n_actions,
        reward_range=ds.reward_range,
        env_id=ds.env_id,
        population=ds.population,
        rewards_are_population_averages=ds.rewards_are_population_averages,
        users_per_group=users_per_group,
        force=force,
        behaviour=ds.behaviour,
    ) as w:
        w.write(ds.transitions)
        return w.close()


class ParquetSource:
    """A Parquet dataset opened by its metadata alone; rows are read one row group at a time.

    Exposes the public metadata a trainer needs before touching rows (``n_actions``,
    ``reward_range``, ``env_id``, ``population``, ``rewards_are_population_averages``, ``d``,
    ``users``, ``n``, :meth:`summary`) and :meth:`read_group`, :meth:`groups` and
    :meth:`fingerprint` for the rows. ``users`` and ``n`` are the writer's record: the fit
    counts the users it reads and refuses a file whose count differs.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        reward_range: tuple[float, float] | None = None,
        n_actions: int | None = None,
    ) -> None:
        _, pq = _pyarrow()
        self.path = Path(os.fspath(path))
        try:
            found = self.path.is_file()
        except OSError:
            found = False
        if not found:
            raise NotFound(f"dataset file {_echo(str(self.path))} does not exist")
        try:
            self._file = pq.ParquetFile(self.path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for bad files
            raise InvalidArgument(
                f"{_echo(str(self.path))} is not a readable Parquet dataset: {str(exc)[:ECHO]}"
            ) from None
        raw = (self._file.metadata.metadata or {}).get(_META_KEY)
        if raw is None:
            raise InvalidArgument(
                f"{_echo(str(self.path))} has no qveil metadata: it is a plain table, read "
                "whole by qveil.dataset.load_dataset (qveil dataset convert writes the "
                "streamed layout)"
            )
        try:
            meta = json.loads(raw)
        except ValueError:
            raise InvalidArgument(f"{_echo(str(self.path))}: unreadable qveil metadata") from None
        if not isinstance(meta, dict) or meta.get("format") != PARQUET_FORMAT:
            got = meta.get("format") if isinstance(meta, dict) else None
            raise InvalidArgument(
                f"unsupported dataset format {_echo(got)} in {_echo(str(self.path))} "
                f"(this qveil reads {PARQUET_FORMAT})"
            )
        self._meta = meta
        try:
            declared = tuple(float.fromhex(v) for v in meta["reward_range_hex"])
            self.n_actions = int(meta["n_actions"])
            self.users_per_group = int(meta["users_per_group"])
            summary = dict(meta["summary"])
            self.users = int(summary["users"])
            self.n = int(summary["samples"])
        except (KeyError, TypeError, ValueError):
            raise InvalidArgument(f"{_echo(str(self.path))}: incomplete qveil metadata") from None
        self.reward_range = _resolve_range(
            (declared[0], declared[1]), reward_range, where=str(self.path)
        )
        _resolve_actions(self.n_actions, n_actions, where=str(self.path))
        self.env_id: str | None = meta.get("env_id")
        pop = meta.get("population")
        self.population: str | None = None if pop is None else check_population_name(pop)
        self.rewards_are_population_averages = meta.get("rewards_are_population_averages") is True
        beh = meta.get("behaviour")
        self.behaviour: str | None = beh if isinstance(beh, str) and beh else None
        expected = _schema(self._state_dims())
        if not self._file.schema_arrow.remove_metadata().equals(expected.remove_metadata()):
            raise InvalidArgument(
                f"{_echo(str(self.path))} has columns {self._file.schema_arrow.names} of types "
                f"{[str(t) for t in self._file.schema_arrow.types]}"[:200]
                + f"; a qveil Parquet dataset has {_schema(self.d).names} (docs/datasets.md)"
            )
        if self.n != self._file.metadata.num_rows:
            raise InvalidArgument(
                f"{_echo(str(self.path))} records {self.n} samples but holds "
                f"{self._file.metadata.num_rows} rows"
            )
        self._starts = np.concatenate(
            (
                [0],
                np.cumsum([self._file.metadata.row_group(i).num_rows for i in range(self.groups)]),
            )
        ).astype(np.int64)

    def _state_dims(self) -> int:
        field = self._file.schema_arrow.field("s") if "s" in self._file.schema_arrow.names else None
        size = getattr(getattr(field, "type", None), "list_size", None)
        if not isinstance(size, int) or size < 1:
            raise InvalidArgument(
                f"{_echo(str(self.path))}: column s must be fixed_size_list<float64>[d]"
            )
        self.d = size
        return size

    @property
    def groups(self) -> int:
        """The number of row groups (shards of whole users)."""
        return int(self._file.metadata.num_row_groups)

    def summary(self) -> JSONObject:
        """The writer's record (:meth:`qveil.dataset.Dataset.summary`'s keys), from the
        metadata alone."""
        out = dict(self._meta["summary"])
        out["reward_range"] = [self.reward_range[0], self.reward_range[1]]
        out["population"] = self.population
        out["rewards_are_population_averages"] = self.rewards_are_population_averages
        out["behaviour"] = self.behaviour
        return out

    def _where(self, group: int, row: int | None = None) -> str:
        where = f"{_echo(str(self.path))}, row group {group}"
        if row is not None:
            where += f", row {row} (row {int(self._starts[group]) + row} of the file)"
        return where

    def _last_user(self, group: int) -> int:
        """The last user of row group ``group``, read from its user column (never from the
        file's statistics: a file may have none, or false ones)."""
        try:
            col = self._file.read_row_group(group, columns=["user"]).column(0)
        except Exception as exc:  # noqa: BLE001 - corrupt pages raise several kinds
            raise InvalidArgument(f"{self._where(group)}: unreadable: {str(exc)[:ECHO]}") from None
        if len(col) == 0 or col.null_count:
            raise InvalidArgument(f"{self._where(group)}: empty, or a null user")
        return int(col[len(col) - 1].as_py())

    def read_group(self, group: int, *, previous_last_user: int | None = None) -> Transitions:
        """The validated arrays of row group ``group`` (nulls, the checks of
        :func:`qveil.dataset_types.validate_arrays`, users non-decreasing and each user within
        this one group: ``previous_last_user`` is the last user of group ``group - 1``; when
        not given, it is read from that group's user column, so a group read alone (one task
        of the distributed fit) is checked against its predecessor all the same)."""
        if not 0 <= group < self.groups:
            raise InvalidArgument(f"{_echo(str(self.path))} has no row group {group}")
        try:
            table = self._file.read_row_group(group)
        except Exception as exc:  # noqa: BLE001 - corrupt pages raise several kinds
            raise InvalidArgument(f"{self._where(group)}: unreadable: {str(exc)[:ECHO]}") from None
        for name in ARRAYS:
            col = table.column(name)
            if col.null_count:
                mask = col.is_null().to_numpy(zero_copy_only=False)
                raise InvalidArgument(
                    f"{self._where(group, int(np.flatnonzero(mask)[0]))}: {name} is null"
                )
        d = self.d

        def states(name: str) -> NDArray[np.float64]:
            flat = table.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False)
            return np.asarray(flat, dtype=np.float64).reshape(-1, d)

        try:
            arrays, _, _ = validate_arrays(
                Transitions(
                    user=table.column("user").to_numpy(),
                    s=states("s"),
                    a=table.column("a").to_numpy(),
                    r=table.column("r").to_numpy(),
                    s2=states("s2"),
                    terminal=table.column("terminal").to_numpy(zero_copy_only=False),
                ),
                n_actions=self.n_actions,
                reward_range=self.reward_range,
            )
        except InvalidArgument as exc:
            row = _first_index(str(exc))
            raise InvalidArgument(f"{self._where(group, row)}: {exc}") from None
        user = arrays.user
        i = _user_decreases_at(user)
        if i is not None:
            raise InvalidArgument(
                f"{self._where(group, i)}: user {int(user[i])} follows user {int(user[i - 1])}: "
                "the user column must be non-decreasing (each user's rows in one block)"
            )
        if group > 0:
            prev = self._last_user(group - 1) if previous_last_user is None else previous_last_user
            if int(user[0]) <= prev:
                raise InvalidArgument(
                    f"{self._where(group, 0)}: user {int(user[0])} also has rows in row group "
                    f"{group - 1}: a user's rows never span two row groups"
                )
        return arrays

    def iter_groups(self) -> Iterator[Transitions]:
        """Every row group's validated arrays, in file order."""
        last: int | None = None
        for g in range(self.groups):
            arrays = self.read_group(g, previous_last_user=last)
            last = int(arrays.user[-1])
            yield arrays

    def fingerprint(self) -> str:
        """:meth:`qveil.dataset.Dataset.fingerprint` of the file's content, computed one
        column of one row group at a time (the file's recorded fingerprint is not trusted)."""
        n, d = self.n, self.d
        dtypes = {"user": "<i8", "s": "<f8", "a": "<i8", "r": "<f8", "s2": "<f8", "terminal": "|b1"}
        h = _fingerprint_header(
            n_actions=self.n_actions,
            reward_range=self.reward_range,
            env_id=self.env_id,
            arrays=[
                [name, dtypes[name], [n, d] if name in ("s", "s2") else [n]] for name in ARRAYS
            ],
        )
        for name in ARRAYS:
            for g in range(self.groups):
                col = self._file.read_row_group(g, columns=[name]).column(0).combine_chunks()
                if name in ("s", "s2"):
                    col = col.flatten()
                arr = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.dtype(dtypes[name]))
                h.update(np.ascontiguousarray(arr).tobytes())
        return "sha256:" + str(h.hexdigest())

    def load(self) -> Dataset:
        """The whole file as a :class:`~qveil.dataset.Dataset` (every row group validated)."""
        return Dataset.of(
            Transitions.concat(list(self.iter_groups())),
            n_actions=self.n_actions,
            reward_range=self.reward_range,
            env_id=self.env_id,
            rewards_are_population_averages=self.rewards_are_population_averages,
            population=self.population,
            behaviour=self.behaviour,
        )


def load_parquet(
    path: str | os.PathLike[str], *, reward_range: tuple[float, float] | None = None
) -> Dataset:
    """Read a whole Parquet dataset into memory (:meth:`ParquetSource.load`)."""
    return ParquetSource(path, reward_range=reward_range).load()
