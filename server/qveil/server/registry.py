"""The registry: one noise lineage per release, one budget per population.

A release's answers must all come from one draw of its noise, kept in one store. Copies of a
store (a byte copy, a database cloned from a template, a restored backup) carry that noise but
not the right to extend it: a new state answered by two copies gets two independent values.
The registry is the record that no copy carries, because it lives in a database of its own
(default ``$QVEIL_HOME/registry.sqlite``, ``~/.qveil`` when unset; ``QVEIL_REGISTRY`` or
``--registry`` name another, e.g. a PostgreSQL database every replica shares). It holds:

* **lineage** (``registry_releases``): for each release, its bundle fingerprint, the store id
  and the store *incarnation* (:meth:`qveil.server.store.SamplePathStore.incarnation`) that
  hold its noise, and its status: ``bound``, ``exported`` (an export's token is pending) or
  ``retired``. A release is claimed once: ``qveil train`` claims it for its store when it
  writes the bundle; a second claim from another store or incarnation is refused;
* **witnessed chain heads** (``registry_heads``): before a store answers a value with a seq
  above the witnessed head of its path, it records the new head here
  (:meth:`Registry.publish`), so a store whose chain does not contain every witnessed head
  (a restored backup that lost answered points, or a fork) is found and refused;
* **export tokens** (``registry_exports``): an export is a move; its single-use token is
  consumed by the first import, and a second import of the same export is refused;
* **populations and their budgets**: the privacy ledger (``qveil.server.ledger``) and its caps,
  keyed by population name; and the **audit log** of every change above (who and when).

Every refusal names the one command that does the legitimate thing instead.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, NotFound, echo
from qveil.server import admin_tables as T
from qveil.server import audit_log
from qveil.server.admin_db import AdminDB, open_admin_db
from qveil.server.audit_log import utc_now
from qveil.server.ledger import Ledger
from qveil.server.store import open_store

__all__ = [
    "LineageRecord",
    "Registry",
    "default_registry_url",
    "open_registry",
]

LOCK = "registry"
STATUSES = ("bound", "exported", "retired")


def qveil_home() -> Path:
    """``$QVEIL_HOME``, else ``~/.qveil``: created owner-only (0700) on first use."""
    home = Path(os.environ.get("QVEIL_HOME") or Path.home() / ".qveil").expanduser()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def default_registry_url() -> str:
    """``$QVEIL_REGISTRY``, else ``sqlite:///$QVEIL_HOME/registry.sqlite``."""
    url = os.environ.get("QVEIL_REGISTRY")
    if url:
        return url
    return f"sqlite:///{qveil_home() / 'registry.sqlite'}"


