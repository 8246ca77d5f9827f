"""qveil.transitions.Transitions: structure checked once, named in errors; the slices."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from qveil.errors import InvalidArgument
from qveil.transitions import Transitions


def _rows(n: int = 6, d: int = 2) -> Transitions:
    rng = np.random.default_rng(0)
    return Transitions(
        user=np.array([5, 5, 2, 9, 2, 5])[:n],
        s=rng.uniform(size=(n, d)),
        a=np.array([0, 1, 1, 0, 1, 0])[:n],
        r=rng.uniform(size=n),
        s2=rng.uniform(size=(n, d)),
        terminal=np.zeros(n, bool),
    )


def test_canonical_arrays_are_held_not_copied_and_others_normalised() -> None:
    t = _rows()
    s = t.s
    assert Transitions(**t.columns()).s is s  # type: ignore[arg-type]
    small = dataclasses.replace(
        t, user=t.user.astype(np.int32), r=t.r.astype(np.float32), s=t.s[:, 0], s2=t.s2[:, 0]
    )
    assert small.user.dtype == np.int64 and small.r.dtype == np.float64
    assert small.s.shape == (6, 1) and small.d == 1 and small.n == 6


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"a": np.full(6, 1.5)}, r"a must hold integers"),
        ({"terminal": np.zeros(6, np.int64)}, r"terminal must hold booleans"),
        ({"r": np.array(["x"] * 6)}, r"r must hold real numbers"),
        ({"s": np.zeros((6, 2, 1))}, r"s must be \[n\] or \[n, d\]"),
        ({"user": np.zeros((6, 1), np.int64)}, r"user must be 1-D"),
        ({"s2": np.zeros((5, 2))}, r"mismatched lengths: s2 has 5 rows"),
        ({"s2": np.zeros((6, 3))}, r"s and s2 must have the same number of coordinates"),
        ({"user": np.full(6, 2**63, np.uint64)}, r"user\[0\] = 9223372036854775808 does not fit"),
    ],
)
def test_a_bad_array_is_named(change: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as err:
        dataclasses.replace(_rows(), **change)
    assert isinstance(err.value, ValueError)


def test_slices() -> None:
    t = _rows()
    assert np.array_equal(t.of_action(1).user, [5, 2, 2])
    assert np.array_equal(t.first_rows().user, [5, 2, 9])  # order of first appearance
    assert np.array_equal(t.first_rows().s, t.s[[0, 2, 3]])
    dense, users = t.user_index()
    assert users == 3 and np.array_equal(dense, [1, 1, 0, 2, 0, 1])
    assert np.array_equal(t.take(slice(1, 3)).a, [1, 1])
    shards = t.shards(2)
    assert [sh.user.tolist() for sh in shards] == [[2, 2, 5, 5, 5], [9]]  # whole users
    assert np.array_equal(shards[0].s, t.s[[2, 4, 0, 1, 5]])  # a user's rows keep their order
    assert Transitions.concat(shards).n == t.n
    with pytest.raises(InvalidArgument, match="shard_users must be >= 1"):
        t.shards(0)
