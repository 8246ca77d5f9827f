"""The kernel fit and the collection as map-reduce tasks on Dask distributed.

**Shards.** A shard is a run of whole users: shard k holds the users k * S .. (k + 1) * S - 1
in increasing user order (S = ``shard_users``; :meth:`qveil.transitions.Transitions.shards`).
For a Parquet dataset the shards are its row groups, which the writer cuts the same way
(:mod:`qveil.dataset_parquet`), and each task reads its own row group (the file must be
readable at the same path by every worker: one machine, or a shared file system). A user's rows
are never in two shards: the per-user averages of equation (1) (:mod:`qveil.kfqi`) are complete
within a shard, and the privacy unit (one user's whole data) stays inside one task.

**Map.** :func:`qveil.kfqi.shard_sums` on each shard (pure: arrays in, arrays out): every
action's reward sums, covered counts and sparse P before the division by N. **Reduce.** The
shards' sums are added in the fixed binary tree of :func:`qveil.kfqi.fold_tree` (pairs in
shard order), each addition a task. The tree depends on the shard count only, so the
operators are the same bits whatever the worker count, in process (``workers = 1``: the
same functions called in this process) or on a cluster. With one shard (N <= S) they are
exactly the single-process operators of :func:`qveil.kfqi.build_operators_nd`. The ``reward``
relation first reduces the shards' pooled denominators the same way.

**What stays local.** The T iterations run on the reduced K x K sparse operators (K anchors:
1296 for CartPole) in the driver: one iteration costs a few milliseconds, less than shipping
the operators to a task, and does not grow with N. The subspace KRR is local too.

**Failures.** A task whose worker dies is recomputed elsewhere by the scheduler (its inputs
are re-read or recomputed); tasks are also retried twice on errors. Each task is a pure
function of its shard, so a recomputed task gives the same bits and the release is unchanged.

**Collection** (:func:`collect_parquet`): shard k's users are collected by one task (user u's
episodes seeded from (seed, u) exactly as :func:`qveil.trainer.collect.collect`) and written
as row groups in shard order, so a seed gives the same file, bit for bit, whatever the worker
count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NotRequired, TypeAlias, TypedDict, TypeVar  # Any: the Dask aliases

import numpy as np
import numpy.typing as npt

from qveil.additive import StateBox
from qveil.dataset import Dataset
from qveil.dataset_parquet import USERS_PER_GROUP, ParquetDatasetWriter, ParquetSource
from qveil.errors import FailedPrecondition, InvalidArgument, echo
from qveil.json_types import JSONObject
from qveil.kfqi import (
    KernelFQIOperators,
    KernelFQISpec,
    ShardSums,
    add_shard_sums,
    fold_tree,
    operators_from_sums,
    shard_denominators,
    shard_sums,
)
from qveil.trainer.behaviour import Behaviour
from qveil.trainer.collect import collect
from qveil.trainer.progress import Progress, progress
from qveil.training_data import TrainingData
from qveil.transitions import Transitions

FloatArray = npt.NDArray[np.float64]

#: A ``distributed.Client`` (or a ``LocalCluster``'s).
DaskClient: TypeAlias = Any  # distributed is read as untyped (pyproject: follow_imports skip)
#: A ``distributed.Future``: a submitted task's result, held by the cluster.
DaskFuture: TypeAlias = Any  # distributed is read as untyped (pyproject: follow_imports skip)

_T = TypeVar("_T")
#: A task: a function and its positional arguments (the function's parameters check them).
_Task: TypeAlias = tuple[Callable[..., _T], tuple[object, ...]]
#: A shard of a fit: a Parquet file's row group (its index), or an in-memory shard.
_Shard: TypeAlias = int | Transitions


class _ShardOptions(TypedDict):
    """The keyword arguments of :func:`qveil.kfqi.shard_denominators`."""

    n_actions: int
    box: StateBox
    spec: KernelFQISpec


class _DenPool(TypedDict):
    """The pooled denominators a ``reward``-relation fit passes to every shard's sums."""

    den_pool: NotRequired[FloatArray]


class _SumsOptions(_ShardOptions, _DenPool):
    """The keyword arguments of :func:`qveil.kfqi.shard_sums`."""

    reward_range: tuple[float, float]


