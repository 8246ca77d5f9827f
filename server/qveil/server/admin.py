"""Admin operations on a store: list, activate, retire, copy answer logs, budgets.

These are the domain functions behind ``qveil admin`` (directly on the store) and the server's
AdminService handlers (through :func:`record_server_action`). Each operation appends an entry to
the admin audit log (:mod:`qveil.server.audit_log`), also when it is refused or fails.

Retraining under the ledger is :mod:`qveil.server.retrain`.

Activation directly on the store only flips statuses (one ``active`` release); a running server
must be told through AdminService (``qveil admin --target``) so that it swaps atomically.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from qveil.bundle import load_bundle
from qveil.errors import (
    BudgetExceeded,
    FailedPrecondition,
    IntegrityError,
    InvalidArgument,
    NotFound,
    QveilError,
    echo,
)
from qveil.privacy.record import Record
from qveil.server import admin_tables as T
from qveil.server import audit_log
from qveil.server.admin_db import AdminDB, open_admin_db
from qveil.server.closing import Closing
from qveil.server.ledger import BudgetReport, Cap, Ledger
from qveil.server.registry import open_registry
from qveil.server.store import open_store
from qveil.server.store.export import export_release as export_points
from qveil.server.store.export import import_release as import_points
from qveil.server.store.export import read_export_header
from qveil.server.store.releases import store_betas, store_params

__all__ = [
    "log_number",
    "log_outcome",
    "AdminContext",
    "ReleaseInfo",
    "activate",
    "budget",
    "export_release",
    "import_release",
    "open_admin",
    "record_server_action",
    "release_bundle_path",
    "releases",
    "retire",
    "server_action",
    "set_cap",
]


@dataclass
class AdminContext(Closing):
    """What the admin operations act on: a store, its admin records and who is acting."""

    store: Any
    db: AdminDB
    actor: str
    store_url: str
    owns_store: bool = True
    #: the registry's URL (None: ``QVEIL_REGISTRY`` or ``$QVEIL_HOME/registry.sqlite``)
    registry_url: str | None = None
    _registry: Any = None

    @property
    def ledger(self) -> Ledger:
        """The registry's population ledger: one ledger whatever store or directory."""
        return self.registry.ledger  # type: ignore[no-any-return]

    @property
    def registry(self) -> Any:
        """The registry (population ledger, receipts), opened on first use."""
        if self._registry is None:
            self._registry = open_registry(self.registry_url, actor=self.actor)
        return self._registry

    def close(self) -> None:
        self.db.close()
        if self._registry is not None and self.owns_store:
            self._registry.close()
        if self.owns_store:
            self.store.close()


def open_admin(
    store_url: str,
    *,
    actor: str | None = None,
    create: bool = True,
    new_ok: bool = True,
) -> AdminContext:
    """Open the store at ``store_url`` (running its migrations, which create the admin tables)
    and its admin records. ``memory://`` is for tests: nothing survives the process.
    ``new_ok=False`` (every ``qveil admin`` operation but ``init-store``) refuses a store that
    does not exist yet instead of creating an empty one."""

    try:
        store = open_store(store_url, create=create, new_ok=new_ok)
    except FailedPrecondition as exc:
        if new_ok:
            raise
        raise FailedPrecondition(
            f"{exc}; qveil admin creates a store only with init-store (qveil admin init-store "
            "--store URL)"
        ) from None
    try:
        db = admin_db_for(store, store_url)
    except BaseException:
        store.close()
        raise
    return AdminContext(
        store=store, db=db, actor=actor or audit_log.default_actor(), store_url=store_url
    )


def admin_db_for(store: Any, store_url: str | None = None) -> AdminDB:
    """The admin records beside ``store`` (same database), opened once per store object."""
    db: AdminDB | None = getattr(store, "_qveil_admin_db", None)
    if db is not None:
        return db
    url = store_url or getattr(store, "url", None) or getattr(store, "_url", None)
    if url is not None and not isinstance(url, str):  # a SQLAlchemy URL object
        url = url.render_as_string(hide_password=False)
    if url is None or str(url).startswith("memory:"):
        db = open_admin_db("memory://")  # a private in-memory admin database per memory store
    else:
        db = open_admin_db(str(url))
    try:
        store._qveil_admin_db = db
    except AttributeError:
        pass
    return db


# ------------------------------------------------------------------------------- listing
@dataclass(frozen=True)
class ReleaseInfo(Record):
    """A release as ``qveil admin releases`` shows it."""

    release_id: str
    status: str
    sigma: float
    beta: float
    interval: tuple[float, float]
    n_actions: int
    created_at: str
    dataset_id: str | None
    bundle_path: str | None
    epsilon: float | None
    delta: float | None
    points: int

    _AS_LISTS = ("interval",)


