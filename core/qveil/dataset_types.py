"""Offline datasets for the ``fqi`` mode: transitions (s, a, r, s', terminal), each owned by a user.

A dataset is a set of episodes, each belonging to a user; the user-level neighbour relation of
the fqi mode (docs/privacy.md section 2.5) replaces *one user's whole data* (all rows with that
``user`` id). In memory it is a frozen :class:`Dataset`: the six row-aligned arrays of a
:class:`~qveil.transitions.Transitions` (:attr:`Dataset.transitions`) plus public metadata:

=========  =================  ===================================================================
array      dtype, shape       meaning
=========  =================  ===================================================================
user       int64 [n]          the owner of the row (any integer id)
s          float64 [n, d]     the state (a file may hold [n] for d = 1)
a          int64 [n]          the action, in [0, n_actions)
r          float64 [n]        the reward, inside the declared (public) ``reward_range``
s2         float64 [n, d]     the next state
terminal   bool [n]           True only when the episode *terminated* at s2 (never for a time
                              limit); fitted-Q then bootstraps nothing from s2
=========  =================  ===================================================================

Every construction validates (wrong dtypes or shapes and mismatched lengths, through
:class:`~qveil.transitions.Transitions`; NaN or inf, rewards outside the declared range, actions
outside [0, n_actions)) and raises
:class:`~qveil.errors.InvalidArgument` naming the array and the first offending row, so bad data
never reaches a trainer and :func:`save_dataset` never writes it.

The files are elsewhere: :mod:`qveil.dataset` reads and writes every location (it
dispatches to :mod:`qveil.dataset_npz`, :mod:`qveil.dataset_parquet`,
:mod:`qveil.dataset_table` and :mod:`qveil.dataset_minari`, which all import the types from
this module and never each other's dispatcher). This module needs only numpy and
:mod:`qveil.transitions`.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any, TypeAlias  # Any: the Arrow aliases below (pyarrow is untyped)

import numpy as np
from numpy.typing import NDArray

from qveil.errors import InvalidArgument, clip
from qveil.json_types import JSONObject
from qveil.transitions import ARRAYS as _ARRAYS
from qveil.transitions import Transitions

__all__ = [
    "ArrowArray",
    "ArrowSchema",
    "ArrowTable",
    "Dataset",
    "DatasetRows",
    "FORMAT",
    "Transitions",
    "check_population_name",
    "validate_arrays",
]

#: The ``format`` tag of the plain ``.npz`` layout (bumped on any incompatible change).
FORMAT = "qveil-dataset/1"

#: User text (paths, ids) is echoed at most this many characters.
ECHO = 80

# The pyarrow objects the Parquet and CSV formats (qveil.dataset_parquet, qveil.dataset_table)
# pass between their functions, named once here (both import this module, not each other).
#: A ``pyarrow.Table`` (rows in named columns).
ArrowTable: TypeAlias = Any  # pyarrow ships no type information
#: A ``pyarrow.Array`` or ``ChunkedArray`` (one column, or a list column's values).
ArrowArray: TypeAlias = Any  # pyarrow ships no type information
#: A ``pyarrow.Schema`` (column names, types and the key-value metadata).
ArrowSchema: TypeAlias = Any  # pyarrow ships no type information


def _echo(value: object) -> str:
    """``repr`` of user input, cut to :data:`ECHO` characters (:func:`qveil.errors.clip`)."""
    return clip(repr(value), ECHO)


def _num(x: float) -> str:
    """A float as people read it: 0.5, 1, nan, 0.73."""
    return f"{float(x):.6g}"


@dataclass(frozen=True, eq=False)
class Dataset:
    """Validated transitions with their public metadata (see the module docstring).

    Arrays are normalised on construction (``s`` and ``s2`` always 2-D, canonical dtypes) and
    made read-only, so a dataset's :meth:`fingerprint` cannot drift after it was computed.
    Equality is equality of fingerprints.
    """

    user: NDArray[np.int64]
    s: NDArray[np.float64]
    a: NDArray[np.int64]
    r: NDArray[np.float64]
    s2: NDArray[np.float64]
    terminal: NDArray[np.bool_]
    n_actions: int
    reward_range: tuple[float, float]
    env_id: str | None = None
    #: Declared by whoever made the data: every reward ``r[i]`` is already the mean of the N
    #: users' private reward functions at that transition (simulated data of the ``reward``
    #: neighbour relation), not one user's own reward. fqi training accepts the ``reward``
    #: relation only for a dataset that declares it (docs/privacy.md, "The fqi mode").
    rewards_are_population_averages: bool = False
    #: Declared by whoever made the data: the population (the people behind these rows) whose
    #: one privacy budget every release trained on them is charged to (``qveil budget``).
    #: Files that share people (a superset, a resample) declare the same name.
    population: str | None = None
    #: Declared by whoever made the data: the public behaviour policy that chose the actions
    #: (``random``, or ``NAME (epsilon E)`` from ``qveil dataset collect --policy``); None:
    #: not declared. Not in the fingerprint (the rows are the data).
    behaviour: str | None = None
    # derived values (fingerprint, user count), computed once: the arrays are read-only
    _cache: dict[str, int | str] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        arrays, n_actions, reward_range = validate_arrays(
            self.transitions, n_actions=self.n_actions, reward_range=self.reward_range
        )
        for name, arr in arrays.columns().items():
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "n_actions", n_actions)
        object.__setattr__(self, "reward_range", reward_range)
        object.__setattr__(
            self,
            "rewards_are_population_averages",
            _declared_flag("rewards_are_population_averages", self.rewards_are_population_averages),
        )
        if self.population is not None:
            object.__setattr__(self, "population", check_population_name(self.population))
        if self.behaviour is not None and (
            not isinstance(self.behaviour, str)
            or not self.behaviour
            or len(self.behaviour) > 256
            or not self.behaviour.isprintable()
        ):
            raise InvalidArgument(
                f"behaviour must be 1 to 256 printable characters, got {_echo(self.behaviour)}"
            )
        if self.env_id is not None:
            if not isinstance(self.env_id, str):
                raise InvalidArgument(f"env_id must be a string or None, got {_echo(self.env_id)}")
            if not self.env_id or len(self.env_id) > 256 or not self.env_id.isprintable():
                raise InvalidArgument(
                    f"env_id must be 1 to 256 printable characters, got {_echo(self.env_id)}"
                )

    @classmethod
    def of(
        cls,
        rows: Transitions,
        *,
        n_actions: int,
        reward_range: tuple[float, float],
        env_id: str | None = None,
        rewards_are_population_averages: bool = False,
        population: str | None = None,
        behaviour: str | None = None,
    ) -> Dataset:
        """The dataset of ``rows`` and this metadata (validated as every construction)."""
        return cls(
            user=rows.user,
            s=rows.s,
            a=rows.a,
            r=rows.r,
            s2=rows.s2,
            terminal=rows.terminal,
            n_actions=n_actions,
            reward_range=reward_range,
            env_id=env_id,
            rewards_are_population_averages=rewards_are_population_averages,
            population=population,
            behaviour=behaviour,
        )

    # -- shape -----------------------------------------------------------------------------
    @property
    def transitions(self) -> Transitions:
        """The six arrays (read-only) as one value."""
        return Transitions(
            user=self.user, s=self.s, a=self.a, r=self.r, s2=self.s2, terminal=self.terminal
        )

    @property
    def n(self) -> int:
        """Number of samples (transitions)."""
        return self.transitions.n

    @property
    def d(self) -> int:
        """Number of state coordinates."""
        return self.transitions.d

    @property
    def users(self) -> int:
        """Number of distinct users (the m of the user-level relation)."""
        if "users" not in self._cache:
            self._cache["users"] = int(np.unique(self.user).size)
        return int(self._cache["users"])

    def __len__(self) -> int:
        return self.n

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dataset):
            return NotImplemented
        return self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    # -- identity --------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """``"sha256:<hex>"`` of a canonical encoding of every array and all metadata.

        The encoding is a JSON header (format tag, n_actions, the exact reward range as
        ``float.hex``, env_id, and each array's name, dtype and shape) followed by each array's
        bytes, little-endian and C-ordered, in a fixed order. It depends on the content only,
        not on the file it came from: a ``[n]`` state file and its ``[n, 1]`` twin, or an
        ``.npz`` and its Minari copy, have the same fingerprint. The privacy ledger keys fqi
        releases on it. ``rewards_are_population_averages``, ``population`` and ``behaviour`` are
        declarations about the data, not data: they are left out.
        """
        if "fingerprint" not in self._cache:
            header = {
                "format": FORMAT,
                "n_actions": self.n_actions,
                "reward_range": [
                    float(self.reward_range[0]).hex(),
                    float(self.reward_range[1]).hex(),
                ],
                "env_id": self.env_id,
                "arrays": [
                    [name, getattr(self, name).dtype.str, list(getattr(self, name).shape)]
                    for name in _ARRAYS
                ],
            }
            h = hashlib.sha256()
            blob = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
            h.update(len(blob).to_bytes(8, "little"))
            h.update(blob)
            for name in _ARRAYS:
                arr = getattr(self, name)
                h.update(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes())
            self._cache["fingerprint"] = "sha256:" + h.hexdigest()
        return str(self._cache["fingerprint"])

    def summary(self) -> JSONObject:
        """What ``qveil dataset info`` prints: counts, the action histogram, reward ranges.

        Keys: ``users``, ``samples``, ``d``, ``n_actions``, ``actions`` (count per action),
        ``reward_range`` (declared [lo, hi]), ``reward_observed`` ([min, max] of r),
        ``terminals`` (rows with terminal), ``samples_per_user`` ({min, max}), ``env_id``,
        ``rewards_are_population_averages``, ``population``, ``behaviour``, ``fingerprint``.
        """
        _, per_user = np.unique(self.user, return_counts=True)
        return {
            "users": self.users,
            "samples": self.n,
            "d": self.d,
            "n_actions": self.n_actions,
            "actions": np.bincount(self.a, minlength=self.n_actions).tolist(),
            "reward_range": [float(self.reward_range[0]), float(self.reward_range[1])],
            "reward_observed": [float(self.r.min()), float(self.r.max())],
            "terminals": int(self.terminal.sum()),
            "samples_per_user": {"min": int(per_user.min()), "max": int(per_user.max())},
            "env_id": self.env_id,
            "rewards_are_population_averages": self.rewards_are_population_averages,
            "population": self.population,
            "behaviour": self.behaviour,
            "fingerprint": self.fingerprint(),
        }


# -- validation ----------------------------------------------------------------------------


def check_population_name(name: object) -> str:
    """A population name: 1 to 200 printable characters without surrounding spaces."""
    if (
        not isinstance(name, str)
        or not name
        or name != name.strip()
        or len(name) > 200
        or not name.isprintable()
    ):
        raise InvalidArgument(
            "a population name is 1 to 200 printable characters without surrounding spaces, "
            f"got {_echo(name)}"
        )
    return name


def _declared_flag(name: str, value: object) -> bool:
    """A declared boolean: ``True``/``False`` or a 0-d bool array (as an ``.npz`` holds it);
    anything else (1, "yes", an int array) is refused rather than read as truthy."""
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype == np.bool_:
        return bool(value.item())
    raise InvalidArgument(
        f"{name} must be a bool (or a 0-d bool array), got {_echo(value)} ({type(value).__name__})"
    )


def _check_metadata(n_actions: object, reward_range: object) -> tuple[int, tuple[float, float]]:
    if isinstance(n_actions, bool) or not isinstance(n_actions, int | np.integer):
        raise InvalidArgument(f"n_actions must be an integer, got {_echo(n_actions)}")
    if int(n_actions) < 1:
        raise InvalidArgument(f"n_actions must be >= 1, got {int(n_actions)}")
    try:
        lo, hi = (float(v) for v in reward_range)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"reward_range must be two numbers (low, high), got {_echo(reward_range)}"
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi:
        raise InvalidArgument(
            f"reward_range must be finite with low < high, got [{_num(lo)}, {_num(hi)}]"
        )
    return int(n_actions), (lo, hi)


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    """Index of the first True of ``mask`` (row-major), as a tuple."""
    flat = int(np.flatnonzero(mask.ravel())[0])
    return tuple(int(i) for i in np.unravel_index(flat, mask.shape))


def _where(name: str, index: tuple[int, ...]) -> str:
    return f"{name}[{', '.join(str(i) for i in index)}]"


def validate_arrays(
    arrays: Transitions, *, n_actions: object, reward_range: object
) -> tuple[Transitions, int, tuple[float, float]]:
    """Check a dataset's rows and metadata; return fresh copies of the rows with the checked
    metadata.

    :class:`Transitions` has checked the structure (dtypes, shapes, lengths). Refused here,
    each with :class:`InvalidArgument` naming the array and the first offending row: an
    empty dataset, NaN or inf in any float array, actions outside ``[0, n_actions)``, and
    rewards outside the declared ``reward_range``. The returned arrays are copies (the
    caller's are never modified or aliased).
    """
    n_act, (lo, hi) = _check_metadata(n_actions, reward_range)
    if arrays.n == 0:
        raise InvalidArgument("the dataset is empty (0 rows)")
    _check_values(arrays, n_act=n_act, reward_range=(lo, hi))
    return arrays.copy(), n_act, (lo, hi)


def _check_values(arrays: Transitions, *, n_act: int, reward_range: tuple[float, float]) -> None:
    """Non-finite floats first (a NaN reward is "not finite", not "out of range"), then
    actions outside [0, n_act) and rewards outside the declared range."""
    lo, hi = reward_range
    for name, arr in (("s", arrays.s), ("r", arrays.r), ("s2", arrays.s2)):
        bad = ~np.isfinite(arr)
        if bad.any():
            idx = _first_bad(bad)
            raise InvalidArgument(f"{_where(name, idx)} = {_num(arr[idx])} is not finite")
    act, rew = arrays.a, arrays.r
    bad = (act < 0) | (act >= n_act)
    if bad.any():
        i = _first_bad(bad)[0]
        raise InvalidArgument(f"a[{i}] = {int(act[i])} is outside the env's actions [0, {n_act})")
    bad = (rew < lo) | (rew > hi)
    if bad.any():
        i = _first_bad(bad)[0]
        raise InvalidArgument(
            f"r[{i}] = {_num(rew[i])} is outside the declared reward range [{_num(lo)}, {_num(hi)}]"
        )


def _resolve_range(
    declared: tuple[float, float] | None, given: tuple[float, float] | None, *, where: str
) -> tuple[float, float]:
    """The file's declared reward range, or the caller's; both present must agree."""
    if declared is not None and given is not None:
        if (float(given[0]), float(given[1])) != declared:
            raise InvalidArgument(
                f"{_echo(where)} declares the reward range [{_num(declared[0])}, "
                f"{_num(declared[1])}], not [{_num(given[0])}, {_num(given[1])}]"
            )
    rr = declared if declared is not None else given
    if rr is None:
        raise InvalidArgument(
            f"{_echo(where)} declares no reward range; give it (--reward-range LO,HI): "
            "the privacy guarantee rests on a public bound, never on the data"
        )
    return rr


def _resolve_actions(declared: int | None, given: int | None, *, where: str) -> int:
    """The file's declared action count, or the caller's; both present must agree."""
    if declared is not None and given is not None and int(given) != declared:
        raise InvalidArgument(
            f"{_echo(where)} declares {_echo(declared)} actions (n_actions), not {int(given)}"
        )
    n = declared if declared is not None else given
    if n is None:
        raise InvalidArgument(
            f"{_echo(where)} declares no action count: give n_actions in the file's metadata, "
            "or actions = N in the --config (the count is public: it must not come from the "
            "data)"
        )
    return n


#: A finite range that holds every finite reward: how :meth:`DatasetRows.summary` checks
#: the rows of a file that declares no range (the summary then shows none).
_ANY_RANGE = (-sys.float_info.max, sys.float_info.max)


@dataclass(frozen=True)
class DatasetRows:
    """A file's six arrays as read and what the file declares, before the caller's reward
    range and action count are applied (:mod:`qveil.dataset_npz`, :mod:`qveil.dataset_table`).

    ``where`` names the file in errors. ``n_actions`` and ``reward_range`` are None when the
    file declares none; :meth:`dataset` then takes the caller's (which must agree with a
    declared value), and :meth:`summary` describes the rows without them.
    """

    where: str
    arrays: Transitions
    n_actions: int | None = None
    reward_range: tuple[float, float] | None = None
    env_id: str | None = None
    population: str | None = None
    rewards_are_population_averages: bool = False
    behaviour: str | None = None

    def dataset(
        self, *, reward_range: tuple[float, float] | None = None, n_actions: int | None = None
    ) -> Dataset:
        """The validated :class:`Dataset` (the range and count: the file's, else the
        caller's; both given must agree; neither is an error naming how to give one)."""
        return Dataset.of(
            self.arrays,
            n_actions=_resolve_actions(self.n_actions, n_actions, where=self.where),
            reward_range=_resolve_range(self.reward_range, reward_range, where=self.where),
            env_id=self.env_id,
            rewards_are_population_averages=self.rewards_are_population_averages,
            population=self.population,
            behaviour=self.behaviour,
        )

    def summary(
        self, *, reward_range: tuple[float, float] | None = None, n_actions: int | None = None
    ) -> JSONObject:
        """:meth:`Dataset.summary` of :meth:`dataset`; a file that declares no reward range
        (none given either) gets ``reward_range`` None and no fingerprint (the fingerprint
        covers the range), one that declares no action count ``n_actions`` None and the
        histogram of the actions seen. Every other check of the rows still runs."""
        rr = reward_range if self.reward_range is None else self.reward_range
        n = n_actions if self.n_actions is None else self.n_actions
        if rr is not None and n is not None:
            return self.dataset(reward_range=reward_range, n_actions=n_actions).summary()
        a = np.asarray(self.arrays.a)
        seen = int(a.max()) + 1 if a.size and a.dtype.kind in "iu" else 1
        out = Dataset.of(
            self.arrays,
            n_actions=n if n is not None else max(1, seen),
            reward_range=rr if rr is not None else _ANY_RANGE,
            env_id=self.env_id,
            rewards_are_population_averages=self.rewards_are_population_averages,
            population=self.population,
            behaviour=self.behaviour,
        ).summary()
        if rr is None:
            out["reward_range"] = None
        if n is None:
            out["n_actions"] = None
        out["fingerprint"] = None
        return out
