"""States with several coordinates: the noise path of (action, coordinate).

A release of d coordinates has, per action, d independent 1-D OU paths g_{a,j} (the additive
noise kernel sum_j exp(-beta_j |x_j - y_j|)); every stored point now names its coordinate.

* ``releases`` gets ``dims`` (1 for every existing release) and ``betas`` (a JSON list of the
  per-coordinate OU rates as float hex strings, bit for bit; NULL for a 1-D release).
* ``noise_points`` gets ``coordinate`` (0 for every existing row) in its primary key
  (release, action, coordinate, seq) and its unique key (release, action, coordinate, x).
  Existing rows keep their values, seqs and chain hashes unchanged, so 1-D releases keep
  working bit for bit. SQLite cannot alter a primary key: the table is rebuilt (same rows,
  WITHOUT ROWID as before); PostgreSQL alters it in place.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_COLS = "release_id, action, coordinate, seq, x, g, created_at, hash"


def _points_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("release_id", sa.String(128), nullable=False),
        sa.Column("action", sa.Integer(), nullable=False),
        sa.Column("coordinate", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("x", sa.Double(), nullable=False),
        sa.Column("g", sa.Double(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["release_id"], ["releases.release_id"], name="fk_noise_points_release_id_releases"
        ),
        sa.PrimaryKeyConstraint(
            "release_id", "action", "coordinate", "seq", name="pk_noise_points"
        ),
        sa.UniqueConstraint(
            "release_id",
            "action",
            "coordinate",
            "x",
            name="uq_noise_points_release_id_action_coordinate_x",
        ),
        sqlite_with_rowid=False,
    )


def upgrade() -> None:
    op.add_column("releases", sa.Column("dims", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("releases", sa.Column("betas", sa.Text(), nullable=True))
    if op.get_bind().dialect.name == "sqlite":
        op.rename_table("noise_points", "noise_points_0003")
        _points_table("noise_points")
        op.execute(
            f"INSERT INTO noise_points ({_COLS}) "
            "SELECT release_id, action, 0, seq, x, g, created_at, hash FROM noise_points_0003"
        )
        op.drop_table("noise_points_0003")
        return
    op.add_column(
        "noise_points",
        sa.Column("coordinate", sa.Integer(), nullable=False, server_default="0"),
    )
    op.drop_constraint("uq_noise_points_release_id_action_x", "noise_points", type_="unique")
    op.drop_constraint("pk_noise_points", "noise_points", type_="primary")
    op.create_primary_key(
        "pk_noise_points", "noise_points", ["release_id", "action", "coordinate", "seq"]
    )
    op.create_unique_constraint(
        "uq_noise_points_release_id_action_coordinate_x",
        "noise_points",
        ["release_id", "action", "coordinate", "x"],
    )


def downgrade() -> None:
    raise NotImplementedError("0004 is not reversible: coordinates > 0 have no 1-D form")