class _CollectOptions(TypedDict):
    """The keyword arguments of a shard's :func:`qveil.trainer.collect.collect`."""

    episodes_per_user: int
    reward_range: tuple[float, float] | None
    clip_rewards: bool
    behaviour: Behaviour | None


class _ShardMeta(TypedDict):
    """What a collected shard says of its dataset (the Parquet writer's arguments)."""

    n_actions: int
    reward_range: tuple[float, float]
    d: int
    behaviour: str | None


__all__ = [
    "Engine",
    "FitSums",
    "collect_parquet",
    "fit_operators",
    "open_client",
    "shard_progress",
]

#: Retries of a task that raised (a lost worker's tasks are recomputed regardless).
RETRIES = 2
#: Dask's config of the environment its nanny gives a worker process before it starts.
PRE_SPAWN = "distributed.nanny.pre-spawn-environ"


@dataclass(frozen=True)
class Engine:
    """Where the map-reduce runs: ``workers`` local worker processes (1: in this process,
    no cluster), or the running Dask scheduler at ``cluster`` (``tcp://HOST:PORT``);
    ``shard_users`` users per shard of an in-memory dataset (Parquet files use their row
    groups); ``progress``: one update per shard done (:func:`shard_progress`)."""

    workers: int = 1
    cluster: str | None = None
    shard_users: int = USERS_PER_GROUP
    progress: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int):
            raise InvalidArgument(f"--workers must be an integer >= 1, got {self.workers!r}")
        if self.workers < 1:
            raise InvalidArgument(f"--workers must be an integer >= 1, got {self.workers}")
        if self.cluster is not None and self.workers != 1:
            raise InvalidArgument("give --workers N (a local cluster) or --cluster ADDRESS")
        if self.cluster is not None and not self.cluster.strip():
            raise InvalidArgument("--cluster needs the scheduler's address (tcp://HOST:PORT)")
        if isinstance(self.shard_users, bool) or self.shard_users < 1:
            raise InvalidArgument(f"shard_users must be >= 1, got {self.shard_users!r}")

    @property
    def local(self) -> bool:
        """True when everything runs in this process (no cluster)."""
        return self.cluster is None and self.workers == 1


@contextmanager
def open_client(engine: Engine) -> Iterator[DaskClient | None]:
    """A ``distributed.Client`` for ``engine`` (None for the in-process engine). A local
    cluster (``workers`` processes of one thread each, no dashboard) is started here and
    stopped on exit; an attached cluster is left running."""
    if engine.local:
        yield None
        return
    try:
        # Dask (the trainer's optional distributed engine) loads only when a fit runs on it
        from distributed import Client, LocalCluster
    except ImportError:
        raise FailedPrecondition(
            "--workers and --cluster need Dask distributed: pip install 'qveil[trainer]'"
        ) from None
    if engine.cluster is not None:
        try:
            client = Client(engine.cluster, timeout="20s")
        except (OSError, TimeoutError) as exc:
            raise FailedPrecondition(
                f"cannot reach the Dask scheduler at {echo(engine.cluster)}: {str(exc)[:120]}"
            ) from None
        try:
            yield client
        finally:
            client.close()
        return
    # Dask (the trainer's optional distributed engine) loads only when a fit runs on it
    import dask

    # Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which also fixes glibc's
    # mmap threshold at 128 KiB: every large temporary of a shard's build is then a fresh
    # mmap, and a worker takes 16x the page faults and about 1.6x the CPU of the same shard
    # in this process. The workers keep glibc's defaults (as this process), and one thread
    # each for BLAS/OpenMP (Dask's default: a worker's one task thread).
    with dask.config.set({f"{PRE_SPAWN}.MALLOC_TRIM_THRESHOLD_": None}):
        cluster = LocalCluster(
            n_workers=engine.workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        )
    try:
        client = Client(cluster)
        try:
            yield client
        finally:
            client.close()
    finally:
        cluster.close()


@dataclass(frozen=True)
class FitSums:
    """The reduced operators and what the fit counted while building them."""

    operators: KernelFQIOperators
    users: int
    samples: int
    clipped: int
    shards: int


def shard_progress(total: int, *, desc: str, enabled: bool) -> Progress:
    """Progress per shard (:func:`qveil.trainer.progress.progress`): a tqdm bar on a
    terminal, else a stderr line per tenth of the shards done or every few seconds; nothing
    when not ``enabled``."""
    return progress(total, desc=desc, unit="shard", enabled=enabled)


