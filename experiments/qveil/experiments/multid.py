"""``qveil experiments multid``: the kernel fqi release for states with d coordinates,
measured THROUGH THE SERVER: CartPole-v1 (d = 4, 2 actions), Acrobot-v1 (d = 6, 3 actions),
LunarLander-v3, Reach16 and MountainCar-v0 (d = 2, 3 actions).

For each environment, number of users N and dataset seed: collect N users with one episode
each under the config's public behaviour policy (``behaviour_policy``, uniformly random
unless the config names another: MountainCar's is the epsilon-greedy energy heuristic;
:func:`qveil.trainer.collect.collect`) and fit the kernel FQI + subspace
KRR ONCE (:func:`qveil.trainer.kfqi.fit_kernel`, public config configs/<env>-private.toml).
Then, on the same E episode seeds for every policy (common random numbers, so differences
between policies are not episode luck):

* the ceiling: the fitted mean without noise, greedy, in process (not a release);
* the floor: the uniformly random policy;
* the private release at each epsilon (delta 1e-5, user relation), R times: each time a new
  release bundle of the fit is written (:func:`qveil.trainer.kfqi.write_kernel_release`: its
  own release id and fingerprint, sigma from the kernel accountant for that epsilon), served
  by the real server (:class:`qveil.server.local.LocalServer`: gRPC on 127.0.0.1 port 0, a
  fresh SQLite store file, release noise from OS entropy, never seeded), and the E episodes
  are played in lockstep with every action from ``GetBestActions`` on [n, d] states
  (:func:`qveil.trainer.served_eval.lockstep_returns`).

Each release's utility is measured separately: the R releases of a cell are independent
repetitions of the experiment (R noise draws), not a composition; publishing them all would
compose their privacy costs. Per cell: the mean return over R x E, the minimum and maximum
over releases, and "fraction" = (private - random) / (ceiling - random), with a bootstrap
standard error and 95% interval over releases and episodes (:func:`fraction_bootstrap`).
The server's own counters (states answered, new noise points logged) are recorded per
release, so the table shows that every private action came from the server.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np
import numpy.typing as npt

from qveil.client import ValueClient
from qveil.dataset import Dataset
from qveil.dataset_parquet import ParquetSource
from qveil.experiments._util import write_csv
from qveil.json_types import JSONObject
from qveil.kfqi_config import KernelFQIConfig, read_fqi_toml
from qveil.server.governance.release_records import charge_simulated
from qveil.server.local import LocalServer

if TYPE_CHECKING:  # for annotations only: loads gymnasium
    from qveil.trainer.kfqi import KernelFit

__all__ = [
    "EPSILONS",
    "ENVS",
    "fraction_bootstrap",
    "load_config",
    "run",
    "run_point",
    "served_release_returns",
]

ROOT = Path(__file__).resolve().parents[3]
ENVS = {
    "CartPole-v1": ROOT / "configs" / "cartpole-private.toml",
    "Acrobot-v1": ROOT / "configs" / "acrobot-private.toml",
    "LunarLander-v3": ROOT / "configs" / "lunarlander-private.toml",
    "qveil/Reach16-v0": ROOT / "configs" / "reach16-private.toml",
    "MountainCar-v0": ROOT / "configs" / "mountaincar-private.toml",
}
EPSILONS = (0.5, 1.0, 2.0, 4.0)
DELTA = 1e-5
#: first environment seed of the scored episodes (episode i: EVAL_SEED + 1000 seed + i);
#: far from collect's seeds, so scoring never replays a training episode's start
EVAL_SEED = 10_000


def load_config(env_id: str, **changes: object) -> KernelFQIConfig:
    """The public :class:`qveil.kfqi_config.KernelFQIConfig` of ``env_id`` (delta 1e-5)."""
    d = read_fqi_toml(ENVS[env_id])
    d.update({"delta": DELTA, **changes})
    return KernelFQIConfig.from_dict(d)


def fraction_bootstrap(
    private: npt.ArrayLike,
    ceiling: npt.ArrayLike,
    floor: npt.ArrayLike,
    *,
    reps: int = 2000,
    rng: np.random.Generator,
) -> dict[str, float]:
    """Point estimate, bootstrap standard error and 95% percentile interval of
    (mean private - mean floor) / (mean ceiling - mean floor).

    ``private`` is (R releases, E episodes); ``ceiling`` and ``floor`` are (E,) on the same
    episode seeds. The design is crossed (releases x episodes), so each replicate resamples
    releases and episodes independently, with replacement, and applies the SAME episode
    resample to the three policies (the common random numbers stay paired). Replicates
    whose ceiling equals the floor are dropped (the fraction is undefined there)."""
    p = np.asarray(private, dtype=np.float64)
    c = np.asarray(ceiling, dtype=np.float64)
    f = np.asarray(floor, dtype=np.float64)
    if p.ndim != 2 or c.shape != (p.shape[1],) or f.shape != c.shape:
        raise ValueError(f"want private (R, E), ceiling and floor (E,); got {p.shape}, {c.shape}")
    n_r, n_e = p.shape

    def frac(pm: float, cm: float, fm: float) -> float:
        return (pm - fm) / (cm - fm) if cm != fm else float("nan")

    point = frac(float(p.mean()), float(c.mean()), float(f.mean()))
    ri = rng.integers(0, n_r, size=(reps, n_r))
    ei = rng.integers(0, n_e, size=(reps, n_e))
    # mean over the resampled (release, episode) grid = mean over releases of the per-release
    # means of the resampled episodes
    pm = np.array([p[np.ix_(ri[b], ei[b])].mean() for b in range(reps)])
    cm = c[ei].mean(axis=1)
    fm = f[ei].mean(axis=1)
    ok = cm != fm
    fr = (pm[ok] - fm[ok]) / (cm[ok] - fm[ok])
    if fr.size < 2:
        return {"fraction": point, "se": float("nan"), "lo": float("nan"), "hi": float("nan")}
    lo, hi = np.percentile(fr, [2.5, 97.5])
    return {"fraction": point, "se": float(fr.std(ddof=1)), "lo": float(lo), "hi": float(hi)}


def served_release_returns(
    bundle: Path,
    store_url: str,
    env_id: str,
    *,
    episodes: int,
    seed: int,
    env_kwargs: JSONObject | None = None,
) -> tuple[list[float], JSONObject]:
    """Serve ``bundle`` with the real server over ``store_url`` and play ``episodes``
    lockstep episodes (seeds ``seed + i``) with actions from GetBestActions on [n, d] states.
    Returns (returns, a record: the release id and sigma of the served card, the calls and
    states this client sent, and the server's own counters: (state, action) values it
    answered, noise points its answer log wrote, points its store holds)."""
    # here, not at the top: loads gymnasium only when this runs
    from qveil.trainer.served_eval import best_actions_paced, lockstep_returns

    with LocalServer(bundle, store_url) as srv, ValueClient(srv.target, timeout=60) as client:
        info = client.release()
        dims = int(info.dims)
        calls = sent = 0

        def served(states: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
            nonlocal calls, sent
            calls += 1
            sent += len(states)
            return best_actions_paced(client, states.reshape(len(states), dims))

        returns = lockstep_returns(
            env_id, served, episodes=episodes, seed=seed, env_kwargs=env_kwargs or {}
        )
        m = srv.services.ctx.metrics
        srv.answers.flush()  # the counters below include every answer's log write
        stats = {
            "release_id": info.release_id,
            "served_sigma": float(info.sigma),
            "seeded": bool(srv.services.ctx.holder.current().bundle.seeded),
            "calls": calls,
            "states_sent": sent,
            "server_values_answered": int(m.states_answered),
            "server_logged_points": int(srv.answers.logged),
            "stored_points": int(srv.store.count_points(info.release_id)),
        }
    return returns, stats


def _random_policy(m: int, seed: int) -> Callable[[npt.NDArray[np.float64]], npt.NDArray[np.int64]]:
    rng = np.random.default_rng([seed, 7])  # experiment seed (the floor's actions), not noise
    return lambda s: rng.integers(0, m, size=len(s))


def run_point(
    env_id: str,
    users: int,
    seed: int,
    *,
    episodes: int,
    releases: int = 1,
    epsilons: tuple[float, ...] = EPSILONS,
    max_steps: int | None = None,
    say: Callable[[str], object] = print,
    dataset: Path | None = None,
    workers: int = 1,
    **changes: object,
) -> tuple[list[JSONObject], list[JSONObject]]:
    """One (env, N, seed): collect (or stream ``dataset``, a Parquet file of N users of
    ``env_id`` collected with ``seed``), fit once (on ``workers`` local Dask workers; 1: in
    process), then the ceiling, the floor and ``releases`` served releases per epsilon on
    the same ``episodes`` episode seeds (``max_steps``: truncate every scored episode
    there; the quick smoke run only). Returns (cell rows, one row per release)."""
    # here, not at the top: these load gymnasium only when this runs
    from qveil.trainer.distributed import Engine
    from qveil.trainer.kfqi import fit_kernel
    from qveil.trainer.served_eval import lockstep_returns

    cfg = load_config(env_id, **changes)
    data, t_collect = _data(env_id, users, seed, cfg, dataset)
    fit = fit_kernel(cfg, data, engine=Engine(workers=workers, progress=dataset is not None))
    say(
        f"multid {env_id} N={users} seed={seed}: {fit.samples} samples, collected in "
        f"{t_collect:.0f} s, fitted once in {fit.seconds:.0f} s"
    )
    play = _Play(env_id, episodes, EVAL_SEED + 1000 * seed, max_steps)
    ceiling = np.asarray(
        lockstep_returns(env_id, lambda s: np.argmax(fit.mean(s), axis=1), **play.kwargs())
    )
    floor = np.asarray(lockstep_returns(env_id, _random_policy(fit.actions, seed), **play.kwargs()))
    base = {
        "env": env_id,
        "users": users,
        "seed": seed,
        "samples": int(fit.samples),
        "episodes": episodes,
        "max_steps": max_steps or "",
        "collect_s": round(t_collect, 2),
        "fit_s": round(fit.seconds, 2),
    }
    rows = [
        {**base, "policy": "non-private", "epsilon": float("inf"), "sigma": 0.0,
         "return": float(ceiling.mean()), "episode_min": float(ceiling.min()),
         "episode_max": float(ceiling.max())},
        {**base, "policy": "random", "epsilon": float("nan"), "sigma": float("nan"),
         "return": float(floor.mean()), "episode_min": float(floor.min()),
         "episode_max": float(floor.max())},
    ]  # fmt: skip
    say(f"  ceiling {ceiling.mean():.1f}, random {floor.mean():.1f} ({episodes} episodes)")
    per_release: list[JSONObject] = []
    boot_rng = np.random.default_rng([seed, 11])  # resampling only
    with tempfile.TemporaryDirectory(prefix="qveil-multid-") as tmp:
        for eps in epsilons:
            returns = []
            for k in range(releases):
                d = Path(tmp) / f"eps{eps:g}-r{k}"
                ret, row = _served_release(fit, d, eps, play, say, f"{k + 1}/{releases}")
                returns.append(ret)
                per_release.append({**base, "epsilon": eps, "release": k, **row})
            cell = [x for x in per_release if x["epsilon"] == eps]
            boot = fraction_bootstrap(np.asarray(returns), ceiling, floor, rng=boot_rng)
            rows.append({**base, **_private_row(eps, np.asarray(returns), cell, boot, releases)})
    return rows, per_release


def _data(
    env_id: str, users: int, seed: int, cfg: KernelFQIConfig, dataset: Path | None
) -> tuple[Dataset | ParquetSource, float]:
    """The fit's data and the seconds its collection took: ``users`` collected with ``seed``
    now, or the Parquet ``dataset`` collected beforehand (NaN seconds)."""
    # here: these load gymnasium only when this runs
    from qveil.trainer.behaviour import resolve_behaviour
    from qveil.trainer.collect import collect

    if dataset is None:
        t0 = time.perf_counter()
        # rewards clipped into the config's public range (LunarLander's are unbounded;
        # CartPole's, Acrobot's and Reach16's already lie in it)
        data = collect(
            env_id,
            users,
            seed,
            reward_range=cfg.reward_range,
            clip_rewards=True,
            behaviour=resolve_behaviour(cfg.behaviour_policy, cfg.behaviour_epsilon),
        )
        return data, time.perf_counter() - t0
    src = ParquetSource(dataset)
    if src.env_id != env_id or src.users != users:
        raise ValueError(f"{dataset} holds {src.users} users of {src.env_id}")
    return src, float("nan")  # collected beforehand (qveil dataset collect)


class _PlayKwargs(TypedDict):
    """:func:`served_release_returns`' keywords of a :class:`_Play`."""

    episodes: int
    seed: int
    env_kwargs: JSONObject


