"""`qveil train --mode fqi`: a private release of fitted-Q iteration on an offline dataset
whose states have d >= 1 coordinates (a 1-D ``grid`` config is the case d = 1).

1. kernel FQI with per-user averaging on the public anchor grid, then the public subspace
   KRR onto the additive RKHS of the noise (:mod:`qveil.kfqi`);
2. sigma from the kernel accountant (:mod:`qveil.privacy.kfqi`), computed BEFORE the data
   is touched; a release whose noise would swamp the values is refused unless forced;
3. an ``additive`` bundle (:func:`qveil.bundle.write_kernel_bundle`) whose card lists the
   public per-coordinate intervals (states outside are clipped) and betas.

Fitting (:func:`fit_kernel`) and writing a release (:func:`write_kernel_release`) are
separate steps, so one fit can back several bundles (``qveil experiments multid`` writes one
per epsilon and repetition instead of refitting). Each bundle is a distinct release: its own
release id (a fresh ``bundle_id``), fingerprint and noise key, so its own noise. Releasing
several bundles of one dataset composes their privacy costs; the experiment measures each
one's utility separately (independent repetitions), it does not publish them.

The release noise is the bundle's: one key per bundle, drawn from OS entropy when the bundle
is written, gives every snapped state its noise (:mod:`qveil.keyed`).
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from qveil.additive import StateBox
from qveil.bundle import build_kernel_fqi_card, load_bundle, write_kernel_bundle
from qveil.bundle.io import plot_curve
from qveil.dataset import Dataset
from qveil.errors import FailedPrecondition, InvalidArgument, echo
from qveil.fqi_config import CLIP_REFUSE, CLIP_WARN, REFUSE_RATIO, clipping_message, ratio_message
from qveil.json_types import JSONMapping, JSONObject
from qveil.kfqi import Anchors, KernelFQIResult, additive_mean, iterate_q_nd, krr_result
from qveil.kfqi_anchors import (
    VISITATION_SEED,
    VISITATION_STATES,
    AnchorSet,
    check_anchor_intervals,
    visitation_points,
    write_anchors,
)
from qveil.kfqi_config import KernelFQIConfig, plan_kernel
from qveil.kfqi_prior import Prior, check_prior, read_prior, write_prior
from qveil.privacy.fqi import FQIPrivacyResult
from qveil.trainer.distributed import Engine, fit_operators
from qveil.trainer.train import code_version
from qveil.training_data import TrainingData

__all__ = [
    "FQIOutcome",
    "KernelFit",
    "action_count",
    "check_clipping",
    "check_reward_relation",
    "fit_kernel",
    "observation_bounds",
    "summary",
    "state_intervals",
    "train_kernel_fqi",
    "write_kernel_anchors",
    "write_kernel_prior",
    "write_kernel_release",
]


@dataclass(frozen=True)
class FQIOutcome:
    path: Path
    card: JSONObject  # the card (qveil.bundle.card)
    seconds: float
    warning: str | None
    #: the clipped-rows report when above CLIP_WARN (qveil.fqi_config)
    clipping: str | None = None


def observation_bounds(env_id: str) -> tuple[np.ndarray, np.ndarray]:
    """The flattened (low, high) of an environment's Box observation space (public)."""
    import gymnasium as gym  # here, not at the top: only a config without intervals needs it

    import qveil.trainer  # noqa: F401 - registers qveil's environments

    env = gym.make(env_id)
    try:
        lo = np.asarray(env.observation_space.low, dtype=np.float64).reshape(-1)  # type: ignore[attr-defined]
        hi = np.asarray(env.observation_space.high, dtype=np.float64).reshape(-1)  # type: ignore[attr-defined]
    finally:
        env.close()
    return lo, hi


def action_count(cfg: KernelFQIConfig) -> int | None:
    """The public action count of a config: its ``actions``, else its env's Discrete action
    count (None when it names neither, or an env this installation cannot make)."""
    if cfg.actions is not None:
        return int(cfg.actions)
    if not cfg.env_id:
        return None
    import gymnasium as gym  # here, not at the top: only a config naming an env needs it

    import qveil.trainer  # noqa: F401 - registers qveil's environments

    try:
        env = gym.make(cfg.env_id)
    except (gym.error.Error, ImportError):  # unknown here: the dataset must declare it
        return None
    try:
        space = env.action_space
        return int(space.n) if isinstance(space, gym.spaces.Discrete) else None
    finally:
        env.close()


