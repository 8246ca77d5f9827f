"""The plain dataset format: one uncompressed ``.npz`` (``numpy.savez``), read with
``allow_pickle=False``. :func:`save_npz` documents its arrays; files written by other tools
may leave out ``format``, ``n_actions`` and the reward range (the caller then gives them).
Needs only numpy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.lib.npyio import NpzFile

from qveil.dataset_types import (
    ECHO,
    FORMAT,
    Dataset,
    DatasetRows,
    _declared_flag,
    _echo,
    check_population_name,
)
from qveil.errors import InvalidArgument, NotFound
from qveil.npz_file import write_npz_atomic
from qveil.transitions import ARRAYS, Transitions

__all__ = ["declared_npz", "load_npz", "npz_users", "read_npz", "save_npz"]

#: The first bytes of a zip archive (an ``.npz``): a local file header, or an empty archive.
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def save_npz(ds: Dataset, path: str | os.PathLike[str]) -> None:
    """Write the plain format: one uncompressed ``.npz`` with these arrays.

    ``user`` int64 [n], ``s`` float64 [n, d], ``a`` int64 [n], ``r`` float64 [n], ``s2`` float64
    [n, d], ``terminal`` bool [n], and the metadata as 0-d arrays: ``format`` (str,
    ``"qveil-dataset/1"``), ``n_actions`` (int64), ``reward_low`` and ``reward_high`` (float64,
    the declared range), ``env_id`` (str; absent when unknown) and
    ``rewards_are_population_averages`` (bool; written only when True, absent means False)
    and ``population`` (str; the declared population, absent when none) and ``behaviour``
    (str; the declared behaviour policy, absent when none).
    Readers accept ``s``/``s2`` of shape [n] for d = 1 and no ``format`` key (files written by
    other tools).
    """
    out = Path(os.fspath(path))
    if out.suffix != ".npz":
        raise InvalidArgument(f"an npz dataset path must end in .npz, got {_echo(str(out))}")
    if not out.parent.is_dir():
        raise NotFound(f"directory {_echo(str(out.parent))} does not exist")
    meta: dict[str, np.ndarray] = {
        "format": np.array(FORMAT),
        "n_actions": np.array(ds.n_actions, dtype=np.int64),
        "reward_low": np.array(ds.reward_range[0], dtype=np.float64),
        "reward_high": np.array(ds.reward_range[1], dtype=np.float64),
    }
    if ds.env_id is not None:
        meta["env_id"] = np.array(ds.env_id)
    if ds.rewards_are_population_averages:
        meta["rewards_are_population_averages"] = np.array(True)
    if ds.population is not None:
        meta["population"] = np.array(ds.population)
    if ds.behaviour is not None:
        meta["behaviour"] = np.array(ds.behaviour)
    arrays: dict[str, np.ndarray] = ds.transitions.columns()
    write_npz_atomic(out, {**arrays, **meta})


def _scalar(name: str, value: np.ndarray, kind: str) -> np.ndarray:
    """``value``, checked to be a 0-d array of a dtype kind in ``kind``."""
    if value.shape != () or value.dtype.kind not in kind:
        raise InvalidArgument(
            f"metadata {name} must be a scalar of kind {kind!r}, got dtype {value.dtype} "
            f"shape {tuple(value.shape)}"
        )
    return value


def _text(name: str, value: np.ndarray) -> str:
    """The string of a 0-d str array (its ``.item()`` is a str)."""
    return str(_scalar(name, value, "U").item())


def _int(name: str, value: np.ndarray) -> int:
    """The integer of a 0-d integer array (its ``.item()`` is an int)."""
    return int(_scalar(name, value, "iu").item())


def _float(name: str, value: np.ndarray) -> float:
    """The number of a 0-d float or integer array, as a float."""
    return float(_scalar(name, value, "fiu").item())


def _open(p: Path) -> NpzFile[np.generic]:
    """``np.load`` of an existing zip archive; anything else (a CSV or a pickle named
    ``.npz``) is refused with what the file looks like, not numpy's pickle message."""
    try:
        found = p.is_file()
    except OSError:  # e.g. a name too long for the file system
        found = False
    if not found:
        raise NotFound(f"dataset file {_echo(str(p))} does not exist")
    with open(p, "rb") as fh:
        head = fh.read(256)
    if not head.startswith(_ZIP_MAGIC):
        line = head.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
        text = bool(line) and line.isprintable()
        looks = (
            f"it looks like CSV text (first line {_echo(line)}): a CSV dataset is read as PATH.csv"
            if text and "," in line
            else f"it starts with {_echo(line) if text else repr(head[:8])}"
        )
        raise InvalidArgument(
            f"{_echo(str(p))} is not an .npz file (an .npz is a zip archive of .npy arrays); "
            f"{looks} (docs/datasets.md)"
        )
    try:
        z: NpzFile[np.generic] = np.load(p, allow_pickle=False)  # of a zip archive: an NpzFile
        return z
    except (OSError, ValueError, EOFError) as exc:
        raise InvalidArgument(
            f"{_echo(str(p))} is not a readable .npz dataset: "
            f"{str(exc).replace(str(p), '<path>')[:ECHO]}"
        ) from None