@dataclass(frozen=True)
class _Play:
    """The scored episodes every policy of a point plays: the same seeds, the same cap."""

    env_id: str
    episodes: int
    seed: int
    max_steps: int | None

    def env_kwargs(self) -> JSONObject:
        return {} if self.max_steps is None else {"max_episode_steps": int(self.max_steps)}

    def kwargs(self) -> _PlayKwargs:
        return {"episodes": self.episodes, "seed": self.seed, "env_kwargs": self.env_kwargs()}


def _served_release(
    fit: KernelFit, d: Path, eps: float, play: _Play, say: Callable[[str], object], label: str
) -> tuple[list[float], JSONObject]:
    """Write one release of ``fit`` at ``eps`` into ``d``, serve it on its own store and play
    the episodes against it; (returns, its row's numbers). ``d`` is removed afterwards."""
    from qveil.trainer.kfqi import write_kernel_release  # here: loads gymnasium on use

    t0 = time.perf_counter()
    out = write_kernel_release(fit, d / "bundle", epsilon=eps, force=True)
    charge_simulated(out.path)  # served only with the registry's receipt of its charge
    ret, st = served_release_returns(
        out.path, f"sqlite:///{d / 'store.sqlite'}", play.env_id, **play.kwargs()
    )
    say(
        f"  eps {eps:g} release {label} {st['release_id'][:8]} "
        f"(sigma {st['served_sigma']:.3g}): return {np.mean(ret):.1f} "
        f"[{np.min(ret):.0f}..{np.max(ret):.0f}]; {st['states_sent']} states in "
        f"{st['calls']} GetBestActions calls, the server answered "
        f"{st['server_values_answered']} values and stored "
        f"{st['stored_points']} noise points "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    # the release is done with: drop its bundle and store (experiment artefacts)
    shutil.rmtree(d)
    row = {
        "sigma": float(out.card["sigma"]),
        "return": float(np.mean(ret)),
        "episode_min": float(np.min(ret)),
        "episode_max": float(np.max(ret)),
        **st,
    }
    return ret, row


def _private_row(
    eps: float, r: np.ndarray, cell: list[JSONObject], boot: dict[str, float], releases: int
) -> JSONObject:
    """The private row of one epsilon: its releases' returns ``r`` (release x episode), their
    per-release rows ``cell`` and the bootstrap of the fraction."""
    means = r.mean(axis=1)
    return {
        "policy": "private",
        "epsilon": eps,
        "sigma": float(cell[0]["sigma"]),
        "return": float(r.mean()),
        "releases": releases,
        "release_min": float(means.min()),
        "release_max": float(means.max()),
        "episode_min": float(r.min()),
        "episode_max": float(r.max()),
        "fraction_se": boot["se"],
        "fraction_lo": boot["lo"],
        "fraction_hi": boot["hi"],
        "states_sent": int(sum(x["states_sent"] for x in cell)),
        "server_values_answered": int(sum(x["server_values_answered"] for x in cell)),
        "server_logged_points": int(sum(x["server_logged_points"] for x in cell)),
        "noise": (
            "seeded (tests only)"
            if any(x["seeded"] for x in cell)
            else "the release key (OS entropy)"
        ),
    }


def _fraction(rows: list[JSONObject]) -> None:
    by: dict[tuple[Hashable, ...], dict[str, float]] = {}
    for r in rows:
        if r["policy"] != "private":
            by.setdefault((r["env"], r["users"], r["seed"]), {})[r["policy"]] = r["return"]
    for r in rows:
        g = by[(r["env"], r["users"], r["seed"])]
        top, low = g["non-private"], g["random"]
        r["fraction"] = (r["return"] - low) / (top - low) if top != low else float("nan")


def _plot(rows: list[JSONObject], path: Path) -> Path:
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib

    matplotlib.use("Agg")
    # pyplot after matplotlib.use('Agg') above: no display is needed
    import matplotlib.pyplot as plt

    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments.plotting import save

    envs = sorted({r["env"] for r in rows})
    fig, axes = plt.subplots(1, len(envs), figsize=(5.2 * len(envs), 3.8), dpi=100, squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        er = [r for r in rows if r["env"] == env]
        ns = sorted({r["users"] for r in er})

        def line(
            pred: Callable[[JSONObject], bool], er: list[JSONObject] = er, ns: list[int] = ns
        ) -> list[float]:
            return [
                float(np.mean([r["return"] for r in er if r["users"] == n and pred(r)] or [np.nan]))
                for n in ns
            ]

        ax.plot(ns, line(lambda r: r["policy"] == "non-private"), "k-", lw=2, label="non-private")
        for eps in sorted({r["epsilon"] for r in er if r["policy"] == "private"}):

            def private_at(r: JSONObject, e: float = eps) -> bool:
                return bool(r["policy"] == "private" and r["epsilon"] == e)

            ax.plot(
                ns,
                line(private_at),
                marker="o",
                label=f"eps {eps:g} (served)",
            )
        ax.plot(ns, line(lambda r: r["policy"] == "random"), "k:", label="random")
        ax.set_xscale("log")
        ax.set_xlabel("users N (one random episode each)")
        ax.set_ylabel("return")
        ax.set_title(f"{env}: kernel fqi via GetBestActions, delta 1e-5", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path)


def _plot_releases(rows: list[JSONObject], per_release: list[JSONObject], path: Path) -> Path:
    """One panel per (env, N): each served release's mean return against epsilon (dots),
    their mean (line), the ceiling and the floor on the same episode seeds."""
    # matplotlib loads only when a plot is drawn (a heavy import)
    import matplotlib

    matplotlib.use("Agg")
    # pyplot after matplotlib.use('Agg') above: no display is needed
    import matplotlib.pyplot as plt

    # here, not at the top: loads matplotlib only when this runs
    from qveil.experiments.plotting import save

    cells = sorted({(r["env"], r["users"], r["seed"]) for r in rows})
    cols = min(3, len(cells))
    nrows = -(-len(cells) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.4 * nrows), dpi=100, squeeze=False)
    for ax, (env, n, seed) in zip(axes.flat, cells, strict=False):
        mine = [r for r in rows if (r["env"], r["users"], r["seed"]) == (env, n, seed)]
        top = next(r["return"] for r in mine if r["policy"] == "non-private")
        low = next(r["return"] for r in mine if r["policy"] == "random")
        priv = sorted((r for r in mine if r["policy"] == "private"), key=lambda r: r["epsilon"])
        eps = [r["epsilon"] for r in priv]
        ax.axhline(top, color="k", lw=2, label="non-private (same episodes)")
        ax.axhline(low, color="k", ls=":", label="random (same episodes)")
        for r in priv:
            got = [
                x["return"]
                for x in per_release
                if (x["env"], x["users"], x["seed"], x["epsilon"]) == (env, n, seed, r["epsilon"])
            ]
            ax.plot([r["epsilon"]] * len(got), got, "o", color="C0", alpha=0.45, ms=4)
        ax.plot(eps, [r["return"] for r in priv], "-", color="C0", lw=2, label="served: mean")
        ax.set_xscale("log", base=2)
        ax.set_xticks(eps, [f"{e:g}" for e in eps])
        ax.set_xlabel("epsilon (delta 1e-5)")
        ax.set_ylabel("return")
        reps = priv[0]["releases"] if priv else 0
        ax.set_title(f"{env}, N = {n}: {reps} releases (dots)", fontsize=9)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(cells) :]:
        ax.axis("off")
    fig.tight_layout()
    return save(fig, path)


