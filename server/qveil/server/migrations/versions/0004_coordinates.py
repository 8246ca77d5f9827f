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
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from qveil.server.migrations.noise_points import COLUMNS, create_noise_points

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.add_column("releases", sa.Column("dims", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("releases", sa.Column("betas", sa.Text(), nullable=True))
    if op.get_bind().dialect.name == "sqlite":
        op.rename_table("noise_points", "noise_points_0003")
        create_noise_points("noise_points", coordinate=True, unique_x=True)
        op.execute(
            f"INSERT INTO noise_points ({COLUMNS}) "
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
