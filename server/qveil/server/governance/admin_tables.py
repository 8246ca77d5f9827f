"""SQLAlchemy tables of the admin records: the privacy ledger, its caps, the admin audit log and
the bundle directory of each release registered by ``qveil admin retrain``.

They live in the sample-path store's database and are declared on the store's own ``MetaData``
(``qveil.server.store.models``), so that one Alembic history (migration
``0002_ledger_audit``) creates them and ``compare_metadata`` stays empty. Every table is
append-only by contract: rows are inserted, never updated or deleted, and each row carries a
hash link (``qveil.server.governance.hashchain``) so that an edit is detected.

Timestamps are ISO-8601 UTC text (microseconds), hashed exactly as stored.
"""

from __future__ import annotations

import sqlalchemy as sa

from qveil.server.store.models import metadata

__all__ = [
    "audit_log",
    "ledger_caps",
    "ledger_events",
    "metadata",
    "release_bundles",
]

_HASH = sa.String(64)


def _dataset_chain(name: str, *own: sa.Column[object]) -> sa.Table:  # columns of any type
    """A table of one hash chain per dataset: keyed (dataset, seq 1, 2, ...), the row's own
    columns, then its time and its link (the previous row's hash, its own)."""
    return sa.Table(
        name,
        metadata,
        sa.Column("dataset_id", sa.String(200), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        *own,
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("prev_hash", _HASH, nullable=False),
        sa.Column("hash", _HASH, nullable=False),
    )


#: One row per privacy event (``qveil.privacy.PrivacyEvent`` as canonical JSON) per dataset,
#: chained per dataset in ``seq`` order (1, 2, ...).
ledger_events = _dataset_chain(
    "ledger_events",
    sa.Column("release_id", sa.String(128), nullable=True),
    sa.Column("bundle_id", sa.String(200), nullable=True),
    sa.Column("event_json", sa.Text, nullable=False),
    sa.Column("epsilon", sa.Double(), nullable=False),
    sa.Column("delta", sa.Double(), nullable=False),
)

#: The cap of each dataset, as an append-only history chained per dataset; the newest row rules.
ledger_caps = _dataset_chain(
    "ledger_caps",
    sa.Column("cap_epsilon", sa.Double(), nullable=False),
    sa.Column("cap_delta", sa.Double(), nullable=False),
    sa.Column("actor", sa.String(200), nullable=False),
)

#: Admin audit log: who did what, when, with which outcome; one global chain in ``seq`` order.
#: Never holds tokens or noise values (``qveil.server.governance.audit_log`` refuses such fields).
audit_log = sa.Table(
    "admin_audit_log",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("at", sa.String(40), nullable=False),
    sa.Column("actor", sa.String(200), nullable=False),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("target", sa.String(200), nullable=False),
    sa.Column("params_json", sa.Text, nullable=False),
    sa.Column("outcome", sa.String(16), nullable=False),
    sa.Column("detail", sa.Text, nullable=False),
    sa.Column("prev_hash", _HASH, nullable=False),
    sa.Column("hash", _HASH, nullable=False),
    sa.Index("ix_admin_audit_log_action", "action"),
)

#: Where the bundle of each release registered by ``qveil admin retrain`` lives, and which
#: dataset's budget paid for it (the server activates a release from its bundle directory).
release_bundles = sa.Table(
    "release_bundles",
    metadata,
    sa.Column("release_id", sa.String(128), primary_key=True),
    sa.Column("dataset_id", sa.String(200), nullable=False),
    sa.Column("bundle_path", sa.Text, nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
)
