"""qveil.npz_file: an .npz written whole or not at all, no temporary file left behind; a qveil
.npz file read back whole, refused with its reason when it is not one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qveil.errors import InvalidArgument, NotFound
from qveil.npz_file import read_npz_members, write_npz_atomic


def test_the_file_holds_every_array(tmp_path: Path) -> None:
    out = tmp_path / "x.npz"
    write_npz_atomic(out, {"a": np.arange(3.0), "name": np.array("public")})
    with np.load(out, allow_pickle=False) as z:
        assert z["a"].tolist() == [0.0, 1.0, 2.0] and str(z["name"]) == "public"
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "x.npz"
    write_npz_atomic(out, {"a": np.zeros(2)})
    before = out.read_bytes()

    class Broken:
        def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
            raise RuntimeError("cannot become an array")

    with pytest.raises(RuntimeError):
        write_npz_atomic(out, {"a": np.ones(2), "b": Broken()})  # type: ignore[dict-item]
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]


def test_a_new_npz_path_is_refused_with_the_reason(tmp_path: Path) -> None:
    from qveil.errors import InvalidArgument, NotFound
    from qveil.npz_file import new_npz_path

    assert new_npz_path(tmp_path / "p.npz", "prior file") == tmp_path / "p.npz"
    with pytest.raises(InvalidArgument, match="an anchor file must end in .npz"):
        new_npz_path(tmp_path / "a.txt", "anchor file")
    (tmp_path / "p.npz").write_bytes(b"")
    with pytest.raises(InvalidArgument, match="prior file .* already exists"):
        new_npz_path(tmp_path / "p.npz", "prior file")
    with pytest.raises(NotFound, match="does not exist"):
        new_npz_path(tmp_path / "no" / "p.npz", "prior file")


def test_a_qveil_file_is_read_back_whole(tmp_path: Path) -> None:
    out = tmp_path / "x.npz"
    write_npz_atomic(out, {"format": np.array("f1"), "a": np.arange(3.0), "extra": np.ones(1)})
    got = read_npz_members(out, "test file", fmt="f1", required=("a",))
    assert sorted(got) == ["a", "extra", "format"] and got["a"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    ("arrays", "match"),
    [
        ({"a": np.zeros(1)}, "is not a qveil test file \\(missing format\\)"),
        ({"format": np.array("f1")}, r"\(missing a\)$"),
        ({"format": np.array("f2"), "a": np.zeros(1)}, "format must be 'f1', got 'f2'"),
        ({"format": np.array(["f1", "f1"]), "a": np.zeros(1)}, "got '\\?'"),
    ],
)
def test_a_file_that_is_not_one_is_refused_with_its_reason(
    tmp_path: Path, arrays: dict[str, np.ndarray], match: str
) -> None:
    out = tmp_path / "x.npz"
    np.savez(out, **arrays)
    with pytest.raises(InvalidArgument, match=match):
        read_npz_members(out, "test file", fmt="f1", required=("a",))


def test_a_missing_or_unreadable_or_pickled_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="test file .*none.npz' does not exist"):
        read_npz_members(tmp_path / "none.npz", "test file", fmt="f1", required=())
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InvalidArgument, match="is not a readable test file"):
        read_npz_members(tmp_path / "junk.npz", "test file", fmt="f1", required=())
    np.savez(tmp_path / "p.npz", format=np.array("f1"), a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(InvalidArgument, match="is not a readable test file"):
        read_npz_members(tmp_path / "p.npz", "test file", fmt="f1", required=("a",))