def _reward_range(data: Mapping[str, np.ndarray]) -> tuple[float, float] | None:
    if "reward_low" not in data and "reward_high" not in data:
        return None
    if "reward_low" not in data or "reward_high" not in data:
        raise InvalidArgument("give both reward_low and reward_high, or neither")
    return _float("reward_low", data["reward_low"]), _float("reward_high", data["reward_high"])


def read_npz(path: str | os.PathLike[str]) -> DatasetRows:
    """The rows and declarations of an ``.npz`` dataset (validated by
    :meth:`~qveil.dataset_types.DatasetRows.dataset`)."""
    p = Path(os.fspath(path))
    with _open(p) as z:
        try:
            data = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError) as exc:
            raise InvalidArgument(
                f"{_echo(str(p))} is not a readable .npz dataset: "
                f"{str(exc).replace(str(p), '<path>')[:ECHO]}"
            ) from None
    missing = [k for k in ARRAYS if k not in data]
    if missing:
        raise InvalidArgument(
            f"{_echo(str(p))} lacks the array(s) {', '.join(missing)} (needs {', '.join(ARRAYS)})"
        )
    if "format" in data and _text("format", data["format"]) != FORMAT:
        raise InvalidArgument(
            f"unsupported dataset format {_echo(str(data['format']))} (this qveil reads {FORMAT})"
        )
    n_actions = _int("n_actions", data["n_actions"]) if "n_actions" in data else None
    population = _text("population", data["population"]) if "population" in data else None
    flag = data.get("rewards_are_population_averages", np.array(False))
    return DatasetRows(
        where=str(p),
        arrays=Transitions.of(data),
        n_actions=n_actions,
        reward_range=_reward_range(data),
        env_id=_text("env_id", data["env_id"]) if "env_id" in data else None,
        population=population,
        rewards_are_population_averages=_declared_flag("rewards_are_population_averages", flag),
        behaviour=_text("behaviour", data["behaviour"]) if "behaviour" in data else None,
    )


def load_npz(
    path: str | os.PathLike[str],
    *,
    reward_range: tuple[float, float] | None = None,
    n_actions: int | None = None,
) -> Dataset:
    """Read the plain format written by :func:`save_npz` and validate it.

    ``reward_range`` and ``n_actions`` are needed only when the file has no
    ``reward_low``/``reward_high`` or no ``n_actions``; when both are present they must
    agree (a mismatch is an error, not a silent override).
    """
    return read_npz(path).dataset(reward_range=reward_range, n_actions=n_actions)


def declared_npz(
    path: str | os.PathLike[str],
) -> tuple[str | None, tuple[float, float] | None, int | None]:
    """The population, reward range and action count an ``.npz`` declares (its metadata
    members alone: no row array is read); None for each it does not declare."""
    p = Path(os.fspath(path))
    with _open(p) as z:
        try:
            meta = {k: z[k] for k in z.files if k not in ARRAYS}
        except (OSError, ValueError, EOFError) as exc:
            raise InvalidArgument(
                f"{_echo(str(p))} is not a readable .npz dataset: {str(exc)[:ECHO]}"
            ) from None
    name = meta.get("population")
    population = None if name is None else check_population_name(_text("population", name))
    n = meta.get("n_actions")
    return population, _reward_range(meta), None if n is None else _int("n_actions", n)


def npz_users(path: str | os.PathLike[str]) -> int:
    """The number of distinct users of an ``.npz``, from its ``user`` array alone."""
    p = Path(os.fspath(path))
    with _open(p) as z:
        if "user" not in z.files:
            raise InvalidArgument(f"{_echo(str(p))} lacks the array user")
        try:
            return int(np.unique(z["user"]).size)
        except (OSError, ValueError, EOFError) as exc:
            raise InvalidArgument(
                f"{_echo(str(p))} is not a readable .npz dataset: {str(exc)[:ECHO]}"
            ) from None
