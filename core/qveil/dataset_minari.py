"""Minari datasets (the offline-RL standard) as qveil datasets, both ways, offline only.

Locations (see :func:`qveil.dataset.load_dataset`, which dispatches here):

- a dataset directory ``ROOT/NAME-vN`` (the folder that holds ``data/metadata.json``); written
  with dataset id ``NAME-vN``, loadable by ``minari.load_dataset`` under
  ``MINARI_DATASETS_PATH=ROOT``;
- ``minari:DATASET_ID`` (e.g. ``minari:qveil/linewalk-v0``), resolved under Minari's own root:
  ``$MINARI_DATASETS_PATH``, default ``~/.minari/datasets``.

Nothing is downloaded: a dataset id that is not on disk is an error, never a hub fetch.

The user relation: each Minari episode is one user, unless its ``infos`` carry a ``user`` key,
whose value at the step's info (index t + 1 of the episode's T + 1 infos) owns transition t.
qveil writes that key, so a dataset with several episodes per user (``--episodes-per-user``)
survives the round trip with its users intact.

Rows become episodes in row order: a new episode starts at a new user, after a terminal row,
or where ``s`` is not the previous row's ``s2``; an episode that ends without a terminal row is
marked truncated. The public metadata that Minari has no field for (the declared reward range,
the env id, ``rewards_are_population_averages``, the fingerprint) is stored under the
``qveil`` key of Minari's ``metadata.json``; reading checks the fingerprint, so a lossy
conversion or an edited file is refused, not trained on. Storage is HDF5
(``minari[hdf5]``), observations float64, lossless.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, TypeAlias, overload  # Any: Storage, Episode (untyped)

import numpy as np

from qveil.dataset_types import (
    FORMAT,
    Dataset,
    _echo,
    _resolve_actions,
    _resolve_range,
    check_population_name,
)
from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, NotFound
from qveil.json_types import JSONObject

__all__ = ["declared_minari", "load_minari", "resolve_location", "save_minari"]

# components start with a letter or digit: no "..", no absolute paths, no hidden folders
_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]*/){0,2}[A-Za-z0-9][A-Za-z0-9_.-]*-v\d+$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*-v\d+$")

#: A ``minari.dataset.minari_storage.MinariStorage`` (a dataset's episodes and spaces).
Storage: TypeAlias = Any  # Minari ships no type information
#: A ``minari.EpisodeData`` (one episode's observations, actions, rewards, infos, id).
Episode: TypeAlias = Any  # Minari ships no type information


def _minari() -> ModuleType:
    try:
        # here, not at the top: Minari is an optional dependency (the trainer extra)
        import minari
        from minari.dataset.minari_storage import MinariStorage  # noqa: F401
    except ImportError as exc:
        raise FailedPrecondition(
            f"Minari datasets need {exc.name!r}: pip install 'qveil[trainer]'"
        ) from None
    module: ModuleType = minari  # its objects: Storage and Episode above
    return module


def resolve_location(location: str | os.PathLike[str]) -> tuple[Path, str]:
    """``(dataset directory, dataset id)`` for a Minari location (module docstring)."""
    text = os.fspath(location)
    if text.startswith("minari:"):
        dataset_id = text[len("minari:") :]
        if not _ID.match(dataset_id):
            raise InvalidArgument(
                f"bad Minari dataset id {_echo(dataset_id)}: expected "
                "[NAMESPACE/]NAME-vN, e.g. minari:qveil/linewalk-v0"
            )
        root = os.environ.get("MINARI_DATASETS_PATH") or os.path.join(
            os.path.expanduser("~"), ".minari", "datasets"
        )
        return Path(root) / dataset_id, dataset_id
    path = Path(text)
    if not _NAME.match(path.name):
        raise InvalidArgument(
            f"a Minari dataset directory is named NAME-vN (e.g. linewalk-v0), got {_echo(text)}"
        )
    return path, path.name


def _data_dir(directory: Path) -> Path:
    if (directory / "data" / "metadata.json").is_file():
        return directory / "data"
    if (directory / "metadata.json").is_file():  # given the data/ folder itself
        return directory
    raise NotFound(
        f"no Minari dataset at {_echo(str(directory))} (no data/metadata.json; "
        "nothing is downloaded)"
    )


@overload
def _open(
    location: str | os.PathLike[str], *, episodes: Literal[True]
) -> tuple[str, Storage, JSONObject]: ...
@overload
def _open(
    location: str | os.PathLike[str], *, episodes: Literal[False]
) -> tuple[str, None, JSONObject]: ...
def _open(
    location: str | os.PathLike[str], *, episodes: bool
) -> tuple[str, Storage | None, JSONObject]:
    """``(where, storage, raw metadata)`` of the local Minari dataset at ``location`` (a
    ``minari:`` id or a directory): ``storage`` is its ``MinariStorage`` when ``episodes``,
    else None (the metadata alone is read). An unreadable dataset is InvalidArgument."""
    _minari()
    from minari.dataset.minari_storage import MinariStorage  # optional dependency (_minari)

    text = os.fspath(location)
    directory = resolve_location(text)[0] if text.startswith("minari:") else Path(text)
    data = _data_dir(directory)
    try:
        storage = MinariStorage.read(data) if episodes else None
        meta: JSONObject = MinariStorage.read_raw_metadata(data)
    except Exception as exc:  # Minari raises ValueError/AssertionError/KeyError on bad files
        reason = str(exc).replace(str(data), "<path>")[:160]  # echo the path once, clipped
        raise InvalidArgument(
            f"{_echo(str(directory))} is not a readable Minari dataset: {reason}"
        ) from None
    return str(directory), storage, meta


def _qveil_meta(meta: JSONObject) -> JSONObject:
    """The ``qveil`` object of a dataset's metadata (empty when absent or not an object)."""
    q = meta.get("qveil")
    return q if isinstance(q, dict) else {}