#: quick (the test suite: a smoke run, episodes truncated at 50 steps) and full plans:
#: (env, users), episodes per policy, releases per cell, step cap
QUICK = ([("CartPole-v1", [300]), ("Acrobot-v1", [30])], 3, 2, 50)
FULL = (
    [("CartPole-v1", [1000, 3000, 10_000, 30_000, 100_000]), ("Acrobot-v1", [300, 1000])],
    10,
    8,
    None,
)


def run(
    *,
    out: Path,
    quick: bool = False,
    seeds: int | None = None,
    plan: list[tuple[str, list[int]]] | None = None,
    episodes: int | None = None,
    releases: int | None = None,
    epsilons: tuple[float, ...] = EPSILONS,
    dataset: Path | None = None,
    workers: int = 1,
    config: Path | None = None,
    **_: object,
) -> dict[str, Path]:
    """Every (env, N, seed) of the plan; writes multid.csv (one row per cell),
    multid_releases.csv (one row per served release) and multid.png. ``dataset``: one
    Parquet file instead of the plan (its env and users; seed 0 is recorded, the file's
    collection seed must be it), fitted on ``workers`` local Dask workers. ``config``: a
    kernel fqi config file used instead of the public config of its ``env_id`` (every
    environment of the plan must be that one)."""
    default_plan, default_episodes, default_releases, max_steps = QUICK if quick else FULL
    if dataset is not None:
        src = ParquetSource(dataset)
        if src.env_id not in ENVS:
            raise ValueError(f"{dataset}: env {src.env_id!r} has no public config here")
        plan = [(str(src.env_id), [int(src.users)])]
        seeds = 1
    plan = default_plan if plan is None else plan
    changes: JSONObject = {}  # config keys, each checked by KernelFQIConfig
    if config is not None:
        changes = read_fqi_toml(config)
        envs = {e for e, _ in plan}
        if envs - {changes.get("env_id")}:
            raise ValueError(f"{config} is a config of {changes.get('env_id')}, not of {envs}")
        changes.pop("env_id", None)  # the plan's env (run_point's first argument)
    out.mkdir(parents=True, exist_ok=True)
    episodes = episodes or default_episodes
    releases = releases or default_releases
    rows: list[JSONObject] = []
    per_release: list[JSONObject] = []
    for env_id, ns in plan:
        for n in ns:
            for s in range(seeds or 1):
                t0 = time.perf_counter()
                got, rel = run_point(
                    env_id,
                    n,
                    s,
                    episodes=episodes,
                    releases=releases,
                    epsilons=epsilons,
                    max_steps=max_steps,
                    dataset=dataset,
                    workers=workers if dataset is not None else 1,
                    **changes,
                )
                rows += got
                per_release += rel
                summ = " ".join(
                    f"{r['policy'][:4]}{'' if r['policy'] != 'private' else r['epsilon']}="
                    f"{r['return']:.0f}"
                    for r in got
                )
                print(
                    f"multid {env_id} N={n} seed={s}: {summ} ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    _fraction(rows)
    csv_path = write_csv(out / "multid.csv", rows)
    rel_path = write_csv(out / "multid_releases.csv", per_release)
    png = _plot(rows, out / "multid.png")
    rel_png = _plot_releases(rows, per_release, out / "multid_releases.png")
    return {"csv": csv_path, "releases": rel_path, "png": png, "releases_png": rel_png}
