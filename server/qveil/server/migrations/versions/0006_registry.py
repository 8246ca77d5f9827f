"""The registry's tables: where each release's noise lives, its witnessed chain heads, and the
single-use tokens of exports.

A registry is a qveil database of its own (``qveil.server.governance.registry``; by default
``$QVEIL_HOME/registry.sqlite``) that holds no noise: it is kept apart from the stores so that
a copy, clone or restored backup of a store does not carry it. Stores get the (empty) tables
too; only the registry writes them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.create_table(
        "registry_releases",
        sa.Column("release_id", sa.String(128), nullable=False),
        sa.Column("fingerprint", sa.String(128), nullable=False),
        sa.Column("store_id", sa.String(64), nullable=False),
        sa.Column("incarnation", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("store", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.String(40), nullable=False),
        sa.PrimaryKeyConstraint("release_id", name="pk_registry_releases"),
    )
    op.create_table(
        "registry_heads",
        sa.Column("release_id", sa.String(128), nullable=False),
        sa.Column("path", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("head", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("release_id", "path", name="pk_registry_heads"),
    )
    op.create_table(
        "registry_exports",
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("release_id", sa.String(128), nullable=False),
        sa.Column("from_store_id", sa.String(64), nullable=False),
        sa.Column("issued_at", sa.String(40), nullable=False),
        sa.Column("consumed_at", sa.String(40), nullable=True),
        sa.Column("consumed_by", sa.String(200), nullable=True),
        sa.PrimaryKeyConstraint("token", name="pk_registry_exports"),
    )


def downgrade() -> None:
    op.drop_table("registry_exports")
    op.drop_table("registry_heads")
    op.drop_table("registry_releases")
