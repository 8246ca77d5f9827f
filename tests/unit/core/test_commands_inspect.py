"""``qveil inspect`` (qveil.commands.inspect) in this process: the un-noised mean function of
a bundle on an even grid (each coordinate swept, the others centred), as JSON or a table;
a grid outside [2, 1000000] refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import qveil_main
from server_helpers import small_network_bundle

from qveil.bundle import load_bundle


@pytest.fixture(scope="module")
def network_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A d = 1 output-mode network release on the interval [-1, 3]."""
    return small_network_bundle(
        tmp_path_factory.mktemp("inspect") / "b", weights_seed=0, sigma=2.0, interval=(-1.0, 3.0)
    )


def test_json_is_the_mean_on_the_grid(network_bundle: Path) -> None:
    r = qveil_main("inspect", "--bundle", str(network_bundle), "--grid", "5", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    b = load_bundle(network_bundle)
    assert out["release_id"] == b.bundle_id and out["mode"] == "output"
    np.testing.assert_allclose(out["states"], [[-1.0], [0.0], [1.0], [2.0], [3.0]])
    np.testing.assert_allclose(out["mean"], b.q_values([-1.0, 0.0, 1.0, 2.0, 3.0]))


def test_the_table(network_bundle: Path) -> None:
    r = qveil_main("inspect", "--bundle", str(network_bundle), "--grid", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].endswith("(mode output): un-noised mean, admin only")
    assert lines[1].split() == ["state", "a=0", "a=1"]
    assert [ln.split()[0] for ln in lines[2:]] == ["-1", "1", "3"]


def test_d_coordinates_are_swept_one_at_a_time(cartpole_release: tuple[Path, str]) -> None:
    bundle = cartpole_release[0]
    r = qveil_main("inspect", "--bundle", str(bundle), "--grid", "3", "--json")
    assert r.returncode == 0, r.stderr
    states = np.array(json.loads(r.stdout)["states"])
    b = load_bundle(bundle)
    lo, hi = b.box.lo, b.box.hi
    assert states.shape == (4 * 3, 4)
    for j in range(4):
        block = states[3 * j : 3 * j + 3]
        np.testing.assert_allclose(block[:, j], [lo[j], (lo[j] + hi[j]) / 2, hi[j]])
        others = np.delete(block, j, axis=1)
        np.testing.assert_allclose(others, np.tile(np.delete((lo + hi) / 2, j), (3, 1)))
    np.testing.assert_allclose(json.loads(r.stdout)["mean"], b.q_values(states))


@pytest.mark.parametrize("grid", ["1", "1000001"])
def test_a_grid_out_of_range_is_refused(network_bundle: Path, grid: str) -> None:
    r = qveil_main("inspect", "--bundle", str(network_bundle), "--grid", grid)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"qveil inspect: error: --grid must be in [2, 1000000], got {grid}\n"


def test_a_missing_bundle_is_refused(tmp_path: Path) -> None:
    r = qveil_main("inspect", "--bundle", str(tmp_path / "nope"))
    assert r.returncode == 2 and r.stderr.startswith("qveil inspect: error: ")