# --------------------------------------------------------------------------- the tasks
def _memory_sums(shard: Transitions, kw: _SumsOptions) -> ShardSums:
    return shard_sums(shard, **kw)


def _memory_denominators(shard: Transitions, kw: _ShardOptions) -> FloatArray:
    return shard_denominators(shard, **kw)


def _parquet_group(path: str, group: int) -> Transitions:
    return ParquetSource(path).read_group(group)


def _parquet_sums(path: str, group: int, kw: _SumsOptions) -> ShardSums:
    return shard_sums(_parquet_group(path, group), **kw)


def _parquet_denominators(path: str, group: int, kw: _ShardOptions) -> FloatArray:
    return shard_denominators(_parquet_group(path, group), **kw)


def _add_arrays(left: FloatArray, right: FloatArray) -> FloatArray:
    return left + right


# --------------------------------------------------------------------------- the driver
def _map_reduce(
    client: DaskClient | None,
    tasks: list[_Task[_T]],
    *,
    add: Callable[[_T, _T], _T],
    progress: bool,
    desc: str,
) -> _T:
    """fold_tree(add) over the tasks' results: in this process (client None) or as tasks
    (each map and each addition one task; the whole tree submitted at once)."""
    bar = shard_progress(len(tasks), desc=desc, enabled=progress)
    with bar:
        if client is None:

            def run_local() -> Iterator[_T]:
                for fn, args in tasks:
                    out = fn(*args)
                    bar.update(1)
                    yield out

            return fold_tree(run_local(), add)
        # Dask (the trainer's optional distributed engine) loads only when a fit runs on it
        from distributed import as_completed

        mapped: list[DaskFuture] = []

        def submit_maps() -> Iterator[DaskFuture]:
            for fn, args in tasks:
                fut = client.submit(fn, *args, pure=False, retries=RETRIES)
                mapped.append(fut)
                yield fut

        root = fold_tree(
            submit_maps(),
            lambda a, b: client.submit(add, a, b, pure=False, retries=RETRIES),
        )
        # as_completed holds each map future until it is yielded; the driver keeps none, so
        # a shard's sums are released as soon as its addition has consumed them (holding
        # every shard's sums until the end would cost shards x the sums' size)
        done = as_completed(mapped)
        mapped.clear()
        for fut in done:
            bar.update(1)
            del fut
        total: _T = root.result()
        return total


def fit_operators(
    data: TrainingData,
    *,
    n_actions: int,
    reward_range: tuple[float, float],
    box: StateBox,
    spec: KernelFQISpec,
    engine: Engine,
) -> FitSums:
    """The operators of equation (1) of ``data`` (a :class:`qveil.dataset.Dataset` or a
    :class:`qveil.dataset_parquet.ParquetSource`), built shard by shard on ``engine``."""
    kw: _ShardOptions = {"n_actions": int(n_actions), "box": box, "spec": spec}
    with open_client(engine) as client:
        if isinstance(data, ParquetSource):
            path = str(data.path.resolve())
            shards: list[_Shard] = list(range(data.groups))

            def sums_task(g: _Shard, den: _DenPool) -> _Task[ShardSums]:
                opts: _SumsOptions = {**kw, "reward_range": reward_range, **den}
                return _parquet_sums, (path, g, opts)

            def den_task(g: _Shard) -> _Task[FloatArray]:
                return _parquet_denominators, (path, g, kw)
        elif isinstance(data, Dataset):
            # each task carries its shard (held by the scheduler, so a task lost with its
            # worker is recomputed elsewhere); large datasets belong in Parquet files, read
            # by the tasks themselves
            shards = list(data.transitions.shards(engine.shard_users))

            def sums_task(g: _Shard, den: _DenPool) -> _Task[ShardSums]:
                opts: _SumsOptions = {**kw, "reward_range": reward_range, **den}
                return _memory_sums, (g, opts)

            def den_task(g: _Shard) -> _Task[FloatArray]:
                return _memory_denominators, (g, kw)
        else:
            raise InvalidArgument(
                f"a fit reads a Dataset or a ParquetSource, not {type(data).__name__}"
            )

        den_pool = None
        if spec.neighbour != "user":
            den_pool = _map_reduce(
                client,
                [den_task(sh) for sh in shards],
                add=_add_arrays,
                progress=engine.progress,
                desc="denominators",
            )
        extra: _DenPool = {} if den_pool is None else {"den_pool": den_pool}
        total = _map_reduce(
            client,
            [sums_task(sh, extra) for sh in shards],
            add=add_shard_sums,
            progress=engine.progress,
            desc="fit shards",
        )
    ops = operators_from_sums(total, spec=spec, reward_range=reward_range, den_pool=den_pool)
    return FitSums(
        operators=ops,
        users=int(total.users),
        samples=int(total.samples),
        clipped=int(total.clipped),
        shards=len(shards),
    )


