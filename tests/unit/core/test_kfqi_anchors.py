"""Public anchor sets of the kernel fqi estimator's ``file`` layout (qveil.kfqi_anchors):
placed deterministically from public states (the same bits on every build), used as they
are whatever the training data, written and read back bit for bit, and refused when they
cannot be the config's public anchors. (D_T with this layout: the adversarial and brute-force
tests of tests/unit/core/test_kfqi.py run it too.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qveil.additive import StateBox
from qveil.errors import InvalidArgument, NotFound
from qveil.kfqi import Anchors, KernelFQISpec, build_operators_nd, iterate_q_nd
from qveil.kfqi_anchors import (
    FORMAT,
    check_anchor_intervals,
    read_anchors,
    visitation_points,
    write_anchors,
)
from qveil.kfqi_config import KernelFQIConfig, load_fqi_config
from qveil.kfqi_spec import points_sha256
from qveil.transitions import Transitions

BOX = [[-1.0, 1.0], [0.0, 2.0]]


def _public_states(seed: int = 11, n: int = 4000) -> np.ndarray:
    """Unit states concentrated like random-policy visitation (a public draw)."""
    return np.random.default_rng(seed).beta(2.0, 4.0, (n, 2))


def test_visitation_points_are_the_same_bits_every_build() -> None:
    states = _public_states()
    a = visitation_points(states, 40)
    b = visitation_points(states.copy(), 40)
    assert a.tobytes() == b.tobytes() and points_sha256(a) == points_sha256(b)
    assert a.shape == (40, 2) and (a >= 0).all() and (a <= 1).all()
    assert len(np.unique(a, axis=0)) == 40
    # sorted, so their order is not the draw's; another seed places other points
    assert (np.lexsort(a.T[::-1]) == np.arange(40)).all()
    assert points_sha256(visitation_points(states, 40, seed=8)) != points_sha256(a)
    # the subsample: at most max_states states enter, drawn with the same public seed
    c = visitation_points(states, 40, max_states=1000)
    assert c.tobytes() == visitation_points(states, 40, max_states=1000).tobytes()


def test_visitation_points_sit_where_the_states_are() -> None:
    """Anchors are denser where the states are: nearer to a typical state than a uniform
    layout of the same K."""
    from scipy.spatial import cKDTree

    states = _public_states()
    pts = visitation_points(states, 64)
    uniform = np.stack(np.meshgrid(*[np.linspace(0, 1, 8)] * 2), axis=-1).reshape(-1, 2)
    near = cKDTree(pts).query(states)[0].mean()
    assert near < 0.7 * cKDTree(uniform).query(states)[0].mean()


def test_the_anchors_do_not_depend_on_the_training_data() -> None:
    """The spec holds the file's points; two different datasets are fitted on exactly those
    anchors (Anchors(spec).points bit for bit), and the operators' key names the points'
    hash, not the data."""
    pts = visitation_points(_public_states(), 32)
    spec = KernelFQISpec(gamma=0.6, iterations=4, betas=(2.0, 2.0), anchors="file",
                         anchor_set=pts, neighbours=6, bandwidth=0.2, default=0.0)  # fmt: skip
    assert Anchors(spec).points.tobytes() == pts.tobytes() and spec.anchor_total == 32
    assert spec.anchor_sha256 == points_sha256(pts)
    box = StateBox.of([[0.0, 1.0]] * 2)
    keys, qs = [], []
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        n = 200
        s, s2 = rng.uniform(0, 1, (n, 2)), rng.uniform(0, 1, (n, 2))
        rows = Transitions(
            s=s, a=rng.integers(0, 2, n), r=rng.uniform(0, 1, n), s2=s2,
            terminal=np.zeros(n, bool), user=np.repeat(np.arange(50), 4),
        )  # fmt: skip
        ops = build_operators_nd(rows, n_actions=2, reward_range=(0.0, 1.0), box=box, spec=spec)
        keys.append(ops.key)
        qs.append(iterate_q_nd(ops, spec=spec))
    assert keys[0] == keys[1] and spec.anchor_sha256 in keys[0]
    assert qs[0].shape == qs[1].shape == (32, 2) and not np.array_equal(qs[0], qs[1])
    # the spec keeps its own read-only copy: changing the caller's array changes nothing
    pts[0, 0] = 0.5
    assert spec.anchor_sha256 != points_sha256(pts)
    with pytest.raises(ValueError):
        spec.anchor_set[0, 0] = 0.5  # type: ignore[index]


def test_written_anchors_read_back_bit_for_bit(tmp_path: Path) -> None:
    pts = visitation_points(_public_states(), 24)
    a = write_anchors(tmp_path / "a.npz", points=pts, state_intervals=BOX, origin="public draw")
    assert a.points.tobytes() == pts.tobytes() and a.sha256 == points_sha256(pts)
    assert a.record() == {"sha256": a.sha256, "origin": "public draw", "anchors": 24,
                          "points": pts.tolist()}  # fmt: skip
    b = read_anchors(tmp_path / "a.npz")
    assert b.points.tobytes() == pts.tobytes() and b.record() == a.record()
    assert b.state_intervals == ((-1.0, 1.0), (0.0, 2.0))
    check_anchor_intervals(b, BOX)
    with pytest.raises(InvalidArgument, match="state intervals"):
        check_anchor_intervals(b, [[-1.0, 1.0], [0.0, 3.0]])


@pytest.mark.parametrize(
    ("points", "match"),
    [
        (np.full((4, 2), 1.5), "unit box"),
        (np.full((4, 2), np.nan), "unit box"),
        (np.zeros((4, 3)), r"\(K, 2\)"),
    ],
)
def test_anchor_files_outside_the_unit_box_are_refused(
    tmp_path: Path, points: np.ndarray, match: str
) -> None:
    with pytest.raises(InvalidArgument, match=match):
        write_anchors(tmp_path / "a.npz", points=points, state_intervals=BOX, origin="x")
    assert list(tmp_path.iterdir()) == []


def test_unreadable_or_existing_anchor_files_are_refused(tmp_path: Path) -> None:
    pts = visitation_points(_public_states(), 8)
    write_anchors(tmp_path / "a.npz", points=pts, state_intervals=BOX, origin="x")
    with pytest.raises(InvalidArgument, match="already exists"):
        write_anchors(tmp_path / "a.npz", points=pts, state_intervals=BOX, origin="x")
    with pytest.raises(InvalidArgument, match=r"\.npz"):
        write_anchors(tmp_path / "a.txt", points=pts, state_intervals=BOX, origin="x")
    with pytest.raises(NotFound):
        read_anchors(tmp_path / "none.npz")
    np.savez(tmp_path / "other.npz", values=np.zeros(3))
    with pytest.raises(InvalidArgument, match="not a qveil anchor file"):
        read_anchors(tmp_path / "other.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(InvalidArgument, match="not a readable anchor file"):
        read_anchors(tmp_path / "junk.npz")
    bad = {"format": np.array(FORMAT), "points": pts, "origin": np.array("x")}
    np.savez(tmp_path / "flat.npz", state_intervals=np.zeros(3), **bad)
    with pytest.raises(InvalidArgument, match=r"anchor file .* is malformed: state intervals"):
        read_anchors(tmp_path / "flat.npz")


def test_specs_and_configs_refuse_an_anchor_set_that_cannot_be_the_layout(
    tmp_path: Path,
) -> None:
    pts = visitation_points(_public_states(), 8)
    base = {"gamma": 0.5, "iterations": 2, "betas": (2.0, 2.0)}
    with pytest.raises(InvalidArgument, match="anchor_set"):
        KernelFQISpec(**base, anchors="file")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="anchor_set"):
        KernelFQISpec(**base, anchor_set=pts)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="between neighbours"):
        KernelFQISpec(**base, anchors="file", anchor_set=pts, neighbours=9)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"\(K, 2\)"):
        KernelFQISpec(**base, anchors="file", anchor_set=pts[:, :1], neighbours=2)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="anchor_file"):
        KernelFQIConfig(anchors="file")
    with pytest.raises(InvalidArgument, match="anchor_file"):
        KernelFQIConfig(anchor_file="a.npz")
    # a config file's relative anchor_file is relative to the file
    write_anchors(tmp_path / "a.npz", points=pts, state_intervals=BOX, origin="x")
    (tmp_path / "sub").mkdir()
    cfg_path = tmp_path / "sub" / "c.toml"
    cfg_path.write_text(
        'estimator = "kernel"\nanchors = "file"\nanchor_file = "../a.npz"\nneighbours = 4\n'
        "state_intervals = [[-1.0, 1.0], [0.0, 2.0]]\n"
    )
    cfg = load_fqi_config(cfg_path)
    assert Path(str(cfg.anchor_file)).resolve() == (tmp_path / "a.npz").resolve()
    spec = cfg.spec(2)
    assert spec.anchor_total == 8 and spec.anchor_sha256 == points_sha256(pts)
