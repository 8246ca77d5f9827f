"""Initial schema: releases and noise_points."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from qveil.server.migrations.noise_points import create_noise_points

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "releases",
        sa.Column("release_id", sa.String(128), nullable=False),
        sa.Column("fingerprint", sa.String(256), nullable=False),
        sa.Column("sigma", sa.Double(), nullable=False),
        sa.Column("beta", sa.Double(), nullable=False),
        sa.Column("interval_lo", sa.Double(), nullable=False),
        sa.Column("interval_hi", sa.Double(), nullable=False),
        sa.Column("n_actions", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("status IN ('staged', 'active', 'retired')", name="ck_releases_status"),
        sa.CheckConstraint("n_actions >= 1", name="ck_releases_n_actions"),
        sa.PrimaryKeyConstraint("release_id", name="pk_releases"),
    )
    create_noise_points("noise_points", coordinate=False, unique_x=True)


def downgrade() -> None:
    op.drop_table("noise_points")
    op.drop_table("releases")
