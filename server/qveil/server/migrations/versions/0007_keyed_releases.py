"""Keyed releases: the tables of the bookkeeping that one key per release makes unnecessary.

A release's noise is a pure function of its key (``qveil.keyed``), so a store is a log of
what was answered, not the one place its noise lives: ``release_bindings`` (a release bound to
one store), and the registry's ``registry_releases`` (lineage and store incarnations),
``registry_heads`` (witnessed chain heads) and ``registry_exports`` (single-use export tokens)
are dropped, with the incarnation keys of ``store_meta``. The ledger, its caps and the audit
log stay. A downgrade recreates the tables empty.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.drop_table("registry_exports")
    op.drop_table("registry_heads")
    op.drop_table("registry_releases")
    op.drop_table("release_bindings")
    meta = sa.table("store_meta", sa.column("key", sa.String))
    op.execute(meta.delete().where(meta.c.key.in_(["incarnation", "physical_identity"])))


def downgrade() -> None:
    op.create_table(
        "release_bindings",
        sa.Column("release_id", sa.String(128), nullable=False),
        sa.Column("fingerprint", sa.String(128), nullable=False),
        sa.Column("bound_at", sa.String(40), nullable=False),
        sa.Column("origin_store_id", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["release_id"],
            ["releases.release_id"],
            name="fk_release_bindings_release_id_releases",
        ),
        sa.PrimaryKeyConstraint("release_id", name="pk_release_bindings"),
    )
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
