"""Returns of a SERVED release: the policy's actions come from the server's GetBestActions
(the released values Q + g, g the noise of the release's key), not from a model in process.

Episodes run in lockstep, so each environment step costs one batched call for all
episodes still running: [n, d] states for a release of d >= 1 coordinates. Beside the served
policy, the same episodes (same environment seeds) are scored for the uniformly random
policy (the floor) and, given the dataset, for the non-private estimator (the ceiling): the
release's own fqi estimator from the public card's configuration, without noise.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import numpy.typing as npt

from qveil.bundle import is_kernel_card
from qveil.client import ResourceExhaustedError, ValueClient
from qveil.errors import InvalidArgument, echo
from qveil.json_types import JSONObject
from qveil.kfqi_anchors import write_anchors
from qveil.kfqi_config import KernelFQIConfig
from qveil.trainer.evaluate import PolicyScore, _score
from qveil.trainer.kfqi import fit_kernel
from qveil.training_data import TrainingData

__all__ = ["evaluate_served", "lockstep_returns", "nonprivate_name", "nonprivate_policy"]

BatchPolicy = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.int64]]


def best_actions_paced(
    client: ValueClient, states: npt.NDArray[np.float64], *, max_waits: int = 1000
) -> npt.NDArray[np.int64]:
    """``client.best_actions(states)``, waiting out the server's state quota.

    An evaluation sends every live episode's state each step, so it can outrun a caller's
    budget of states (``qveil serve --state-rate``). The server then refuses the whole call
    with RESOURCE_EXHAUSTED and says when to retry (``google.rpc.RetryInfo``); a
    well-behaved client waits that long and asks again, instead of the operator lifting the
    quota for it. A refusal without a delay is raised.
    """

    for _ in range(max_waits):
        try:
            return np.asarray(client.best_actions(states), dtype=np.int64)
        except ResourceExhaustedError as exc:
            if exc.retry_delay is None:
                raise
            time.sleep(max(float(exc.retry_delay), 0.001))
    return np.asarray(client.best_actions(states), dtype=np.int64)


def lockstep_returns(
    env_id: str, policy: BatchPolicy, *, episodes: int, seed: int, env_kwargs: JSONObject
) -> list[float]:
    """Undiscounted returns of ``policy`` (states (n, d) -> actions (n,)) over ``episodes``
    episodes, episode i seeded ``seed + i``."""
    try:
        envs = [gym.make(env_id, **env_kwargs) for _ in range(episodes)]
    except (gym.error.Error, TypeError, ImportError) as exc:
        raise InvalidArgument(
            f"cannot play the release's environment {echo(env_id)} here: "
            f"{str(exc).splitlines()[0][:160]} (the release names an env that is not installed "
            "or not registered in Gymnasium)"
        ) from None
    try:
        obs = [
            np.asarray(e.reset(seed=seed + i)[0], dtype=np.float64).reshape(-1)
            for i, e in enumerate(envs)
        ]
        totals = np.zeros(episodes)
        live = list(range(episodes))
        while live:
            acts = policy(np.stack([obs[i] for i in live]))
            still = []
            for i, a in zip(live, acts, strict=True):
                o, r, term, trunc, _ = envs[i].step(int(a))
                totals[i] += float(r)
                obs[i] = np.asarray(o, dtype=np.float64).reshape(-1)
                if not (term or trunc):
                    still.append(i)
            live = still
        return totals.tolist()
    finally:
        for e in envs:
            e.close()


def nonprivate_name(card: JSONObject) -> str:
    """The table label of :func:`nonprivate_policy`'s policy."""
    return "non-private FQI (the release's estimator, no noise)"


def nonprivate_policy(card: JSONObject, dataset: TrainingData) -> BatchPolicy:
    """Greedy policy of the release's fqi estimator (its public configuration, intervals
    and reward range on the card) refitted on ``dataset`` without noise. A release of
    another estimator has no such reference (InvalidArgument)."""
    if not is_kernel_card(card):
        raise InvalidArgument(
            "the non-private reference refits the release's fqi estimator; this release "
            f"({card.get('mode')!r:.40}) does not record one"
        )
    return _kernel_nonprivate_policy(card, dataset)