def _bundle_rows(db: AdminDB) -> dict[str, Any]:
    with db.read() as conn:
        return {r.release_id: r for r in conn.execute(sa.select(T.release_bundles))}


def _ledger_by_release(db: AdminDB) -> dict[str, Any]:
    t = T.ledger_events
    with db.read() as conn:
        return {
            r.release_id: r
            for r in conn.execute(
                sa.select(t.c.release_id, t.c.epsilon, t.c.delta, t.c.dataset_id).where(
                    t.c.release_id.is_not(None)
                )
            )
        }


def releases(ctx: AdminContext) -> list[ReleaseInfo]:
    """Every release of the store with its dataset, bundle, ledger numbers and point count."""
    bundles = _bundle_rows(ctx.db)
    spent = _ledger_by_release(ctx.registry.db)  # the population ledger
    out = []
    for r in sorted(
        ctx.store.releases.list_releases(), key=lambda r: (str(r.created_at), r.release_id)
    ):
        b = bundles.get(r.release_id)
        e = spent.get(r.release_id)
        out.append(
            ReleaseInfo(
                release_id=r.release_id,
                status=str(r.status),
                sigma=float(r.sigma),
                beta=float(r.beta),
                interval=(float(r.interval[0]), float(r.interval[1])),
                n_actions=int(r.n_actions),
                created_at=str(r.created_at),
                dataset_id=None if b is None else b.dataset_id,
                bundle_path=None if b is None else b.bundle_path,
                epsilon=None if e is None else float(e.epsilon),
                delta=None if e is None else float(e.delta),
                points=int(ctx.store.count_points(r.release_id)),
            )
        )
    return out


def release_bundle_path(ctx: AdminContext, release_id: str) -> str | None:
    """The bundle directory recorded for ``release_id`` by retrain (None if unknown)."""
    with ctx.db.read() as conn:
        r = conn.execute(
            sa.select(T.release_bundles.c.bundle_path).where(
                T.release_bundles.c.release_id == release_id
            )
        ).first()
    return None if r is None else str(r.bundle_path)


# ------------------------------------------------------------------------------- budget
def set_cap(ctx: AdminContext, dataset_id: str, *, epsilon: float, delta: float) -> Cap:
    """Set (append) the privacy cap of a dataset."""
    try:
        return ctx.ledger.set_cap(dataset_id, cap_epsilon=epsilon, cap_delta=delta, actor=ctx.actor)
    except QveilError as exc:
        log_outcome(
            ctx,
            "ledger.set_cap",
            dataset_id,
            exc,
            {"cap_epsilon": log_number(epsilon), "cap_delta": log_number(delta)},
        )
        raise


def budget(ctx: AdminContext, dataset_id: str | None = None) -> list[BudgetReport]:
    """Spent, remaining and events of one dataset (or of every dataset)."""
    led = ctx.ledger
    ids = [dataset_id] if dataset_id is not None else led.datasets()
    return [led.budget(d) for d in ids]