@dataclass(frozen=True)
class LineageRecord:
    """Where a release's noise lives (one row of ``registry_releases``)."""

    release_id: str
    fingerprint: str
    store_id: str
    incarnation: str
    status: str
    store: str
    updated_at: str

    def to_dict(self) -> dict[str, str]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class Registry:
    """The registry database (see the module docstring). Open with :func:`open_registry`."""

    def __init__(self, db: AdminDB, *, registry_id: str, actor: str) -> None:
        self.db = db
        self.url = db.url
        #: the registry database's own random id (a bundle's binding names it)
        self.registry_id = registry_id
        self.actor = actor
        self.ledger = Ledger(db, population=True)

    # -- lineage --------------------------------------------------------------------------
    def lineage(self, release_id: str) -> LineageRecord | None:
        with self.db.read() as conn:
            return self._lineage(conn, release_id)

    @staticmethod
    def _lineage(conn: sa.Connection, release_id: str) -> LineageRecord | None:
        R = T.registry_releases  # noqa: N806
        row = conn.execute(sa.select(R).where(R.c.release_id == release_id)).first()
        if row is None:
            return None
        return LineageRecord(*(str(row._mapping[c]) for c in LineageRecord.__dataclass_fields__))

    def releases_of(self, store_id: str) -> list[LineageRecord]:
        R = T.registry_releases  # noqa: N806
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(R.c.release_id).where(R.c.store_id == store_id).order_by(R.c.release_id)
            ).all()
            out = [self._lineage(conn, str(r[0])) for r in rows]
        return [r for r in out if r is not None]

    def claim(
        self,
        *,
        release_id: str,
        fingerprint: str,
        store_id: str,
        incarnation: str,
        store: str,
    ) -> LineageRecord:
        """The release's one lineage: recorded for this store incarnation when the release is
        new to the registry; returned when it is already this one's; refused otherwise
        (FailedPrecondition naming where the noise lives and the command to use)."""
        with self.db.write(LOCK) as conn:
            rec = self._lineage(conn, release_id)
            if rec is None:
                return self._bound(
                    conn, "claim-release", release_id, store_id, incarnation, store, fingerprint
                )
        self.check(rec, fingerprint=fingerprint, store_id=store_id, incarnation=incarnation)
        return rec

    def _bound(
        self,
        conn: sa.Connection,
        action: str,
        release_id: str,
        store_id: str,
        incarnation: str,
        store: str,
        fingerprint: str | None = None,
    ) -> LineageRecord:
        """Within a write transaction: the release now lives in this store incarnation
        (status bound), audited as ``action``; with ``fingerprint``, a new release's row."""
        R = T.registry_releases  # noqa: N806
        values = {
            "store_id": store_id,
            "incarnation": incarnation,
            "status": "bound",
            "store": store,
            "updated_at": utc_now(),
        }
        if fingerprint is not None:
            conn.execute(
                sa.insert(R).values(release_id=release_id, fingerprint=fingerprint, **values)
            )
        else:
            conn.execute(sa.update(R).where(R.c.release_id == release_id).values(**values))
        audit_log.append(
            self.db,
            actor=self.actor,
            action=action,
            target=release_id,
            outcome="ok",
            params={"store_id": store_id, "incarnation": incarnation},
            conn=conn,
        )
        rec = self._lineage(conn, release_id)
        assert rec is not None
        return rec

    @staticmethod
    def check(rec: LineageRecord, *, fingerprint: str, store_id: str, incarnation: str) -> None:
        """Refuse unless ``rec`` says the release's noise lives in this store incarnation."""
        rid = echo(rec.release_id)
        if rec.fingerprint != fingerprint:
            raise IntegrityError(
                f"release {rid} is registered with fingerprint {rec.fingerprint[:16]}..., not "
                f"{fingerprint[:16]}...: another bundle under the same release id is never served"
            )
        if rec.status == "retired":
            raise FailedPrecondition(
                f"release {rid} is retired in the registry (since {rec.updated_at}); a retired "
                "release is never answered again. Train a new release (qveil train)"
            )
        if rec.status == "exported":
            raise FailedPrecondition(
                f"release {rid} was exported from store {rec.store_id} (at {rec.updated_at}) and "
                "is moving: it is answered again only where its export is imported (qveil admin "
                "import-release FILE --store URL)"
            )
        if rec.store_id != store_id:
            raise FailedPrecondition(
                f"release {rid} lives in store {rec.store_id} ({echo(rec.store)}), not in this "
                f"store ({store_id}): serving it here would draw a second, independent noise "
                "path. Serve it with the store that holds it, or move it there with qveil admin "
                "export-release then import-release"
            )
        if rec.incarnation != incarnation:
            raise FailedPrecondition(
                f"this copy of store {store_id} is incarnation {incarnation[:12]}, but release "
                f"{rid} lives in incarnation {rec.incarnation[:12]} (since {rec.updated_at}): "
                "this copy was retired when another copy was adopted (qveil admin adopt-store), "
                "and answering here would draw a second noise path. Serve the adopted copy"
            )

    def set_status(self, release_id: str, status: str, *, action: str, **params: Any) -> None:
        """Change a release's lineage status (audited); NotFound when it is not registered."""
        if status not in STATUSES:
            raise InvalidArgument(f"status must be one of {STATUSES}, got {status!r}")
        R = T.registry_releases  # noqa: N806
        with self.db.write(LOCK) as conn:
            res = conn.execute(
                sa.update(R)
                .where(R.c.release_id == release_id)
                .values(status=status, updated_at=utc_now())
            )
            if res.rowcount != 1:
                raise NotFound(f"release {echo(release_id)} is not in the registry")
            audit_log.append(
                self.db,
                actor=self.actor,
                action=action,
                target=release_id,
                outcome="ok",
                params={"status": status, **params},
                conn=conn,
            )

    # -- witnessed chain heads -------------------------------------------------------------
    def publish(self, release_id: str, heads: Mapping[int, tuple[int, str]]) -> None:
        """Record each path's chain head (seq, hash) when it is ahead of the recorded one.
        Durable before it returns: a store answers only what this recorded. One statement
        (an upsert that keeps the higher seq, compiled once) for all the paths."""
        if not heads:
            return
        rows = [
            {"r": release_id, "p": path, "s": seq, "h": head}
            for path, (seq, head) in sorted(heads.items())
        ]
        with self.db.write(f"{LOCK}-heads") as conn:
            conn.execute(self._upsert_head, rows)

    @functools.cached_property
    def _upsert_head(self) -> Any:
        H = T.registry_heads  # noqa: N806
        insert = sqlite_insert if self.db.dialect == "sqlite" else pg_insert
        stmt = insert(H).values(
            release_id=sa.bindparam("r"),
            path=sa.bindparam("p"),
            seq=sa.bindparam("s"),
            head=sa.bindparam("h"),
        )
        return stmt.on_conflict_do_update(
            index_elements=[H.c.release_id, H.c.path],
            set_={"seq": stmt.excluded.seq, "head": stmt.excluded.head},
            where=H.c.seq < stmt.excluded.seq,
        )

    def heads(self, release_id: str) -> dict[int, tuple[int, str]]:
        H = T.registry_heads  # noqa: N806
        with self.db.read() as conn:
            rows = conn.execute(
                sa.select(H.c.path, H.c.seq, H.c.head).where(H.c.release_id == release_id)
            ).all()
        return {int(p): (int(s), str(h)) for p, s, h in rows}

    def witness_for(self, release_id: str) -> Any:
        """A store witness (``SamplePathStore.set_witness``) publishing into this registry."""

        def witness(rid: str, heads: dict[int, tuple[int, str]]) -> None:
            self.publish(rid, heads)

        return witness

    def behind(self, store: Any, release_id: str) -> list[str]:
        """What the store lacks of the witnessed heads of the release: one line per path
        whose chain does not reach the witnessed seq, or has another hash there (empty when
        the store holds everything ever answered)."""
        problems = []
        heads = self.heads(release_id)
        for path, (seq, head) in sorted(heads.items()):
            found = None
            count = 0
            for p in store.iter_points(release_id, path):
                count = p.seq
                if p.seq == seq:
                    found = p.hash
                    break
            if found is None:
                problems.append(
                    f"path {path}: the store's chain ends at seq {count}, but seq {seq} was "
                    "answered (points answered after this copy was made are missing)"
                )
            elif found != head:
                problems.append(
                    f"path {path}: the store's row at seq {seq} is not the answered one "
                    "(another draw: a forked copy)"
                )
        return problems

    # -- exports ---------------------------------------------------------------------------
    def issue_export(self, release_id: str, *, store_id: str, incarnation: str, token: str) -> str:
        """Record ``token`` as the single-use token of the release's export; the release
        becomes ``exported`` (answered nowhere until an import consumes the token)."""
        with self.db.write(LOCK) as conn:
            rec = self._lineage(conn, release_id)
            if rec is None:
                raise NotFound(
                    f"release {echo(release_id)} is not in the registry: only a registered "
                    "release can be moved"
                )
            self.check(rec, fingerprint=rec.fingerprint, store_id=store_id, incarnation=incarnation)
            now = utc_now()
            conn.execute(
                sa.insert(T.registry_exports).values(
                    token=token, release_id=release_id, from_store_id=store_id, issued_at=now
                )
            )
            R = T.registry_releases  # noqa: N806
            conn.execute(
                sa.update(R)
                .where(R.c.release_id == release_id)
                .values(status="exported", updated_at=now)
            )
            audit_log.append(
                self.db,
                actor=self.actor,
                action="export-release",
                target=release_id,
                outcome="ok",
                params={"from_store_id": store_id},
                conn=conn,
            )
        return token

    def check_export(self, token: str, *, release_id: str) -> None:
        """Refuse (FailedPrecondition, nothing written) a token that :meth:`consume_export`
        would refuse; the import checks it before it loads anything."""
        X = T.registry_exports  # noqa: N806
        with self.db.read() as conn:
            row = conn.execute(sa.select(X).where(X.c.token == token)).first()
        self._export_refusal(row, release_id)

    def _export_refusal(self, row: Any, release_id: str) -> None:
        if row is None or row.release_id != release_id:
            raise FailedPrecondition(
                f"the export of release {echo(release_id)} carries a token this registry "
                f"({echo(self.url)}) did not issue: import it with the registry its export "
                "was made with (QVEIL_REGISTRY or --registry)"
            )
        if row.consumed_at is not None:
            raise FailedPrecondition(
                f"this export of release {echo(release_id)} was already imported (into "
                f"{row.consumed_by}, at {row.consumed_at}): an export moves a release once, "
                "and a second import would draw a second noise path. Serve the store it "
                "was imported into"
            )

    def consume_export(
        self, token: str, *, release_id: str, store_id: str, incarnation: str, store: str
    ) -> LineageRecord:
        """Consume an export's token: the release now lives in this store incarnation. A token
        unknown here, of another release, or already consumed is refused (FailedPrecondition)."""
        X = T.registry_exports  # noqa: N806
        with self.db.write(LOCK) as conn:
            row = conn.execute(sa.select(X).where(X.c.token == token)).first()
            self._export_refusal(row, release_id)
            now = utc_now()
            conn.execute(
                sa.update(X)
                .where(X.c.token == token)
                .values(consumed_at=now, consumed_by=f"{store_id}:{incarnation}")
            )
            return self._bound(conn, "import-release", release_id, store_id, incarnation, store)

    # -- incarnations ----------------------------------------------------------------------
    def adopt(self, *, store_id: str, new: str, store: str, retired: list[str]) -> list[str]:
        """Move every bound release of ``store_id`` to incarnation ``new`` (an
        administrator's adoption of one copy of the store; every other copy is refused from
        now on); the ``retired`` ones are retired instead. Returns the releases moved.
        Audited with the actor."""
        R = T.registry_releases  # noqa: N806
        moved = []
        with self.db.write(LOCK) as conn:
            now = utc_now()
            for rid in retired:
                conn.execute(
                    sa.update(R)
                    .where(R.c.release_id == rid)
                    .values(status="retired", updated_at=now)
                )
            rows = conn.execute(
                sa.select(R.c.release_id).where(R.c.store_id == store_id, R.c.status == "bound")
            ).all()
            for (rid,) in rows:
                conn.execute(
                    sa.update(R)
                    .where(R.c.release_id == rid)
                    .values(incarnation=new, store=store, updated_at=now)
                )
                moved.append(str(rid))
            audit_log.append(
                self.db,
                actor=self.actor,
                action="adopt-store",
                target=store_id,
                outcome="ok",
                params={"incarnation": new, "moved": moved, "retired": retired},
                conn=conn,
            )
        return moved

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_registry(url: str | None = None, *, actor: str | None = None) -> Registry:
    """Open (creating and migrating it when new) the registry at ``url`` (default:
    :func:`default_registry_url`)."""
    url = url or default_registry_url()
    store = open_store(url, create=True)  # runs the migrations; a registry holds no noise
    try:
        registry_id = store.store_id
    finally:
        store.close()
    return Registry(
        open_admin_db(url), registry_id=registry_id, actor=actor or audit_log.default_actor()
    )