def _declared_range(qmeta: JSONObject, where: str) -> tuple[float, float] | None:
    if "reward_range" not in qmeta:
        return None
    try:
        lo, hi = qmeta["reward_range"]
        return (float(lo), float(hi))
    except (TypeError, ValueError):
        raise InvalidArgument(f"{_echo(where)}: unreadable qveil reward_range") from None


def declared_minari(
    location: str | os.PathLike[str],
) -> tuple[str | None, tuple[float, float] | None]:
    """The population and reward range a Minari dataset declares (its qveil metadata alone;
    no episodes are read); None for each it does not declare."""
    where, _, meta = _open(location, episodes=False)
    qmeta = _qveil_meta(meta)
    name = qmeta.get("population")
    population = None if name is None else check_population_name(name)
    return population, _declared_range(qmeta, where)


def load_minari(
    location: str | os.PathLike[str],
    *,
    reward_range: tuple[float, float] | None = None,
    n_actions: int | None = None,
) -> Dataset:
    """Read a local Minari dataset as a :class:`Dataset` (users per the module docstring;
    ``reward_range`` where it declares none, ``n_actions`` must be its action space's)."""
    where, storage, meta = _open(location, episodes=True)
    from gymnasium import spaces  # optional dependency, installed with Minari (_minari)

    act_space, obs_space = storage.action_space, storage.observation_space
    if not isinstance(act_space, spaces.Discrete):
        raise InvalidArgument(
            f"{_echo(where)}: action space {type(act_space).__name__} is not Discrete"
        )
    if not isinstance(obs_space, spaces.Box):
        raise InvalidArgument(
            f"{_echo(where)}: observation space {type(obs_space).__name__} is not a Box"
        )
    start = int(act_space.start)
    n_act = _resolve_actions(int(act_space.n), n_actions, where=where)
    d = max(1, int(np.prod(obs_space.shape)))
    qmeta = _qveil_meta(meta)
    rr = _resolve_range(_declared_range(qmeta, where), reward_range, where=where)
    env_id = qmeta.get("env_id") if "qveil" in meta else _env_id_of(meta)

    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("user", "s", "a", "r", "s2", "t")}
    total = int(storage.total_episodes)
    for ep in storage.get_episodes(range(total)):
        for key, column in zip(
            ("user", "s", "s2", "a", "r", "t"), _episode_columns(ep, d, start, where), strict=True
        ):
            cols[key].append(column)
    if not total:
        raise InvalidArgument(f"{_echo(where)} holds no episodes")
    ds = Dataset(
        user=np.concatenate(cols["user"]),
        s=np.concatenate(cols["s"]),
        a=np.concatenate(cols["a"]),
        r=np.concatenate(cols["r"]),
        s2=np.concatenate(cols["s2"]),
        terminal=np.concatenate(cols["t"]),
        n_actions=n_act,
        reward_range=rr,
        env_id=env_id if isinstance(env_id, str) and env_id else None,
        rewards_are_population_averages=qmeta.get("rewards_are_population_averages", False),
        population=qmeta.get("population"),
    )
    stored = qmeta.get("fingerprint")
    if stored is not None and stored != ds.fingerprint():
        raise IntegrityError(
            f"{_echo(where)}: the data's fingerprint {ds.fingerprint()} differs from the one "
            f"qveil wrote ({str(stored)[:80]}): the file was changed after it was written"
        )
    return ds