def check_reward_relation(neighbour: str, dataset: TrainingData) -> None:
    """Refuse (InvalidArgument) the ``reward`` neighbour relation on a dataset that does not
    declare ``rewards_are_population_averages``. The relation's bound, D_T = (hi - lo)
    (1 - gamma^T) / (N (1 - gamma)), assumes each sample's reward is already the mean of the
    N users' private reward functions, so that one user moves every reward by at most
    (hi - lo)/N; on rows that each carry one user's own reward, one user moves their rewards
    by up to hi - lo and the bound does not hold."""
    if neighbour != "reward" or dataset.rewards_are_population_averages:
        return
    raise InvalidArgument(
        "the reward neighbour relation assumes each sample's reward is already the mean of "
        "the N users' private reward functions, so one user moves every reward by at most "
        "(hi - lo)/N; this dataset does not declare rewards_are_population_averages, and on "
        "rows holding one user's own reward the bound does not hold. Use --neighbour user, "
        "or declare the field (qveil dataset collect --rewards-are-population-averages, or "
        "rewards_are_population_averages in the file) when the rewards really are "
        "population averages"
    )


def state_intervals(cfg: KernelFQIConfig, env_id: str | None, dims: int) -> list[list[float]]:
    """The public per-coordinate intervals: the config's, else the env's finite bounds."""
    if cfg.state_intervals is not None:
        if len(cfg.state_intervals) != dims:
            raise InvalidArgument(
                f"the config gives {len(cfg.state_intervals)} state intervals; the dataset "
                f"has {dims} coordinates"
            )
        return [list(p) for p in cfg.state_intervals]
    if env_id:
        lo, hi = observation_bounds(env_id)
        if lo.size == dims and np.isfinite(lo).all() and np.isfinite(hi).all():
            return [[float(a), float(b)] for a, b in zip(lo, hi, strict=True)]
    raise InvalidArgument(
        "the kernel fqi mode needs a bounded interval per coordinate: set state_intervals = "
        "[[lo, hi], ...] in the config (unbounded coordinates, e.g. CartPole's velocities, "
        "are clipped into them)"
    )


@dataclass(frozen=True)
class KernelFit:
    """One dataset's kernel fqi fit, before any release: the mean function's coefficients
    (no noise) and what a card records about the data (admin view). ``cfg`` is the config it
    was fitted with; :func:`write_kernel_release` takes the privacy settings from it."""

    cfg: KernelFQIConfig
    result: KernelFQIResult
    env_id: str
    intervals: list[list[float]]
    reward_range: tuple[float, float]
    users: int
    actions: int
    dims: int
    samples: int
    states_clipped: int
    seconds: float
    sup_changes: tuple[float, ...]
    dataset_fingerprint: str
    prior: Prior | None = None
    """The public prior the uncovered users voted (``cfg.prior``), or None."""
    anchors: AnchorSet | None = None
    """The public anchors of ``cfg.anchor_file`` (layout ``file``), or None."""
    _curves: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    def log_rows(self) -> list[dict[str, float]]:
        """The bundle's training log: the sup change of each FQI iteration."""
        return [{"iteration": t + 1, "sup_change": d} for t, d in enumerate(self.sup_changes)]

    def curve_png(self, title: str) -> bytes:
        """The bundle's record plot of this fit, drawn once per title (several releases of
        one fit share it; drawing costs about half a second)."""
        if title not in self._curves:
            with tempfile.TemporaryDirectory() as d:
                p = Path(d) / "curve.png"
                plot_curve(p, self.log_rows(), title)
                self._curves[title] = p.read_bytes()
        return self._curves[title]

    def mean(self, states: npt.ArrayLike) -> np.ndarray:
        """The fitted mean f_a at raw states (n, d), clipped into the public box: (n, m).
        Not a release (no noise); for non-private references only."""
        box = StateBox.of(self.intervals)
        x = box.to_unit(np.asarray(states, dtype=np.float64).reshape(-1, self.dims), clip=True)
        r = self.result
        out: np.ndarray = additive_mean(
            x, alpha=r.alpha, centre=r.centre, inducing=r.inducing, betas=r.betas
        )
        return out


def _shape(dataset: TrainingData) -> tuple[int, str, tuple[float, float], int, int]:
    """dims, env id, reward range, users and actions, from the dataset's public metadata (a
    streamed Parquet dataset's user count is its writer's record: the fit checks the count
    it reads against it)."""
    lo, hi = dataset.reward_range
    return (dataset.d, dataset.env_id or "", (lo, hi), dataset.users, int(dataset.n_actions))


