"""The ``noise_points`` table as the migrations create it: 0001 (one coordinate, unique x per
path), and the SQLite rebuilds of 0004 (a coordinate in both keys) and 0005 (no unique x; its
downgrade restores it). SQLite cannot alter a primary key or drop a constraint, so those
migrations create the table anew under the same constraint names and copy the rows.

Frozen: a later change to the table is a new migration with its own description, never an
edit here (an edit would change what the old migrations create)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import SchemaItem

__all__ = ["COLUMNS", "create_noise_points"]

#: the columns of every noise_points row since 0004, in table order (for INSERT ... SELECT)
COLUMNS = "release_id, action, coordinate, seq, x, g, created_at, hash"


def create_noise_points(name: str, *, coordinate: bool, unique_x: bool) -> None:
    """Create the table ``name``: keyed (release, action[, coordinate], seq), rows in the
    primary-key B-tree (SQLite WITHOUT ROWID), with the unique (release, action[, coordinate],
    x) when ``unique_x``."""
    # in table order: SQLAlchemy writes the constraints in the order they were made
    path = ["release_id", "action", *(["coordinate"] if coordinate else [])]
    items: list[SchemaItem] = [
        sa.Column("release_id", sa.String(128), nullable=False),
        sa.Column("action", sa.Integer(), nullable=False),
    ]
    if coordinate:
        items.append(sa.Column("coordinate", sa.Integer(), nullable=False, server_default="0"))
    items += [
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("x", sa.Double(), nullable=False),
        sa.Column("g", sa.Double(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["release_id"], ["releases.release_id"], name="fk_noise_points_release_id_releases"
        ),
        sa.PrimaryKeyConstraint(*path, "seq", name="pk_noise_points"),
    ]
    if unique_x:
        items.append(sa.UniqueConstraint(*path, "x", name=f"uq_noise_points_{'_'.join(path)}_x"))
    op.create_table(name, *items, sqlite_with_rowid=False)
