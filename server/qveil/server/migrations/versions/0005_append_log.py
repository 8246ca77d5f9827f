"""noise_points becomes an append log: drop the unique (release, action, coordinate, x).

Why. The unique constraint was a B-tree keyed by a random x: a commit of 100 new points
dirtied about min(100, leaf pages) of its leaves (19 WAL pages per commit at 1e3 stored
points, ~107 at 1e6), so the cost of a new point grew with the store. The table itself
(WITHOUT ROWID, primary key (release, action, coordinate, seq)) is appended in seq order and
costs ~8 pages per 100-row commit at any size. Nothing reads through the x index: every SQL
read of the store is a seq range of one path (catch-up ``seq > hw``, the confirm re-select,
the head, export and audit in seq order); neighbours and exact states are looked up in the
in-process copy of the path.

What keeps "one value per state" without it:

* the decision is made, as before, by the in-process copy of the path under the path's write
  lock (SQLite ``BEGIN IMMEDIATE``, PostgreSQL ``pg_advisory_xact_lock`` per path), after the
  writer has read every row with seq > its high-water mark: a state found there is answered,
  never drawn again;
* a writer that missed a row is still stopped by the database: its seqs are high-water + 1..,
  and the primary key (release, action, coordinate, seq) is unique, so its first row collides
  with the row it missed (``ON CONFLICT DO NOTHING``, then the confirm re-select sees a row
  that is not its own: rollback, re-read, retry);
* so a second row for one state can only come from a bug or from tampering; loading a path
  refuses it (IntegrityError "stored twice", nothing written), ``verify`` and ``qveil audit``
  report it, and a server refuses to start on such a release.

Every row keeps its seq, x, g, created_at and chain hash bit for bit. SQLite cannot drop a
constraint: the table is rebuilt (same columns, primary key and WITHOUT ROWID, rows copied
in primary-key order); PostgreSQL drops the constraint in place. The downgrade restores the
constraint (it fails, changing nothing, if some state is stored twice).
"""

from __future__ import annotations

from alembic import op

from qveil.server.migrations.noise_points import COLUMNS, create_noise_points

revision = "0005"
down_revision = "0004"

_UQ = "uq_noise_points_release_id_action_coordinate_x"


def _rebuild_sqlite(*, unique_x: bool) -> None:
    """SQLite: the same rows in a new table with (or without) the unique x constraint."""
    op.rename_table("noise_points", "noise_points_old")
    create_noise_points("noise_points", coordinate=True, unique_x=unique_x)
    op.execute(
        f"INSERT INTO noise_points ({COLUMNS}) SELECT {COLUMNS} FROM noise_points_old "
        "ORDER BY release_id, action, coordinate, seq"
    )
    op.drop_table("noise_points_old")


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(unique_x=False)
        return
    op.drop_constraint(_UQ, "noise_points", type_="unique")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_sqlite(unique_x=True)
        return
    op.create_unique_constraint(_UQ, "noise_points", ["release_id", "action", "coordinate", "x"])