def _plan(cfg: KernelFQIConfig, dataset: TrainingData) -> FQIPrivacyResult:
    """The accountant's result from public quantities (N, m, d, the config) only."""
    dims, _, rr, users, actions = _shape(dataset)
    plan: FQIPrivacyResult = plan_kernel(
        cfg, users=users, actions=actions, dims=dims, reward_range=cfg.reward_range or rr
    )
    return plan


def fit_kernel(
    cfg: KernelFQIConfig, dataset: TrainingData, *, engine: Engine | None = None
) -> KernelFit:
    """Kernel FQI + subspace KRR of ``dataset`` with ``cfg``'s public estimator (no noise,
    no privacy accounting: that is :func:`write_kernel_release`'s). The ``reward`` relation
    is refused on a dataset that does not declare its rewards population averages
    (:func:`check_reward_relation`).

    ``dataset``: a :class:`qveil.dataset.Dataset`, or a
    :class:`qveil.dataset_parquet.ParquetSource` streamed one row group per task. The
    operators are built shard by shard on ``engine`` (a
    :class:`qveil.trainer.distributed.Engine`; default: in this process), the same bits
    whatever the worker count; a file whose users differ from its recorded count is
    refused."""
    check_reward_relation(cfg.neighbour, dataset)

    dims, ds_env, ds_rr, users, actions = _shape(dataset)
    env_id = cfg.env_id or ds_env
    rr = cfg.reward_range or ds_rr
    intervals = state_intervals(cfg, env_id or None, dims)
    box = StateBox.of(intervals)
    anchor_set = cfg.anchor_set()
    if anchor_set is not None:  # refuse anchors of another box before the build
        check_anchor_intervals(anchor_set, intervals)
    spec = cfg.spec(dims, anchors=anchor_set)
    spec.default_value(rr)  # refuse a bad default before the expensive build
    prior = None if cfg.prior is None else read_prior(cfg.prior)
    votes = None
    if prior is not None:  # refuse a prior of other anchors, actions or range before the build
        votes = check_prior(
            prior, spec=spec, state_intervals=intervals, actions=actions, reward_range=rr
        )
    t0 = time.perf_counter()
    deltas: list[float] = []
    built = fit_operators(
        dataset,
        n_actions=actions,
        reward_range=rr,
        box=box,
        spec=spec,
        engine=engine if engine is not None else Engine(),
    )
    if built.users != users:
        raise FailedPrecondition(
            f"the dataset records {users} users but holds {built.users}: the accountant's N "
            "must be the data's (rewrite the file with qveil dataset convert)"
        )
    q = iterate_q_nd(built.operators, spec=spec, prior=votes, on_iteration=deltas.append)
    result = krr_result(q, spec=spec, reward_range=(float(rr[0]), float(rr[1])))
    seconds = time.perf_counter() - t0
    fingerprint = dataset.fingerprint()
    return KernelFit(
        cfg=cfg,
        result=result,
        env_id=env_id,
        intervals=intervals,
        reward_range=rr,
        users=users,
        actions=actions,
        dims=dims,
        samples=built.samples,
        states_clipped=built.clipped,
        seconds=seconds,
        sup_changes=tuple(deltas),
        dataset_fingerprint=fingerprint,
        prior=prior,
        anchors=anchor_set,
    )


