"""Retraining a release under the privacy ledger (``qveil admin retrain``).

Retraining, in order, so that a refusal leaves nothing behind:

1. load the training config, apply ``--epsilon``/``--sigma``; ask the accountant what the run
   will cost (the trainer's :meth:`qveil.trainer.estimators.Estimator.public_plan`) and check
   it against the dataset's cap *before* training (a refused retrain costs no compute);
2. train (:meth:`~qveil.trainer.estimators.Estimator.train`) into a new bundle directory;
3. recompute the release's privacy from the bundle's own card (``qveil.privacy.account``, never
   the card's numbers) and record the event: cap check and append in one serialized transaction
   (:meth:`qveil.server.governance.ledger.Ledger.record`); refused -> the bundle directory is
   deleted,
   :class:`~qveil.errors.BudgetExceeded` (spent, requested, cap) is raised, nothing registered;
4. write the registry's signed receipt of the charge into the bundle and register the release
   in the store (status ``staged``) under its bundle id, a fresh uuid. The bundle's noise key
   was drawn from OS entropy when the trainer wrote it (a ``--seed`` run, for tests only,
   derives it from its seed and its card says seeded): a new release always has new noise,
   never shared with another (two releases answering with the same noise could be subtracted
   to cancel it). An id the store already knows is refused;
5. optionally activate it.

Every outcome is appended to the admin audit log, also a refusal or a failure.

The server uses the trainer through its estimator interface (:mod:`qveil.trainer.estimators`)
only, imported when a retrain runs: the trainer is an optional extra of a server
(``qveil[trainer]``: gymnasium, torch).
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from qveil.bundle import Bundle, load_bundle
from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, NotFound, echo
from qveil.json_types import JSONObject
from qveil.privacy.events import account_params
from qveil.privacy.ledger import PrivacyEvent
from qveil.server.governance import admin_tables as T
from qveil.server.governance import audit_log
from qveil.server.governance.admin import AdminContext, activate
from qveil.server.governance.audit_log import utc_now
from qveil.server.governance.ledger import BudgetReport, LedgerEntry
from qveil.server.governance.release_records import RegistryRecords
from qveil.server.store.releases import store_params

if TYPE_CHECKING:  # the trainer is an optional extra: imported where retrain runs
    from qveil.trainer.estimators import AnyEstimator, TrainConfig

__all__ = ["RetrainResult", "default_releases_dir", "retrain"]


@dataclass(frozen=True)
class RetrainResult:
    """What ``qveil admin retrain`` did."""

    release_id: str
    bundle_path: Path
    dataset_id: str
    ledger_entry: LedgerEntry
    budget: BudgetReport
    activated: bool

    def to_dict(self) -> JSONObject:
        return {
            "release_id": self.release_id,
            "bundle_path": str(self.bundle_path),
            "dataset_id": self.dataset_id,
            "ledger": self.ledger_entry.to_dict(),
            "budget": self.budget.to_dict(),
            "activated": self.activated,
        }


def default_releases_dir(store_url: str) -> Path | None:
    """Where retrained bundles go by default: beside a SQLite store file (the server finds
    bundles there by id: ``qveil serve`` keeps its store beside its bundle)."""
    try:
        u = sa.engine.make_url(store_url)
    except sa.exc.ArgumentError:
        return None
    if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:"):
        return Path(u.database).resolve().parent
    return None


def _training_config(
    config: str | Path,
    *,
    sigma: float | None,
    epsilon: float | None,
    delta: float | None,
    mode: str | None,
) -> TrainConfig:
    try:  # optional extra
        from qveil.trainer.estimators import TrainConfig, estimator_name, load_config
    except ImportError as exc:  # the server without the trainer (the server image)
        raise FailedPrecondition(
            f"retrain needs the trainer: {exc.name!r} is not installed "
            "(pip install 'qveil[server,trainer]', or the trainer image)"
        ) from None

    if sigma is not None and epsilon is not None:
        raise InvalidArgument("give --epsilon or --sigma, not both")
    cfg = load_config(config, estimator="algorithm1")
    if not isinstance(cfg, TrainConfig):
        raise InvalidArgument(
            "retrain trains Algorithm 1 online (a config whose mode is paper, gdp or output), "
            f"not the {estimator_name(cfg)} estimator: train fqi releases with qveil train "
            "--dataset"
        )
    # a given sigma or epsilon replaces the config's (and clears the other)
    noise = (cfg.sigma, cfg.epsilon)
    if sigma is not None:
        noise = (sigma, None)
    elif epsilon is not None:
        noise = (None, epsilon)
    cfg = dataclasses.replace(
        cfg,
        mode=cfg.mode if mode is None else mode,
        delta=cfg.delta if delta is None else delta,
        sigma=noise[0],
        epsilon=noise[1],
    )
    cfg.validate()
    if cfg.sigma is None and cfg.epsilon is None:
        raise InvalidArgument("give --epsilon E or --sigma S (or set one in the config)")
    if cfg.sigma == 0:
        raise InvalidArgument(
            "sigma = 0 is the non-private baseline: it has no privacy "
            "guarantee and cannot be released under a ledger"
        )
    return cfg


def _planned_event(estimator: AnyEstimator, dataset_id: str) -> PrivacyEvent:
    """The privacy event the run will cost, computed by the accountant before training."""
    result = estimator.public_plan()
    if not result.holds:
        raise FailedPrecondition(
            f"this configuration has no privacy guarantee ({result.reason}); "
            "it cannot be released under the ledger"
        )
    return PrivacyEvent.from_result(result, dataset_id=dataset_id, bundle_id="planned")


def _bundle_event(bundle: Bundle, dataset_id: str) -> PrivacyEvent:
    """The release's event, recomputed by the accountant from the card's own parameters."""

    result = account_params(bundle.card["privacy_params"])
    return PrivacyEvent.from_result(result, dataset_id=dataset_id, bundle_id=bundle.bundle_id)


def retrain(
    ctx: AdminContext,
    *,
    config: str | Path,
    dataset_id: str,
    epsilon: float | None = None,
    sigma: float | None = None,
    delta: float | None = None,
    mode: str | None = None,
    out_dir: str | Path | None = None,
    activate_after: bool = False,
    seed: int | None = None,
    progress: bool = False,
    budget: float | None = None,
) -> RetrainResult:
    """Train a new release under ``dataset_id``'s cap (see the module docstring).

    ``out_dir``: directory that receives the bundle directory (named by release id); default
    beside a SQLite store file. ``seed``: tests and experiments only (the card says seeded).
    Raises BudgetExceeded / FailedPrecondition / InvalidArgument with nothing registered.
    """
    params: JSONObject = {
        "dataset_id": dataset_id,
        "config": str(config),
        "requested_epsilon": epsilon,
        "requested_sigma": sigma,
        "seeded": seed is not None,
    }
    moved: list[Path] = []  # [staging, bundle_dir] as they come to exist
    try:
        cfg = _training_config(config, sigma=sigma, epsilon=epsilon, delta=delta, mode=mode)
        params["mode"] = cfg.mode
        from qveil.trainer.estimators import create_estimator  # optional extra (docstring)

        estimator = create_estimator(cfg)
        planned = _planned_event(estimator, dataset_id)
        params["planned_epsilon"], params["planned_delta"] = planned.epsilon, planned.delta
        ctx.ledger.check(planned, budget=budget)  # refuse before spending compute
        bundle = _train_bundle(ctx, estimator, out_dir, seed=seed, progress=progress, moved=moved)
        params["release_id"] = bundle.bundle_id
        entry = _record_and_register(ctx, bundle, dataset_id, params, budget=budget)
    except BaseException as exc:
        for path in moved:
            if path.exists() and (path.name.startswith(".") or "ledger_seq" not in params):
                shutil.rmtree(path, ignore_errors=True)  # refused: leave nothing behind
        if isinstance(exc, Exception):
            audit_log.log_outcome(ctx.db, ctx.actor, "retrain", dataset_id, exc, _clean(params))
        raise
    audit_log.log_outcome(ctx.db, ctx.actor, "retrain", dataset_id, None, _clean(params))
    if activate_after:
        activate(ctx, bundle.bundle_id)
    return RetrainResult(
        release_id=bundle.bundle_id,
        bundle_path=bundle.path,
        dataset_id=dataset_id,
        ledger_entry=entry,
        budget=ctx.ledger.budget(dataset_id),
        activated=activate_after,
    )


def _train_bundle(
    ctx: AdminContext,
    estimator: AnyEstimator,
    out_dir: str | Path | None,
    *,
    seed: int | None,
    progress: bool,
    moved: list[Path],
) -> Bundle:
    """Train into a staging directory beside the releases, then move the verified bundle to
    ``root / release_id`` (refused when that directory or the release id already exists: a
    release id names one noise path). ``moved`` receives each directory as it is created."""
    root = Path(out_dir) if out_dir is not None else default_releases_dir(ctx.store_url)
    if root is None:
        raise InvalidArgument(
            "give --out-dir: where to write the new bundle (the default, "
            "beside the store file, exists for SQLite stores only)"
        )
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".retrain-{uuid.uuid4().hex}"
    moved.append(staging)
    outcome = estimator.train(None, staging, seed=seed, progress=progress)
    release_id = load_bundle(outcome.path, verify=True).bundle_id
    bundle_dir = root / release_id
    if bundle_dir.exists():
        raise IntegrityError(f"bundle directory {str(bundle_dir)!r} already exists")
    Path(outcome.path).rename(bundle_dir)
    moved.append(bundle_dir)
    bundle = load_bundle(bundle_dir, verify=True)
    try:  # a release id names one noise path: never reuse one
        ctx.store.releases.get_release(release_id)
    except NotFound:
        return bundle
    raise IntegrityError(
        f"release id {echo(release_id)} already exists in the store: "
        "refusing to share its noise path"
    )


def _record_and_register(
    ctx: AdminContext,
    bundle: Bundle,
    dataset_id: str,
    params: JSONObject,
    *,
    budget: float | None,
) -> LedgerEntry:
    """Record the release's event in the ledger (spent from here on: ``params['ledger_seq']``),
    write the registry's signed receipt into the bundle, register it in the store (staged)
    and note where its bundle lives."""

    event = _bundle_event(bundle, dataset_id)
    entry = ctx.ledger.record(event, release_id=bundle.bundle_id, actor=ctx.actor, budget=budget)
    params["ledger_seq"] = entry.seq  # spent: from here on the bundle is kept
    sp = store_params(bundle)  # 1-D or d coordinates
    RegistryRecords(ctx.registry, url=ctx.registry_url).issue_receipt(bundle.path)
    ctx.store.releases.register_bundle(bundle)
    with ctx.db.write("release-bundles") as conn:
        conn.execute(
            T.release_bundles.insert().values(
                release_id=bundle.bundle_id,
                dataset_id=dataset_id,
                bundle_path=str(bundle.path.resolve()),
                created_at=utc_now(),
            )
        )
    params.update(
        epsilon=event.epsilon,
        delta=event.delta,
        sigma=bundle.sigma,
        beta=sp["beta"],
        bundle_path=str(bundle.path),
    )
    return entry


def _clean(params: JSONObject) -> JSONObject:
    return {k: (audit_log.log_number(v) if isinstance(v, float) else v) for k, v in params.items()}


# ------------------------------------------------------------------------------- lifecycle
