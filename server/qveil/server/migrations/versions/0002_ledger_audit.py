"""Admin records: privacy ledger, ledger caps, admin audit log, release bundles.

The tables are declared in :mod:`qveil.server.governance.admin_tables` on the store's MetaData; this
migration creates exactly that schema (Alembic ``compare_metadata`` stays empty). All four
tables are append-only by contract and hash-chained (see the module docstrings).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def _dataset_chain(name: str, *own: sa.Column[object]) -> None:  # columns of any type
    """A hash-chained table of per-dataset rows: (dataset, seq), its own columns, the time
    and the chain hashes."""
    op.create_table(
        name,
        sa.Column("dataset_id", sa.String(200), nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        *own,
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("dataset_id", "seq", name=f"pk_{name}"),
    )


def upgrade() -> None:
    _dataset_chain(
        "ledger_events",
        sa.Column("release_id", sa.String(128), nullable=True),
        sa.Column("bundle_id", sa.String(200), nullable=True),
        sa.Column("event_json", sa.Text(), nullable=False),
        sa.Column("epsilon", sa.Double(), nullable=False),
        sa.Column("delta", sa.Double(), nullable=False),
    )
    _dataset_chain(
        "ledger_caps",
        sa.Column("cap_epsilon", sa.Double(), nullable=False),
        sa.Column("cap_delta", sa.Double(), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
    )
    op.create_table(
        "admin_audit_log",
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("at", sa.String(40), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(200), nullable=False),
        sa.Column("params_json", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_admin_audit_log"),
    )
    op.create_index("ix_admin_audit_log_action", "admin_audit_log", ["action"])
    op.create_table(
        "release_bundles",
        sa.Column("release_id", sa.String(128), nullable=False),
        sa.Column("dataset_id", sa.String(200), nullable=False),
        sa.Column("bundle_path", sa.Text(), nullable=False),
        sa.Column("created_at", sa.String(40), nullable=False),
        sa.PrimaryKeyConstraint("release_id", name="pk_release_bundles"),
    )


def downgrade() -> None:
    op.drop_table("release_bundles")
    op.drop_index("ix_admin_audit_log_action", table_name="admin_audit_log")
    op.drop_table("admin_audit_log")
    op.drop_table("ledger_caps")
    op.drop_table("ledger_events")
