"""The rows of an offline dataset as one value: :class:`Transitions`.

Six row-aligned arrays, each row one transition (s, a, r, s', terminal) owned by a user:

=========  =================  =============================================================
array      dtype, shape       meaning
=========  =================  =============================================================
user       int64 [n]          the owner of the row (any integer id)
s          float64 [n, d]     the state
a          int64 [n]          the action
r          float64 [n]        the reward
s2         float64 [n, d]     the next state
terminal   bool [n]           True only when the episode terminated at s2
=========  =================  =============================================================

Construction checks the structure once and normalises it: integers of any width become
int64, real numbers float64, ``s``/``s2`` of shape ``[n]`` become ``[n, 1]``; anything else
(a float action, an int terminal, a 3-D state, mismatched lengths, ``s`` and ``s2`` of
different d) raises :class:`~qveil.errors.InvalidArgument` (a ``ValueError``) naming the
array. Arrays already in their canonical dtype are held as given, not copied. Values
(finite, actions in range, rewards in the declared range) are the dataset's checks
(:func:`qveil.dataset_types.validate_arrays`), not this type's: the estimators also hold
transitions mapped onto the unit box, or one action's rows.

The slices the estimators and the distributed fit take: any rows (:meth:`Transitions.take`),
one action's rows (:meth:`Transitions.of_action`), each user's first row
(:meth:`Transitions.first_rows`), the dense user index (:meth:`Transitions.user_index`) and
shards of whole users (:meth:`Transitions.shards`). Pure numpy: no I/O, no randomness.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from qveil.errors import InvalidArgument

__all__ = ["ARRAYS", "Transitions"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
#: Rows to take: a slice, row indices or a boolean mask.
Rows = slice | npt.NDArray[np.intp] | IntArray | BoolArray

#: The six arrays' names, in their fixed order (files, fingerprints).
ARRAYS = ("user", "s", "a", "r", "s2", "terminal")
_INTEGERS = ("user", "a")
_REALS = ("s", "r", "s2")
_INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True, eq=False, kw_only=True)
class Transitions:
    """The six row-aligned arrays (the module docstring); given by name, never by position."""

    user: IntArray
    s: FloatArray
    a: IntArray
    r: FloatArray
    s2: FloatArray
    terminal: BoolArray

    def __post_init__(self) -> None:
        raw = {name: _as_array(name, getattr(self, name)) for name in ARRAYS}
        _check_dtypes(raw)
        n = _check_shapes(raw)
        for name in _INTEGERS:
            arr = raw[name]
            if arr.dtype.kind == "u" and arr.size and int(arr.max()) > _INT64_MAX:
                i = int(np.flatnonzero(arr > _INT64_MAX)[0])
                raise InvalidArgument(f"{name}[{i}] = {int(arr[i])} does not fit in int64")
            object.__setattr__(self, name, np.asarray(arr, dtype=np.int64))
        for name in _REALS:
            arr = np.asarray(raw[name], dtype=np.float64)
            states = name != "r" and arr.ndim == 1
            object.__setattr__(self, name, arr.reshape(n, 1) if states else arr)
        object.__setattr__(self, "terminal", np.asarray(raw["terminal"], dtype=np.bool_))
        if self.s.shape[1] != self.s2.shape[1]:
            raise InvalidArgument(
                f"s and s2 must have the same number of coordinates d, got s with "
                f"{self.s.shape[1]} and s2 with {self.s2.shape[1]}"
            )
        if self.s.shape[1] == 0:
            raise InvalidArgument("states must have at least one coordinate (d >= 1), got d = 0")

    @classmethod
    def of(cls, arrays: Mapping[str, object]) -> Transitions:
        """The six arrays of ``arrays`` by their names (as an ``.npz`` file holds them)."""
        return cls(**{name: arrays[name] for name in ARRAYS})  # type: ignore[arg-type]

    @classmethod
    def concat(cls, parts: Sequence[Transitions]) -> Transitions:
        """The rows of ``parts`` one after the other."""
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in ARRAYS})

    # -- shape -----------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """The number of rows."""
        return int(self.a.shape[0])

    @property
    def d(self) -> int:
        """The number of state coordinates."""
        return int(self.s.shape[1])

    def columns(self) -> dict[str, npt.NDArray[np.int64 | np.float64 | np.bool_]]:
        """The six arrays by name, in :data:`ARRAYS` order."""
        return {name: getattr(self, name) for name in ARRAYS}

    # -- slices ----------------------------------------------------------------------------
    def take(self, rows: Rows) -> Transitions:
        """The rows ``rows`` (a slice: views; indices or a mask: copies, in that order)."""
        return Transitions(
            user=self.user[rows],
            s=self.s[rows],
            a=self.a[rows],
            r=self.r[rows],
            s2=self.s2[rows],
            terminal=self.terminal[rows],
        )

    def copy(self) -> Transitions:
        """Fresh copies of the six arrays (nothing aliases this value's)."""
        return Transitions(**{name: getattr(self, name).copy() for name in ARRAYS})

    def of_action(self, action: int) -> Transitions:
        """The rows whose action is ``action``, in their order."""
        return self.take(self.a == action)

    def user_index(self) -> tuple[IntArray, int]:
        """(dense user index per row, in [0, users) and increasing with the user id; the
        number of distinct users)."""
        _, uid = np.unique(self.user, return_inverse=True)
        dense = uid.reshape(-1).astype(np.int64)
        return dense, int(dense.max()) + 1 if len(dense) else 0

    def first_rows(self) -> Transitions:
        """Each user's first row, in the order of the users' first appearance."""
        _, first = np.unique(self.user, return_index=True)
        return self.take(np.sort(first))

    def shards(self, shard_users: int) -> list[Transitions]:
        """Shards of whole users: shard k holds every row of the users k * S .. (k + 1) * S - 1
        in increasing user order (S = ``shard_users``; a user's rows keep their order). No
        user is in two shards; the shards' arrays are contiguous copies."""
        if isinstance(shard_users, bool) or shard_users < 1:
            raise InvalidArgument(f"shard_users must be >= 1, got {shard_users!r}")
        order = np.argsort(self.user, kind="stable")
        su = self.user[order]
        starts = np.flatnonzero(np.concatenate(([True], su[1:] != su[:-1]))) if len(su) else su
        cuts = [int(v) for v in starts[::shard_users]] + [len(su)]
        return [self.take(order[cuts[i] : cuts[i + 1]]) for i in range(len(cuts) - 1)]


def _as_array(name: str, value: object) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        try:
            value = np.asarray(value)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"{name} is not an array: {exc}"[:200]) from None
    return value


