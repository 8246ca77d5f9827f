"""Admin operations on a store: list, activate, retire, copy answer logs, budgets.

These are the domain functions behind ``qveil admin`` (directly on the store) and the server's
AdminService handlers (through :func:`record_server_action`). Each operation appends an entry to
the admin audit log (:mod:`qveil.server.governance.audit_log`), also when it is refused or fails.

Retraining under the ledger is :mod:`qveil.server.governance.retrain`.

Activation directly on the store only flips statuses (one ``active`` release); a running server
must be told through AdminService (``qveil admin --target``) so that it swaps atomically.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from qveil.bundle import load_bundle
from qveil.common.typing import ReleaseHeader
from qveil.errors import (
    FailedPrecondition,
    IntegrityError,
    QveilError,
    echo,
)
from qveil.json_types import JSONObject
from qveil.server.governance import admin_tables as T
from qveil.server.governance import audit_log
from qveil.server.governance.admin_db import AdminDB, admin_db_for
from qveil.server.governance.closing import Closing
from qveil.server.governance.ledger import BudgetReport, Cap, Ledger
from qveil.server.governance.registry import Registry, open_registry
from qveil.server.store import open_store
from qveil.server.store.base import SamplePathStore
from qveil.server.store.export import export_release as export_points
from qveil.server.store.export import import_release as import_points
from qveil.server.store.export import read_export_header
from qveil.server.store.models import TableRow
from qveil.server.store.releases import store_betas, store_params

__all__ = [
    "AdminContext",
    "ReleaseInfo",
    "activate",
    "budget",
    "export_release",
    "import_release",
    "open_admin",
    "release_bundle_path",
    "releases",
    "retire",
    "set_cap",
]


@dataclass
class AdminContext(Closing):
    """What the admin operations act on: a store, its admin records and who is acting."""

    store: SamplePathStore
    db: AdminDB
    actor: str
    store_url: str
    owns_store: bool = True
    #: the registry's URL (None: ``QVEIL_REGISTRY`` or ``$QVEIL_HOME/registry.sqlite``)
    registry_url: str | None = None
    _registry: Registry | None = None

    @property
    def ledger(self) -> Ledger:
        """The registry's population ledger: one ledger whatever store or directory."""
        return self.registry.ledger

    @property
    def registry(self) -> Registry:
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


# ------------------------------------------------------------------------------- listing
@dataclass(frozen=True)
class ReleaseInfo:
    """A release as ``qveil admin releases`` shows it: its header, when it was registered, its
    dataset and bundle, the ledger's numbers and its logged points."""

    header: ReleaseHeader
    created_at: str
    dataset_id: str | None
    bundle_path: str | None
    epsilon: float | None
    delta: float | None
    points: int

    def to_dict(self) -> dict[str, object]:
        """The header's fields, then the listing's (one flat JSON object)."""
        return self.header.to_dict() | {
            "created_at": self.created_at,
            "dataset_id": self.dataset_id,
            "bundle_path": self.bundle_path,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "points": self.points,
        }


def _bundle_rows(db: AdminDB) -> dict[str, TableRow]:
    with db.read() as conn:
        return {r.release_id: r for r in conn.execute(sa.select(T.release_bundles))}


def _ledger_by_release(
    db: AdminDB,
) -> dict[str, sa.Row[str, float, float, str]]:  # release_id, epsilon, delta, dataset_id
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
                header=r.header(),
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
        audit_log.log_outcome(
            ctx.db,
            ctx.actor,
            "ledger.set_cap",
            dataset_id,
            exc,
            {
                "cap_epsilon": audit_log.log_number(epsilon),
                "cap_delta": audit_log.log_number(delta),
            },
        )
        raise


def budget(ctx: AdminContext, dataset_id: str | None = None) -> list[BudgetReport]:
    """Spent, remaining and events of one dataset (or of every dataset)."""
    return ctx.ledger.budgets(dataset_id)


@dataclass
class _Operation:
    """What the audit-log entry of a running operation names (``target``: an operation that
    learns its real target on the way, such as the id of an imported release, sets it)."""

    target: str


@contextmanager
def _audited(
    ctx: AdminContext, action: str, target: str, params: JSONObject
) -> Iterator[_Operation]:
    """Run one operation's block and audit-log its outcome with ``params`` as the block left
    them: refused or failed with the reason when the block raises a QveilError (re-raised),
    ok when it completes."""
    op = _Operation(target)
    try:
        yield op
    except QveilError as exc:
        audit_log.log_outcome(ctx.db, ctx.actor, action, op.target, exc, params)
        raise
    audit_log.log_outcome(ctx.db, ctx.actor, action, op.target, None, params)


def activate(ctx: AdminContext, release_id: str) -> ReleaseInfo:
    """Make ``release_id`` the store's active release (directly on the store; a running
    server must be told through AdminService instead). Refuses a retired release, a release
    whose bundle fails verification or disagrees with the store's record, and a release whose
    stored noise fails verification. The previously active release becomes ``staged`` (it can
    be activated again: that is the rollback)."""
    params: JSONObject = {"release_id": release_id, "path": "store"}
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
    return next(r for r in releases(ctx) if r.header.release_id == release_id)


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
    return next(r for r in releases(ctx) if r.header.release_id == release_id)


# ------------------------------------------------------------------------ copying logs
def export_release(ctx: AdminContext, release_id: str, out: str | Path) -> JSONObject:
    """Write a release's answer log (every logged point) to ``out`` (JSON Lines,
    :mod:`qveil.server.store.export`). A copy, not a move: the store keeps its log, and any
    store that imports it holds the same values (the release's key's)."""
    params: JSONObject = {"release_id": release_id, "out": str(out)}
    with _audited(ctx, "export-release", release_id, params):
        n = export_points(ctx.store, release_id, out)
        params["points"] = n
    return {
        "release_id": release_id,
        "points": n,
        "out": str(out),
        "store_id": ctx.store.releases.store_id,
    }


def import_release(ctx: AdminContext, path: str | Path) -> JSONObject:
    """Load an export into this store (every count, seq and chain link verified first; one
    transaction). The release arrives ``staged``."""
    params: JSONObject = {"path": str(path)}
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