def _episode_columns(
    ep: Episode, d: int, start: int, where: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One Minari episode as (user, s, s2, a, r, terminal) rows: users from
    ``infos['user']`` (one per step) or the episode id, actions shifted to start at 0."""
    obs = np.asarray(ep["observations"], dtype=np.float64)
    steps = int(np.asarray(ep["rewards"]).shape[0])
    if obs.shape[0] != steps + 1:
        raise InvalidArgument(
            f"{_echo(where)}: episode {ep['id']} has {obs.shape[0]} observations for "
            f"{steps} steps (Minari stores steps + 1)"
        )
    obs = obs.reshape(steps + 1, d)
    infos = ep.get("infos") or {}
    if "user" in infos:
        u = np.asarray(infos["user"])
        if u.shape[0] == steps + 1:
            u = u[1:]
        if u.shape != (steps,) or u.dtype.kind not in "iu":
            raise InvalidArgument(
                f"{_echo(where)}: episode {ep['id']}: infos['user'] must be integers, one "
                f"per step, got dtype {u.dtype} shape {tuple(u.shape)}"
            )
    else:
        u = np.full(steps, int(ep["id"]), dtype=np.int64)
    acts = np.asarray(ep["actions"])
    if acts.dtype.kind in "iu":
        acts = acts.reshape(steps).astype(np.int64) - start
    return (
        u,
        obs[:-1],
        obs[1:],
        acts,
        np.asarray(ep["rewards"]),
        np.asarray(ep["terminations"]),
    )


def _env_id_of(meta: JSONObject) -> str | None:
    spec = meta.get("env_spec")
    if not isinstance(spec, str):
        return None
    try:
        value = json.loads(spec).get("id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def _episodes(ds: Dataset) -> list[tuple[int, int]]:
    """[start, stop) row ranges of the episodes (module docstring: where one starts)."""
    n = ds.n
    new = np.zeros(n, dtype=bool)
    new[0] = True
    new[1:] |= ds.user[1:] != ds.user[:-1]
    new[1:] |= ds.terminal[:-1]
    new[1:] |= np.any(ds.s[1:] != ds.s2[:-1], axis=1)
    starts = np.flatnonzero(new)
    stops = np.append(starts[1:], n)
    return list(zip(starts.tolist(), stops.tolist(), strict=True))


def save_minari(ds: Dataset, location: str | os.PathLike[str]) -> None:
    """Write ``ds`` as a new Minari dataset (HDF5); an existing dataset is never replaced.

    Written into a temporary directory beside the target and renamed into place, so a failure
    leaves nothing behind and a reader never sees half a dataset.
    """
    minari = _minari()
    # here, not at the top: optional dependencies, checked by _minari
    from gymnasium import spaces
    from minari.data_collector import EpisodeBuffer
    from minari.dataset.minari_storage import MinariStorage

    directory, dataset_id = resolve_location(location)
    if directory.exists():
        raise FailedPrecondition(
            f"{_echo(str(directory))} already exists; a Minari dataset is never overwritten"
        )
    # absolute: Minari's storage joins a relative path onto itself
    directory = Path(os.path.abspath(directory))
    parent = directory.parent
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a Minari dataset is a directory
    tmp = parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        storage = MinariStorage.new(
            tmp / "data",
            observation_space=spaces.Box(-np.inf, np.inf, shape=(ds.d,), dtype=np.float64),
            action_space=spaces.Discrete(ds.n_actions),
            data_format="hdf5",
        )
        buffers = []
        for k, (lo, hi) in enumerate(_episodes(ds)):
            steps = hi - lo
            obs = np.concatenate([ds.s[lo:hi], ds.s2[hi - 1 : hi]])
            truncated = np.zeros(steps, dtype=bool)
            truncated[-1] = not bool(ds.terminal[hi - 1])
            buffers.append(
                EpisodeBuffer(
                    id=k,
                    observations=obs,
                    actions=np.array(ds.a[lo:hi]),
                    rewards=np.array(ds.r[lo:hi]),
                    terminations=np.array(ds.terminal[lo:hi]),
                    truncations=truncated,
                    infos={"user": np.concatenate([ds.user[lo : lo + 1], ds.user[lo:hi]])},
                )
            )
        storage.update_episodes(buffers)
        storage.update_metadata(
            {
                "dataset_id": dataset_id,
                "minari_version": str(minari.__version__),
                "description": (
                    "Written by qveil: one user's transitions per infos['user']; the declared "
                    "reward range is under the 'qveil' key."
                ),
                "qveil": {
                    "format": FORMAT,
                    "reward_range": [float(ds.reward_range[0]), float(ds.reward_range[1])],
                    "env_id": ds.env_id,
                    "rewards_are_population_averages": ds.rewards_are_population_averages,
                    "population": ds.population,
                    "fingerprint": ds.fingerprint(),
                },
            }
        )
        os.replace(tmp, directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