def write_kernel_release(
    fit: KernelFit,
    out: str | Path,
    *,
    epsilon: float | None = None,
    sigma: float | None = None,
    force: bool = False,
) -> FQIOutcome:
    """Account and write one release bundle of ``fit`` at ``out`` (must not exist): sigma
    from the kernel accountant for ``epsilon`` (or the given ``sigma``; neither: the fit's
    config), a fresh release id. Every call is a new, distinct release of the same mean.
    Returns a :class:`FQIOutcome`. Nothing is written on any error."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(f"output {echo(out)} already exists and is not empty")
    cfg = fit.cfg
    if epsilon is not None or sigma is not None:
        cfg = cfg.replace(epsilon=epsilon, sigma=sigma)
    result = plan_kernel(
        cfg,
        users=fit.users,
        actions=fit.actions,
        dims=fit.dims,
        reward_range=fit.reward_range,
        prior_sha256=None if fit.prior is None else fit.prior.sha256,
    )
    warning = ratio_message(result)
    if result.noise_to_value > REFUSE_RATIO and not force:
        raise FailedPrecondition(f"refusing: {warning}; pass --force to release anyway")
    spec = cfg.spec(fit.dims, anchors=fit.anchors)
    r = fit.result
    card = build_kernel_fqi_card(
        env_id=fit.env_id,
        state_intervals=fit.intervals,
        privacy_result=result,
        dataset_fingerprint=fit.dataset_fingerprint,
        hyperparameters={
            "gamma": cfg.gamma,
            "iterations": cfg.iterations,
            "anchor_points": cfg.anchor_points,
            "anchors": cfg.anchors,
            "anchor_count": cfg.anchor_count,
            "neighbours": cfg.neighbours,
            "bandwidth": cfg.bandwidth,
            "kernel_radius": cfg.kernel_radius,
            "inducing_points": cfg.inducing_points,
            "lam": cfg.lam,
            "betas": list(spec.betas),
            "neighbour": cfg.neighbour,
            "default_value": spec.default_value(fit.reward_range),
            # public: the prior is public data (its hash and where it came from)
            **({} if fit.prior is None else {"prior": fit.prior.record()}),
            # public: the anchors are public points (their hash and where they came from)
            **({} if fit.anchors is None else {"anchor_file": fit.anchors.record()}),
        },
        seeded=False,
        code_version=code_version(),
        extra={
            "release_noise": {
                "sigma": result.sigma,
                "betas": list(spec.betas),
                "kernel": "sigma^2 sum_j exp(-beta_j |x_j - y_j|) (each g_j has the full sigma)",
                "source": "OS entropy",
            },
            # admin view only (not in PUBLIC_CARD_KEYS): counts computed from the data
            "training": {
                "samples": fit.samples,
                "seconds": round(fit.seconds, 3),
                "states_clipped": fit.states_clipped,
            },
        },
    )
    path = write_kernel_bundle(
        out,
        card=card,
        alpha=r.alpha,
        centre=r.centre,
        inducing=r.inducing,
        config_toml=cfg.replace(betas=spec.betas).to_toml(),
        training_log_rows=fit.log_rows(),
        learning_curve_png=fit.curve_png(f"{fit.env_id}  sigma={result.sigma}  mode=fqi"),
    )
    written = load_bundle(path, verify=True)
    return FQIOutcome(path=path, card=written.card, seconds=fit.seconds, warning=warning)


def check_clipping(fit: KernelFit, *, allow_clipping: bool = False) -> str | None:
    """The clipped-rows report of ``fit`` (rows whose state or next state lies outside the
    config's state intervals): None up to :data:`~qveil.fqi_config.CLIP_WARN` of the rows, a
    warning above it, and above :data:`~qveil.fqi_config.CLIP_REFUSE` a refusal
    (FailedPrecondition) unless ``allow_clipping``."""
    share = fit.states_clipped / max(1, fit.samples)
    if share <= CLIP_WARN:
        return None
    note = clipping_message(fit.states_clipped, fit.samples, fit.intervals)
    if share > CLIP_REFUSE and not allow_clipping:
        raise FailedPrecondition(
            f"refusing: {note}; fix state_intervals in the config, or pass --allow-clipping "
            "to train anyway"
        )
    return note


def write_kernel_anchors(
    cfg: KernelFQIConfig, dataset: TrainingData, out: str | Path, *, source: str = ""
) -> AnchorSet:
    """Place ``cfg.anchor_count`` anchors where the states of a PUBLIC ``dataset`` go
    (:func:`qveil.kfqi_anchors.visitation_points` in the unit box of the config's state
    intervals; nothing of it is private) and write them as an anchor file at ``out``
    (must not exist), for a config's ``anchors = "file"``. ``source`` names the dataset in
    the file's origin. Returns the anchors as written."""
    out = Path(out)
    if out.exists():
        raise InvalidArgument(f"anchor file {echo(out)} already exists")
    if not isinstance(dataset, Dataset):
        raise InvalidArgument("anchors are placed from an in-memory dataset (npz, csv or parquet)")
    dims = int(dataset.s.shape[1])
    intervals = state_intervals(cfg, cfg.env_id or dataset.env_id or None, dims)
    x = StateBox.of(intervals).to_unit(dataset.s)
    points = visitation_points(x, cfg.anchor_count)
    origin = (
        f"visitation_points (k-means, seed {VISITATION_SEED}, at most {VISITATION_STATES} "
        f"states) of the {len(x)} states of the public dataset {echo(source)} "
        f"{dataset.fingerprint()} ({dataset.users} users of {dataset.env_id or 'an unnamed env'})"
    )
    return write_anchors(out, points=points, state_intervals=intervals, origin=origin)


def write_kernel_prior(
    cfg: KernelFQIConfig,
    dataset: TrainingData,
    out: str | Path,
    *,
    source: str = "",
    engine: Engine | None = None,
) -> Prior:
    """Fit ``cfg``'s estimator on a PUBLIC ``dataset`` (no noise, no accounting: nothing of
    it is private) and write its Q_T at the config's anchors as a prior file at ``out``
    (:mod:`qveil.kfqi_prior`; must not exist). ``source`` names the dataset in the prior's
    origin. Returns the prior as written."""
    out = Path(out)
    if out.exists():
        raise InvalidArgument(f"prior file {echo(out)} already exists")
    fit = fit_kernel(cfg, dataset, engine=engine)
    spec = cfg.spec(fit.dims)
    origin = (
        f"the non-private kernel fqi of the config on the public dataset {echo(source)} "
        f"{fit.dataset_fingerprint} ({fit.users} users of {fit.env_id or 'an unnamed env'})"
    )
    return write_prior(
        out,
        values=fit.result.q_anchors,
        anchors=Anchors(spec).points,
        state_intervals=fit.intervals,
        reward_range=fit.reward_range,
        gamma=cfg.gamma,
        origin=" ".join(origin.split()),
    )


def train_kernel_fqi(
    cfg: KernelFQIConfig,
    dataset: TrainingData,
    out: str | Path,
    *,
    force: bool = False,
    engine: Engine | None = None,
    allow_clipping: bool = False,
) -> FQIOutcome:
    """Fit, account and write a d-coordinate fqi bundle at ``out`` (must not exist).
    Returns a :class:`FQIOutcome`. Nothing is written on any error; a
    release the accountant refuses is refused before the data is touched, and a fit whose
    rows are mostly outside the state intervals after it (:func:`check_clipping`)."""
    check_reward_relation(cfg.neighbour, dataset)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(f"output {echo(out)} already exists and is not empty")
    result = _plan(cfg, dataset)
    if result.noise_to_value > REFUSE_RATIO and not force:
        raise FailedPrecondition(
            f"refusing: {ratio_message(result)}; pass --force to release anyway"
        )
    fit = fit_kernel(cfg, dataset, engine=engine)
    clipping = check_clipping(fit, allow_clipping=allow_clipping)
    outcome = write_kernel_release(fit, out, force=force)
    return dataclasses.replace(outcome, clipping=clipping)


def summary(outcome: FQIOutcome) -> str:
    """A few lines for the CLI."""
    c = outcome.card
    return "\n".join(
        [
            f"bundle {c['bundle_id']} written to {outcome.path}",
            f"  mode=fqi estimator=kernel d={c['dims']} neighbour={c['neighbour']} "
            f"users={c['users']} gamma={c['gamma']:g} T={c['iterations']} "
            f"anchors={c['model']['anchor_points']}^{c['dims']} lam={c['model']['lam']:g}",
            f"  D_T={c['sup_sensitivity']:.4g} kappa={c['kappa']:.4g} "
            f"betas={c['betas']} Delta={c['sensitivity']:.4g} sigma={c['sigma']:.4g} "
            f"(the noise is {100 * c['noise_to_value']:.2g} % of the largest value); "
            f"states clipped into {c['state_intervals']}: {_clipped(c)}",
            f"  epsilon={_g(c['epsilon'])} delta={c['delta_total']:.3g} holds={c['holds']}",
            f"  fitted in {outcome.seconds:.2f} s",
        ]
    )


def _clipped(card: JSONMapping) -> str:
    """The clipped-rows count of a card (its admin view), as a share of the rows."""
    t = card.get("training") or {}
    n, k = t.get("samples"), t.get("states_clipped")
    if not n or k is None:
        return "rows clipped not recorded"
    return f"{k} of {n} rows clipped ({100 * k / n:.2f} %)"


def _g(v: float) -> str:
    """A number for people: 7.999999999999996 -> 8."""
    return f"{v:.6g}" if math.isfinite(v) else "n/a"