def _check_dtypes(raw: dict[str, np.ndarray]) -> None:
    """Integers must be integers (a float action 1.5 is refused, not truncated), terminal
    bool, the rest real numbers."""
    for name in _INTEGERS:
        if raw[name].dtype.kind not in "iu":
            raise InvalidArgument(f"{name} must hold integers (int64), got dtype {raw[name].dtype}")
    if raw["terminal"].dtype.kind != "b":
        raise InvalidArgument(f"terminal must hold booleans, got dtype {raw['terminal'].dtype}")
    for name in _REALS:
        if raw[name].dtype.kind not in "fiu":
            raise InvalidArgument(
                f"{name} must hold real numbers (float64), got dtype {raw[name].dtype}"
            )


def _check_shapes(raw: dict[str, np.ndarray]) -> int:
    """Shapes and lengths; returns the row count n."""
    for name in ("user", "a", "r", "terminal"):
        if raw[name].ndim != 1:
            raise InvalidArgument(f"{name} must be 1-D [n], got shape {tuple(raw[name].shape)}")
    for name in ("s", "s2"):
        if raw[name].ndim not in (1, 2):
            raise InvalidArgument(
                f"{name} must be [n] or [n, d], got shape {tuple(raw[name].shape)}"
            )
    n = raw["a"].shape[0]
    for name in ARRAYS:
        if raw[name].shape[0] != n:
            raise InvalidArgument(
                f"mismatched lengths: {name} has {raw[name].shape[0]} rows but a has {n}"
                f" (row {min(n, raw[name].shape[0])} is missing from the shorter one)"
            )
    return int(n)