def log_number(v: Any) -> Any:
    """A float for the audit log's JSON: finite as is, NaN or infinity as text."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else str(f)


def log_outcome(
    ctx: AdminContext, action: str, target: str, exc: BaseException | None, params: dict[str, Any]
) -> None:
    """Audit-log the outcome of an operation (refused for domain refusals, failed otherwise)."""
    if exc is None:
        outcome, detail = "ok", ""
    elif isinstance(exc, BudgetExceeded | FailedPrecondition | InvalidArgument | NotFound):
        outcome, detail = "refused", str(exc)
    else:
        outcome, detail = "failed", f"{type(exc).__name__}: {exc}"
    try:
        audit_log.append(
            ctx.db,
            actor=ctx.actor,
            action=action,
            target=target,
            outcome=outcome,
            params=params,
            detail=detail[:2000],
        )
    except QveilError:
        if exc is None:
            raise


@dataclass
class _Operation:
    """What the audit-log entry of a running operation names (``target``: an operation that
    learns its real target on the way, such as the id of an imported release, sets it)."""

    target: str


@contextmanager
def _audited(
    ctx: AdminContext, action: str, target: str, params: dict[str, Any]
) -> Iterator[_Operation]:
    """Run one operation's block and audit-log its outcome with ``params`` as the block left
    them: refused or failed with the reason when the block raises a QveilError (re-raised),
    ok when it completes."""
    op = _Operation(target)
    try:
        yield op
    except QveilError as exc:
        log_outcome(ctx, action, op.target, exc, params)
        raise
    log_outcome(ctx, action, op.target, None, params)


def activate(ctx: AdminContext, release_id: str) -> ReleaseInfo:
    """Make ``release_id`` the store's active release (directly on the store; a running
    server must be told through AdminService instead). Refuses a retired release, a release
    whose bundle fails verification or disagrees with the store's record, and a release whose
    stored noise fails verification. The previously active release becomes ``staged`` (it can
    be activated again: that is the rollback)."""
    params: dict[str, Any] = {"release_id": release_id, "path": "store"}
    with _audited(ctx, "activate", release_id, params):
        rec = ctx.store.releases.get_release(release_id)
        if str(rec.status) == "retired":
            raise FailedPrecondition(
                f"release {echo(release_id)} is retired; retired releases are never answered again"
            )
        path = release_bundle_path(ctx, release_id)
        if path is not None:
            b = load_bundle(path, verify=True)
            sp = store_params(b)
            if (
                b.bundle_id != release_id
                or b.sigma != float(rec.sigma)
                or sp["beta"] != float(rec.beta)
                or store_betas(sp["betas"]) != tuple(rec.betas)
                or b.n_actions != int(rec.n_actions)
                or sp["interval"] != tuple(map(float, rec.interval))
            ):
                raise IntegrityError(
                    f"bundle {echo(path)} disagrees with the store's record of release "
                    f"{echo(release_id)}"
                )
        rep = ctx.store.verify(release_id)
        if not bool(getattr(rep, "ok", False)):
            raise IntegrityError(
                f"stored noise of release {echo(release_id)} fails verification: {rep}"
            )
        previous = [
            r.release_id
            for r in ctx.store.releases.list_releases()
            if str(r.status) == "active" and r.release_id != release_id
        ]
        ctx.store.releases.set_release_status(release_id, "active")
        for p in previous:
            ctx.store.releases.set_release_status(p, "staged")
        params["previous"] = previous
    return next(r for r in releases(ctx) if r.release_id == release_id)


def retire(ctx: AdminContext, release_id: str) -> ReleaseInfo:
    """Retire a release for good (its stored noise is kept for audits). The active release
    cannot be retired: activate another one first."""
    params = {"release_id": release_id, "path": "store"}
    with _audited(ctx, "retire", release_id, params):
        rec = ctx.store.releases.get_release(release_id)
        if str(rec.status) == "active":
            raise FailedPrecondition(
                f"release {echo(release_id)} is active; activate another release before retiring it"
            )
        ctx.store.releases.set_release_status(release_id, "retired")
    return next(r for r in releases(ctx) if r.release_id == release_id)


# ------------------------------------------------------------------------ copying logs
def export_release(ctx: AdminContext, release_id: str, out: str | Path) -> dict[str, Any]:
    """Write a release's answer log (every logged point) to ``out`` (JSON Lines,
    :mod:`qveil.server.store.export`). A copy, not a move: the store keeps serving it, and
    any store that imports it holds the same values (the release's key's)."""
    params: dict[str, Any] = {"release_id": release_id, "out": str(out)}
    with _audited(ctx, "export-release", release_id, params):
        n = export_points(ctx.store, release_id, out)
        params["points"] = n
    return {
        "release_id": release_id,
        "points": n,
        "out": str(out),
        "store_id": ctx.store.releases.store_id,
    }


def import_release(ctx: AdminContext, path: str | Path) -> dict[str, Any]:
    """Load an export into this store (every count, seq and chain link verified first; one
    transaction). The release arrives ``staged``."""
    params: dict[str, Any] = {"path": str(path)}
    with _audited(ctx, "import-release", str(path), params) as op:
        head = read_export_header(path)
        params["release_id"] = str(head.get("release_id", ""))
        rec = import_points(ctx.store, path)
        rec = ctx.store.releases.set_release_status(rec.release_id, "staged")
        op.target = rec.release_id
    return {
        "release_id": rec.release_id,
        "points": int(ctx.store.count_points(rec.release_id)),
        "store_id": ctx.store.releases.store_id,
    }


def record_server_action(
    db: AdminDB,
    *,
    actor: str,
    action: str,
    target: str,
    error: BaseException | None = None,
    params: dict[str, Any] | None = None,
) -> None:
    """Audit-log an operation the server performed (AdminService handlers call this)."""
    ctx = AdminContext(store=None, db=db, actor=actor, store_url="", owns_store=False)
    log_outcome(ctx, action, target, error, dict(params or {}, path="server"))


@contextmanager
def server_action(
    store: Any, action: str, target: str, *, actor: str = "server (admin role)", **params: Any
) -> Iterator[None]:
    """Wrap one AdminService operation of a running server: its outcome (ok, refused with the
    reason, failed) is appended to the admin audit log of the server's store."""
    db = admin_db_for(store)
    try:
        yield
    except Exception as exc:
        record_server_action(
            db, actor=actor, action=action, target=target, error=exc, params=params
        )
        raise
    record_server_action(db, actor=actor, action=action, target=target, params=params)