# --------------------------------------------------------------------------- collection
def _in_order(client: DaskClient, tasks: list[_Task[_T]]) -> Iterator[_T]:
    """The tasks' results in task order, with at most two tasks per worker thread in
    flight: a result is released once yielded, so the cluster holds a bounded number of
    shards however many there are (collected shards are large: all of them held at once
    would be the whole dataset in the workers' memory)."""

    threads = sum(w.get("nthreads", 1) for w in client.scheduler_info()["workers"].values())
    window = max(2, 2 * threads)
    pending: deque[DaskFuture] = deque()
    queue = iter(tasks)

    def top_up() -> None:
        while len(pending) < window:
            nxt = next(queue, None)
            if nxt is None:
                return
            fn, args = nxt
            pending.append(client.submit(fn, *args, pure=False, retries=RETRIES))

    top_up()
    while pending:
        fut = pending.popleft()
        out = fut.result()
        fut.release()
        top_up()
        yield out


def _collect_shard(
    env_id: str, first_user: int, users: int, seed: int, opts: _CollectOptions
) -> tuple[Transitions, _ShardMeta]:
    ds = collect(env_id, users, seed, first_user=first_user, **opts)
    meta: _ShardMeta = {
        "n_actions": ds.n_actions,
        "reward_range": ds.reward_range,
        "d": ds.d,
        "behaviour": ds.behaviour,
    }
    return ds.transitions, meta


def collect_parquet(
    env_id: str,
    users: int,
    seed: int,
    out: str,
    *,
    episodes_per_user: int = 1,
    reward_range: tuple[float, float] | None = None,
    clip_rewards: bool = False,
    population: str | None = None,
    rewards_are_population_averages: bool = False,
    force: bool = False,
    engine: Engine | None = None,
    behaviour: Behaviour | None = None,
) -> JSONObject:
    """Collect ``users`` users into the Parquet dataset ``out``, one task per shard of
    ``engine.shard_users`` users, written in shard order (the same seed gives the same
    file whatever the worker count). ``behaviour``: the behaviour policy (default uniformly
    random). Returns the file's summary."""
    engine = engine or Engine()
    if users < 1:
        raise InvalidArgument(f"users must be >= 1, got {users}")
    opts: _CollectOptions = {
        "episodes_per_user": episodes_per_user,
        "reward_range": reward_range,
        "clip_rewards": clip_rewards,
        "behaviour": behaviour,
    }
    bounds = list(range(0, users, engine.shard_users)) + [users]
    jobs = [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(len(bounds) - 1)]
    writer: ParquetDatasetWriter | None = None
    bar = shard_progress(len(jobs), desc="collect", enabled=engine.progress)
    try:
        with open_client(engine) as client, bar:
            if client is None:
                results: Iterator[tuple[Transitions, _ShardMeta]] = (
                    _collect_shard(env_id, u0, n, seed, opts) for u0, n in jobs
                )
            else:
                results = _in_order(
                    client,
                    [(_collect_shard, (env_id, u0, n, seed, opts)) for u0, n in jobs],
                )
            for arrays, meta in results:
                if writer is None:
                    writer = ParquetDatasetWriter(
                        out,
                        d=meta["d"],
                        n_actions=meta["n_actions"],
                        reward_range=meta["reward_range"],
                        env_id=env_id,
                        population=population,
                        rewards_are_population_averages=rewards_are_population_averages,
                        users_per_group=engine.shard_users,
                        force=force,
                        behaviour=meta["behaviour"],
                    )
                writer.write(arrays)
                bar.update(1)
        assert writer is not None
        return writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
