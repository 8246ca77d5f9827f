"""One release, one store: the store's identity and its release bindings.

``store_meta`` gets one row, ``store_id``: a random uuid drawn when this migration runs, i.e.
when the store is created (or first upgraded to 0003). A bundle served from this store records
that id in its ``binding.json``; a store with another id (a new, empty, re-created or different
database) does not hold the bundle's noise and is refused. ``release_bindings`` records the
fingerprint of every release bound to this store.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    meta = op.create_table(
        "store_meta",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_store_meta"),
    )
    op.bulk_insert(meta, [{"key": "store_id", "value": uuid.uuid4().hex}])
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


def downgrade() -> None:
    op.drop_table("release_bindings")
    op.drop_table("store_meta")
