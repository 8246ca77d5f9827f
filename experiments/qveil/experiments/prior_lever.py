"""``qveil experiments prior-lever``: does a public prior move CartPole's private kernel fqi
release at N = 1e4 users, epsilon 1 (docs/results.md 9.3)?

A user whose episode does not reach an anchor votes a public value: the config's constant
``default_value`` (0, the pessimistic end of the Q range), or a public prior p(z, a)
(:mod:`qveil.kfqi_prior`). Each prior here is the non-private kernel fqi of the same config
(same anchors, gamma, T, default) on ``PUBLIC_USERS`` simulated random-policy users of public
dynamics, collection seed ``PUBLIC_SEED`` (never a seed of the private datasets):

* ``shifted``: CartPole with another pole (half-length 0.75 instead of 0.5, its mass x length
  term with it): the lever as it would be used, a simulator that is not the data's dynamics;
* ``same``: CartPole's own dynamics: an upper reference only (a simulator of exactly the
  private users' dynamics is what a real deployment lacks).

Rows per collection seed of the private users (tuning seed 1, report seed 0): the config
(today), the config with each prior, the config with each prior's *advantage* (default +
p(z, a) - min_b p(z, b): the prior's action preference at the pessimistic level, tried on the
tuning seed after the prior itself lost), and each prior's OWN greedy policy (its KRR mean
under the config's map, no data and no noise: a public policy). If the prior alone does as
well as the release with it, the lever is the simulator's merit, not the data's.

Measured as :mod:`qveil.experiments.multid_levers` measures (seeded in-process release noise
of the accountant's sigma, common episode seeds, R releases x E episodes, bootstrap CIs).
"fraction" is (return - random) / (non-private - random) with ONE reference non-private for
every row of a seed: the config's own non-private fit (a prior moves its row's non-private
too; that column is shown beside it). Datasets are cached in ``QVEIL_LEVERS_CACHE``.

Seeds are for experiments only.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from qveil.additive import StateBox
from qveil.dataset import Dataset, load_npz, save_npz
from qveil.experiments._util import write_csv
from qveil.experiments.multid_levers import (
    ENV_ID,
    EPSILON,
    GRID,
    Fitted,
    Scores,
    Sweep,
    bootstrap,
    cache_dir,
    dataset,
    load_config,
    score,
    sigma_for,
)
from qveil.json_types import JSONMapping, JSONObject
from qveil.kfqi import Anchors, build_operators_nd, inducing_grid, iterate_q_nd, krr_result
from qveil.kfqi_config import KernelFQIConfig
from qveil.kfqi_prior import read_prior, write_prior

__all__ = ["COLUMNS", "PRIORS", "advantage", "prior_fit", "public_dataset", "public_prior", "run"]

USERS = 10_000
PUBLIC_USERS = 100_000
#: Collection seed of the public simulations (the private datasets use 0, 1 and 2).
PUBLIC_SEED = 100
TUNE_SEED = 1
REPORT_SEED = 0
#: CartPole's pole: half-length 0.5 and mass 0.1 (gymnasium); polemass_length = mass x length.
_MASSPOLE = 0.1
#: The public simulators: name -> (description, env attributes).
PRIORS: dict[str, tuple[str, dict[str, float]]] = {
    "shifted": (
        "pole half-length 0.75 (CartPole: 0.5)",
        {"length": 0.75, "polemass_length": _MASSPOLE * 0.75},
    ),
    "same": ("CartPole's own dynamics (upper reference)", {}),
}
COLUMNS = (
    "seed",
    "row",
    "prior",
    "users",
    "sigma",
    "releases",
    "episodes",
    "return",
    "return_lo",
    "return_hi",
    "own_non_private",
    "non_private",
    "random",
    "fraction",
    "fraction_lo",
    "fraction_hi",
    "release_min",
    "release_max",
)


def public_dataset(
    name: str, *, users: int = PUBLIC_USERS, seed: int = PUBLIC_SEED, cache: Path | None = None
) -> Dataset:
    """``users`` random-policy users of the public simulator ``name`` (:data:`PRIORS`),
    cached as npz."""
    from qveil.trainer.collect import collect  # here: loads gymnasium only when this runs

    _, attrs = PRIORS[name]
    root = cache if cache is not None else cache_dir()
    tag = "".join(f"-{k}{v:g}" for k, v in sorted(attrs.items()))
    path = root / f"{ENV_ID}-{users}-s{seed}{tag}.npz"
    if path.exists():
        return load_npz(path)
    ds = collect(ENV_ID, users, seed, reward_range=(0.0, 1.0), env_attrs=attrs)
    root.mkdir(parents=True, exist_ok=True)
    save_npz(ds, path)
    return ds


def public_prior(name: str, cfg: JSONMapping, *, users: int = PUBLIC_USERS) -> np.ndarray:
    """The prior of ``cfg`` from the public simulator ``name``: the non-private kernel fqi's
    Q_T at the config's anchors on :func:`public_dataset`, (K, m) (what ``qveil train
    --write-prior`` writes), cached as a prior file beside the datasets (named by the
    config)."""
    spec = KernelFQIConfig.from_dict(cfg).spec(len(cfg["betas"]))
    rr = (float(cfg["reward_range"][0]), float(cfg["reward_range"][1]))
    tag = hashlib.sha256(repr(sorted(cfg.items())).encode()).hexdigest()[:10]  # the config
    path = cache_dir() / f"prior-{ENV_ID}-{name}-{users}-s{PUBLIC_SEED}-{tag}.npz"
    if path.exists():
        return read_prior(path).values
    ds = public_dataset(name, users=users)
    ops = build_operators_nd(
        ds.transitions,
        n_actions=int(ds.n_actions),
        reward_range=rr,
        box=StateBox.of(cfg["state_intervals"]),
        spec=spec,
    )
    q: np.ndarray = iterate_q_nd(ops, spec=spec)
    origin = f"{PRIORS[name][0]}, {users} random-policy users, seed {PUBLIC_SEED}"
    write_prior(path, values=q, anchors=Anchors(spec).points,
                state_intervals=cfg["state_intervals"], reward_range=rr, gamma=spec.gamma,
                origin=origin)  # fmt: skip
    return q


def advantage(prior: np.ndarray, default: float) -> np.ndarray:
    """The prior's action preference at the pessimistic level: default + p(z, a) - min_b
    p(z, b) (public: a function of the prior; in the Q range when the default is its lower
    end, as CartPole's 0 is)."""
    out: np.ndarray = default + prior - prior.min(axis=1, keepdims=True)
    return out


def prior_fit(prior: np.ndarray, cfg: JSONMapping) -> Fitted:
    """The prior's own released-mean form under the config's map (no data, no noise): its
    greedy policy is a public policy."""
    spec = KernelFQIConfig.from_dict(cfg).spec(len(cfg["betas"]))
    rr = (float(cfg["reward_range"][0]), float(cfg["reward_range"][1]))
    r = krr_result(prior, spec=spec, reward_range=rr)
    assert len(Anchors(spec).points) == prior.shape[0]
    return Fitted(
        alpha=r.alpha,
        centre=r.centre,
        inducing=inducing_grid(spec.inducing_points),
        betas=spec.betas,
        box=StateBox.of(cfg["state_intervals"]),
    )


def _row(
    seed: int,
    label: str,
    prior: str,
    sc: Scores,
    ref: Scores,
    *,
    users: int,
    releases: int,
    episodes: int,
) -> JSONObject:
    """One table row: ``sc``'s returns, with the fraction against ``ref``'s non-private and
    random (the same episodes)."""
    b = bootstrap(Scores(ceiling=ref.ceiling, floor=ref.floor, private=sc.private,
                         sigma=sc.sigma, noise_to_value=sc.noise_to_value))  # fmt: skip
    return {
        "seed": seed,
        "row": label,
        "prior": prior,
        "users": users,
        "sigma": sc.sigma,
        "releases": releases,
        "episodes": episodes,
        "return": b["private"],
        "return_lo": b["private_lo"],
        "return_hi": b["private_hi"],
        "own_non_private": float(np.mean(sc.ceiling)) if np.isfinite(sc.ceiling).all() else "",
        "non_private": b["non_private"],
        "random": b["random"],
        "fraction": b["fraction"],
        "fraction_lo": b["fraction_lo"],
        "fraction_hi": b["fraction_hi"],
        "release_min": b["release_min"],
        "release_max": b["release_max"],
    }


def seed_rows(
    seed: int,
    priors: Mapping[str, np.ndarray],
    *,
    users: int,
    releases: int,
    episodes: int,
    say: Callable[[str], object] = print,
) -> list[JSONObject]:
    """The rows of one private collection seed: the config, the config with each prior
    (R releases each, the same noise seeds), and each prior's own greedy policy."""
    cfg = load_config(**GRID)
    ds = dataset(users, seed)
    sweep = Sweep(ds, progress=say)
    res = sigma_for(cfg, users=int(ds.users), actions=int(ds.n_actions), epsilon=EPSILON)

    def scored(fit: Fitted) -> Scores:
        """``fit`` scored as every row of this seed is (the same sigma, noise and episodes)."""
        return score(
            fit,
            sigma=res.sigma,
            noise_to_value=res.noise_to_value,
            releases=releases,
            episodes=episodes,
            eval_seed=10_000 + 1000 * seed,
        )

    common = {"users": int(ds.users), "releases": releases, "episodes": episodes}
    ref = scored(sweep.fit(cfg))
    rows = [_row(seed, "config (default 0)", "", ref, ref, **common)]
    say(_line(rows[-1]))
    for name, prior in priors.items():
        sc = scored(sweep.fit(cfg, prior=prior))
        rows.append(_row(seed, "config + prior", name, sc, ref, **common))
        say(_line(rows[-1]))
    for name, prior in priors.items():
        sc = scored(sweep.fit(cfg, prior=advantage(prior, float(cfg["default_value"]))))
        rows.append(_row(seed, "config + prior advantage", name, sc, ref, **common))
        say(_line(rows[-1]))
    for name, prior in priors.items():
        alone = prior_fit(prior, cfg)
        seeds = [10_000 + 1000 * seed + e for e in range(episodes)]
        greedy = _greedy(alone, seeds)
        sc = Scores(ceiling=greedy, floor=ref.floor, private=greedy[None, :], sigma=0.0,
                    noise_to_value=0.0)  # fmt: skip
        rows.append({**_row(seed, "prior alone (greedy)", name, sc, ref, **common),
                     "sigma": 0.0, "releases": 0, "own_non_private": ""})  # fmt: skip
        say(_line(rows[-1]))
    return rows


def _greedy(fit: Fitted, seeds: list[int]) -> np.ndarray:
    from qveil.trainer.forecast import lockstep  # here: loads gymnasium only when this runs

    out: np.ndarray = lockstep(ENV_ID, lambda o: np.argmax(fit.values(o), axis=1), seeds)
    return out


def _line(r: JSONMapping) -> str:
    return (
        f"seed {r['seed']} {r['row']:<22} {r['prior']:<8} return {r['return']:.0f} "
        f"[{r['return_lo']:.0f}, {r['return_hi']:.0f}] non-private {r['non_private']:.0f} "
        f"random {r['random']:.0f} fraction {r['fraction']:.2f} "
        f"[{r['fraction_lo']:.2f}, {r['fraction_hi']:.2f}]"
    )


def run(*, out: Path, quick: bool = False, **_: object) -> dict[str, Path]:
    """The table: the priors fitted once on the public simulations, then the tuning seed
    (R x E = 10 x 20) and the report seed (20 x 30). ``--quick``: 200 private users, 300
    public users, seed 0, 2 x 2 (seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    def say(text: str) -> None:
        print(f"prior-lever [{time.perf_counter() - t0:.0f} s] {text}", flush=True)

    if quick:
        users, public, plan = 200, 300, [(REPORT_SEED, 2, 2)]
    else:
        users, public, plan = USERS, PUBLIC_USERS, [(TUNE_SEED, 10, 20), (REPORT_SEED, 20, 30)]
    cfg = load_config(**GRID)
    priors = {}
    for name in PRIORS:
        priors[name] = public_prior(name, cfg, users=public)
        say(f"prior {name}: {public} public users, values in "
            f"[{priors[name].min():.3g}, {priors[name].max():.3g}]")  # fmt: skip
    rows: list[JSONObject] = []
    for seed, rel, eps in plan:
        rows += seed_rows(seed, priors, users=users, releases=rel, episodes=eps, say=say)
    say(f"{len(rows)} rows")
    return {"csv": write_csv(out / "prior_lever.csv", rows, COLUMNS)}
