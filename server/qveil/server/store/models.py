"""SQLAlchemy table metadata of the sample-path store (the schema Alembic migrates to).

Four tables. The admin records of :mod:`qveil.server.governance.admin_tables` are declared on this
``metadata`` too (that module imports this one, never the other way round); the migrations'
environment imports both, so Alembic sees every table:

* ``releases``: one row per released Q-function: the bundle fingerprint, the noise
  parameters (sigma, beta on [0, 1]), the raw state interval, the action count and a status.
* ``noise_points``: every noise value ever released, one row per (release, action,
  coordinate, x), never updated (a release of d coordinates has d 1-D paths per action,
  a 1-D release has coordinate 0 only). Below, "action" means (action,
  coordinate). ``seq`` is the per-(release, action) insertion sequence (1, 2, 3, ... in commit
  order, assigned under the per-action lock), ``hash`` the integrity chain link over
  (seq, x, g, previous hash) (:mod:`qveil.server.store.integrity`), ``created_at`` unix
  seconds (UTC). The table is an **append log** (migration 0005): its only key is the
  primary key (release, action, coordinate, seq), the log order, so a commit appends at the
  end of its path's key range and its cost does not grow with the stored points. There is
  no index on x: every SQL read is a seq range of one path; neighbours and exact states are
  looked up in the store's in-process copy of the path. "One value per state" is decided
  there, under the path's write lock, after the writer has read every row with seq above its
  high-water mark; a writer that missed a row collides with it on the primary key (its seqs
  start right after its high-water mark) and retries (:mod:`qveil.server.store.base`). A
  second row for one state can only come from a bug or from tampering: loading the path
  refuses it and ``verify`` / ``qveil audit`` report it.

``store_meta`` holds the store's random identity (and, in a registry, its signing key).

Floats are IEEE doubles on both backends (``Double``: SQLite REAL, PostgreSQL DOUBLE PRECISION),
so a stored x or g round-trips bit for bit, but for the sign of a zero: SQLite stores -0.0 as
0.0. A stored x is a grid point (index * 2^-K, never -0.0); a g of exactly zero has
probability zero under the path's Gaussian law.
"""

from __future__ import annotations

from typing import TypeAlias

import sqlalchemy as sa

__all__ = [
    "RELEASE_STATUSES",
    "STORE_ID_KEY",
    "TableRow",
    "metadata",
    "noise_points",
    "releases",
    "store_meta",
]

#: A row of a select of whole tables or columns of these (or the admin tables): its values
#: of any type, each read by column name (SQLAlchemy types a Core table's columns untyped).
TableRow: TypeAlias = sa.Row[*tuple[object, ...]]

#: ``store_meta`` key of the store's random, persistent identity (created with the store).
STORE_ID_KEY = "store_id"

#: Allowed values of ``releases.status``.
RELEASE_STATUSES = ("staged", "active", "retired")

metadata = sa.MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)

releases = sa.Table(
    "releases",
    metadata,
    sa.Column("release_id", sa.String(128), primary_key=True),
    sa.Column("fingerprint", sa.String(256), nullable=False),
    sa.Column("sigma", sa.Double(), nullable=False),
    sa.Column("beta", sa.Double(), nullable=False),
    sa.Column("interval_lo", sa.Double(), nullable=False),
    sa.Column("interval_hi", sa.Double(), nullable=False),
    sa.Column("n_actions", sa.Integer(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    # migration 0004: coordinates of the state and their OU rates (a JSON list,
    # NULL for a 1-D release, whose rate is ``beta``)
    sa.Column("dims", sa.Integer(), nullable=False, server_default="1"),
    sa.Column("betas", sa.Text(), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('staged', 'active', 'retired')", name="status"),
    sa.CheckConstraint("n_actions >= 1", name="n_actions"),
)

noise_points = sa.Table(
    "noise_points",
    metadata,
    sa.Column("release_id", sa.String(128), sa.ForeignKey("releases.release_id"), primary_key=True),
    sa.Column("action", sa.Integer(), primary_key=True),
    # migration 0004: the state coordinate j of the 1-D path g_{action,j}; 0 for
    # every point of a 1-D release
    sa.Column("coordinate", sa.Integer(), primary_key=True, server_default="0"),
    sa.Column("seq", sa.BigInteger(), primary_key=True),
    sa.Column("x", sa.Double(), nullable=False),
    sa.Column("g", sa.Double(), nullable=False),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("hash", sa.String(64), nullable=False),
    # no unique (release, action, coordinate, x) since migration 0005 (an append log: see
    # the module docstring for what keeps one value per state)
    # SQLite: the rows live in the primary-key B-tree (no separate rowid tree + PK index),
    # so an insert updates one B-tree, at its right edge for the path
    sqlite_with_rowid=False,
)

#: Facts about the store itself; ``store_id`` (a random uuid written by migration 0003 when the
#: store is created) names this database (a registry's id, the integrity key's check value).
store_meta = sa.Table(
    "store_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text(), nullable=False),
)