def _kernel_nonprivate_policy(card: JSONObject, dataset: TrainingData) -> BatchPolicy:
    """The kernel estimator of the card (its public ``estimator`` configuration, intervals
    and reward range) refitted on ``dataset``; greedy on the fitted mean (no noise)."""
    hp = card.get("estimator") or card["hyperparameters"]
    if hp.get("prior"):
        raise InvalidArgument(
            "this release's uncovered users vote a public prior (sha256 "
            f"{str(hp['prior'].get('sha256'))[:16]}...); the card holds its hash, not its "
            "values, so the non-private reference cannot be refitted from the card"
        )
    with tempfile.TemporaryDirectory(prefix="qveil-anchors-") as tmp:
        anchor_file = _card_anchors(card, hp, Path(tmp))
        fit = fit_kernel(_card_config(card, hp, anchor_file), dataset)

    def act(states: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
        best: npt.NDArray[np.int64] = np.argmax(fit.mean(states), axis=1).astype(np.int64)
        return best

    return act


def _card_anchors(card: JSONObject, hp: JSONObject, tmp: Path) -> str | None:
    """The card's public anchor points (layout ``file``) written as an anchor file in
    ``tmp``, checked against the card's sha256; None for the other layouts."""
    rec = hp.get("anchor_file")
    if not rec:
        return None
    points = rec.get("points") if isinstance(rec, dict) else None
    if points is None:
        raise InvalidArgument(
            "this release's anchors are a public anchor file whose points the card does not "
            "hold, so the non-private reference cannot be refitted from the card"
        )
    out = tmp / "anchors.npz"
    written = write_anchors(out, points=np.asarray(points, dtype=np.float64),
                            state_intervals=card["state_intervals"],
                            origin=str(rec.get("origin", "")))  # fmt: skip
    if written.sha256 != rec.get("sha256"):
        raise InvalidArgument("the card's anchor points do not match its anchor sha256")
    return str(out)


def _card_config(card: JSONObject, hp: JSONObject, anchor_file: str | None) -> KernelFQIConfig:
    """The kernel config of the card's public ``estimator`` configuration."""
    return KernelFQIConfig(
        env_id=card.get("env_id") or None,
        state_intervals=tuple(tuple(iv) for iv in card["state_intervals"]),
        reward_range=tuple(card["reward_range"]),
        gamma=float(hp["gamma"]),
        iterations=int(hp["iterations"]),
        anchor_points=int(hp["anchor_points"]),
        anchors=str(hp.get("anchors", "grid")),
        anchor_count=int(hp.get("anchor_count", 4096)),
        neighbours=int(hp.get("neighbours", 16)),
        bandwidth=float(hp["bandwidth"]),
        kernel_radius=float(hp["kernel_radius"]),
        inducing_points=int(hp["inducing_points"]),
        lam=float(hp["lam"]),
        betas=tuple(float(b) for b in hp["betas"]),
        neighbour=str(hp["neighbour"]),
        default_value=float(hp["default_value"]),
        anchor_file=anchor_file,
    )


def evaluate_served(
    target: str,
    *,
    episodes: int = 100,
    seed: int = 0,
    token: str | None = None,
    dataset: TrainingData | None = None,
    env_kwargs: JSONObject | None = None,
) -> tuple[JSONObject, list[PolicyScore]]:
    """(public card, scores): the served policy, random and (with ``dataset``) non-private
    FQI, on the same ``episodes`` environment seeds."""
    if episodes < 1:
        raise InvalidArgument(f"episodes must be >= 1, got {episodes!r}")
    with ValueClient(target, token=token) as client:
        info = client.release()
        card = dict(info.card)
        kw = dict(env_kwargs or card.get("hyperparameters", {}).get("env_kwargs", {}) or {})

        dims = int(info.dims or 1)

        def served(states: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
            return best_actions_paced(client, states.reshape(len(states), dims))

        act_rng = np.random.default_rng(seed)

        def random_policy(states: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
            return act_rng.integers(0, info.n_actions, size=len(states)).astype(np.int64)

        rows: list[tuple[str, BatchPolicy]] = [
            ("served release (GetBestActions)", served),
            ("random", random_policy),
        ]
        if dataset is not None:
            rows.append((nonprivate_name(card), nonprivate_policy(card, dataset)))
        scores = [
            _score(
                name,
                lockstep_returns(info.env_id, pol, episodes=episodes, seed=seed, env_kwargs=kw),
            )
            for name, pol in rows
        ]
    return card, scores
