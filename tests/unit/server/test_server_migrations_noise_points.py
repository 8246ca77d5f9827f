"""The ``noise_points`` table as the migrations create it
(qveil.server.migrations.noise_points), created through Alembic's operations on a real SQLite
file in each of its forms: its columns in table order (COLUMNS, what the rebuilds copy), its
primary key, the unique x of the old forms, the foreign key, rows in the key's B-tree."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.migration import MigrationContext
from alembic.operations import Operations

from qveil.server.migrations.noise_points import COLUMNS, create_noise_points
from qveil.server.store import models


def _create(tmp_path: Path, *, coordinate: bool, unique_x: bool) -> sa.Engine:
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'm.sqlite'}")
    with eng.begin() as conn, Operations.context(MigrationContext.configure(conn)):
        create_noise_points("noise_points", coordinate=coordinate, unique_x=unique_x)
    return eng


@pytest.mark.parametrize(("coordinate", "unique_x"), [(False, True), (True, True), (True, False)])
def test_each_form(tmp_path: Path, coordinate: bool, unique_x: bool) -> None:
    eng = _create(tmp_path, coordinate=coordinate, unique_x=unique_x)
    insp = sa.inspect(eng)
    path = ["release_id", "action", *(["coordinate"] if coordinate else [])]
    cols = [c["name"] for c in insp.get_columns("noise_points")]
    assert cols == [*path, "seq", "x", "g", "created_at", "hash"]
    pk = insp.get_pk_constraint("noise_points")
    assert pk["name"] == "pk_noise_points" and pk["constrained_columns"] == [*path, "seq"]
    uniques = insp.get_unique_constraints("noise_points")
    if unique_x:
        assert uniques == [
            {"name": f"uq_noise_points_{'_'.join(path)}_x", "column_names": [*path, "x"]}
        ]
    else:
        assert uniques == []
    [fk] = insp.get_foreign_keys("noise_points")
    assert fk["name"] == "fk_noise_points_release_id_releases"
    assert (fk["referred_table"], fk["referred_columns"]) == ("releases", ["release_id"])
    with eng.connect() as c:
        sql = c.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name='noise_points'").scalar()
    assert str(sql).rstrip().endswith("WITHOUT ROWID")


def test_a_second_value_at_one_state_is_refused_only_by_the_old_forms(tmp_path: Path) -> None:
    for unique_x, refused in ((True, True), (False, False)):
        d = tmp_path / str(unique_x)
        d.mkdir()
        eng = _create(d, coordinate=True, unique_x=unique_x)
        row = "('r', 0, 0, {seq}, 0.5, 0.1, 0.0, 'h')"
        with eng.begin() as c:
            c.exec_driver_sql(f"INSERT INTO noise_points VALUES {row.format(seq=1)}")
        if refused:
            with pytest.raises(sa.exc.IntegrityError), eng.begin() as c:
                c.exec_driver_sql(f"INSERT INTO noise_points VALUES {row.format(seq=2)}")
        else:
            with eng.begin() as c:
                c.exec_driver_sql(f"INSERT INTO noise_points VALUES {row.format(seq=2)}")
        with eng.connect() as c:
            n = c.exec_driver_sql("SELECT count(*) FROM noise_points").scalar()
        assert n == (1 if refused else 2)


def test_the_copied_columns_are_the_models(tmp_path: Path) -> None:
    assert COLUMNS.split(", ") == [c.name for c in models.noise_points.columns]
