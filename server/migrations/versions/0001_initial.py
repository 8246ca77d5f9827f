"""Initial schema: releases and noise_points.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


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
    op.create_table(
        "noise_points",
        sa.Column("release_id", sa.String(128), nullable=False),
        sa.Column("action", sa.Integer(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("x", sa.Double(), nullable=False),
        sa.Column("g", sa.Double(), nullable=False),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["release_id"], ["releases.release_id"], name="fk_noise_points_release_id_releases"
        ),
        sa.PrimaryKeyConstraint("release_id", "action", "seq", name="pk_noise_points"),
        sa.UniqueConstraint(
            "release_id", "action", "x", name="uq_noise_points_release_id_action_x"
        ),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("noise_points")
    op.drop_table("releases")
