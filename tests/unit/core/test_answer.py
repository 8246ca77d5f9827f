"""What a release answers (:mod:`qveil.answer`): the one function from (release, unit state) to
released values that the server, the in-process evaluations and the audit all compute.

For unit states x and actions a the answer is

    grid_round( Q(snap(x), a) + g_{a d + 0}(snap(x)_0) + ... + g_{a d + d - 1}(snap(x)_{d - 1}) )

checked here against an independent recomputation (the grid index rint(u 2^32), the mean at
the snapped state, each path's value by ``KeyedPaths.path_values``, added in coordinate
order, rounded to the value grid), on a 1-D network release and a d = 4 kernel fqi release;
two raw states that snap to one grid point get one answer (while their raw means differ);
and the bits do not depend on how the states are split into calls, on their order, on what
was asked before, or on the process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from config_helpers import CARTPOLE_CONFIG
from server_helpers import write_output_bundle

from qveil.answer import DEFAULT_VALUE_GRID, answer_snapped, grid_round, released_values
from qveil.bundle import Bundle, load_bundle
from qveil.errors import InvalidArgument
from qveil.keyed import FEW_VALUES, GRID_LEVELS, KeyedPaths, snap

UNIT = 2.0**-GRID_LEVELS


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """A 1-D output-mode network release: 3 actions on [-1, 2], sigma 2, a seeded key."""
    from qveil.bundle import lipschitz_bound
    from qveil.privacy import E3_SETTINGS

    rng = np.random.default_rng(21)
    w = {
        "W0": rng.normal(size=(16, 1)) * 2,
        "b0": rng.normal(size=16),
        "W1": rng.normal(size=(3, 16)) * 0.5,
        "b1": rng.normal(size=3),
    }
    out = write_output_bundle(
        tmp_path_factory.mktemp("mlp") / "bundle",
        w,
        seed=21,
        actions=3,
        lipschitz=max(lipschitz_bound(w), 1.0),
        sigma=2.0,
        settings=E3_SETTINGS,
        env_id="LineWalk-v0",
        interval=(-1.0, 2.0),
        hyperparameters={"made_by": "tests/unit/core/test_answer.py"},
        config_toml="# test\n",
        learning_curve_png=b"",
    )
    return load_bundle(out)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """A d = 4 kernel fqi release (CartPole, 100 users; betas 1024, 1024, 4, 4; a key from
    OS entropy)."""
    from qveil.kfqi_config import load_fqi_config
    from qveil.trainer.collect import collect
    from qveil.trainer.kfqi import train_kernel_fqi

    data = collect("CartPole-v1", 100, 1, reward_range=(0.0, 1.0))
    out = tmp_path_factory.mktemp("kernel") / "bundle"
    return load_bundle(
        train_kernel_fqi(load_fqi_config(CARTPOLE_CONFIG), data, out, force=True).path
    )


@pytest.fixture(params=["mlp", "kernel"])
def bundle(request: pytest.FixtureRequest) -> Bundle:
    b: Bundle = request.getfixturevalue(request.param)
    return b


def _units(d: int, n: int, seed: int) -> np.ndarray:
    """n unit states [n, d]: uniform ones (deep grid points), table points (multiples of
    2^-12), the ends 0 and 1, and points half a grid step off a grid point."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.0, 1.0, size=(n, d))
    u[: n // 8] = rng.integers(0, 4097, size=(n // 8, d)) / 4096.0
    u[n // 8 : n // 8 + 2] = [[0.0] * d, [1.0] * d]
    i = rng.integers(1, 2**32 - 1, size=(n // 8, d)).astype(np.float64)
    u[n // 4 : n // 4 + n // 8] = (i + rng.choice([-0.5, 0.5, 0.49, -0.49], size=i.shape)) * UNIT
    return u


def _paths(b: Bundle) -> KeyedPaths:
    """The release's noise paths, built afresh from its key and card."""
    return KeyedPaths(key=b.noise_key, betas=b.betas, sigma=b.sigma, n_actions=b.n_actions)


def _expected(
    b: Bundle, units: np.ndarray, actions: list[int], grid: float = DEFAULT_VALUE_GRID
) -> np.ndarray:
    """The answer recomputed from its definition, without :func:`qveil.keyed.snap`."""
    d = b.dims
    idx = np.rint(units * 2.0**GRID_LEVELS).astype(np.uint64)  # nearest; ties to even
    xs = idx.astype(np.float64) * UNIT
    q = b.q_values_unit(xs)
    paths = _paths(b)
    out = np.empty((len(units), len(actions)))
    for k, a in enumerate(actions):
        g = paths.path_values(a * d, idx[:, 0])
        for j in range(1, d):  # coordinate order
            g = g + paths.path_values(a * d + j, idx[:, j])
        out[:, k] = np.round((q[:, a] + g) / grid) * grid + 0.0
    return out


def test_released_values_are_the_snapped_mean_plus_the_keyed_noise_on_the_value_grid(
    bundle: Bundle,
) -> None:
    """Every action, and a subset in another order: bit for bit the definition; every value a
    multiple of the value grid, within half a grid step of the unrounded sum; the noise is
    really there (the answers are not the rounded mean)."""
    u = _units(bundle.dims, 400, seed=1)
    got = released_values(bundle, u)
    every = list(range(bundle.n_actions))
    assert got.shape == (400, bundle.n_actions) and got.dtype == np.float64
    assert np.array_equal(got, _expected(bundle, u, every))
    sub = every[::-1][:2]
    assert np.array_equal(released_values(bundle, u, actions=sub), got[:, sub])
    assert np.array_equal(got / DEFAULT_VALUE_GRID, np.round(got / DEFAULT_VALUE_GRID))
    idx, xs = snap(u)
    raw = bundle.q_values_unit(xs) + _paths(bundle).noise(idx)
    assert np.abs(got - raw).max() <= DEFAULT_VALUE_GRID / 2
    mean_only = grid_round(bundle.q_values_unit(xs), DEFAULT_VALUE_GRID)
    assert np.abs(got - mean_only).mean() > 0.1 * bundle.sigma


def test_answer_snapped_returns_each_paths_value_and_their_rounded_sum(kernel: Bundle) -> None:
    """``answer_snapped``: the (n, actions, d) per-path values (what the answer log keeps)
    are each path's own value at its snapped coordinate, and the values are their sum in
    coordinate order with the mean: with a value grid fine enough to change nothing
    (2^-80), exactly ((q + g_0 + g_1) + g_2) + g_3 computed as sum_coordinates does, which
    for some states is not the sum in the reverse order (so the order is pinned)."""
    u = _units(4, 300, seed=2)
    idx, xs = snap(u)
    ans = answer_snapped(kernel, xs, idx, [1, 0], value_grid=2.0**-80)
    paths = _paths(kernel)
    assert ans.coords.shape == (300, 2, 4)
    for k, a in enumerate([1, 0]):
        for j in range(4):
            assert np.array_equal(ans.coords[:, k, j], paths.path_values(a * 4 + j, idx[:, j]))
    c = ans.coords
    forward = ((c[:, :, 0] + c[:, :, 1]) + c[:, :, 2]) + c[:, :, 3]
    reverse = ((c[:, :, 3] + c[:, :, 2]) + c[:, :, 1]) + c[:, :, 0]
    q = kernel.q_values_unit(xs)[:, [1, 0]]
    assert np.array_equal(ans.values, q + forward)
    assert not np.array_equal(forward, reverse)
    default = answer_snapped(kernel, xs, idx, [1, 0])
    assert np.array_equal(default.values, grid_round(q + forward, DEFAULT_VALUE_GRID))
    assert np.array_equal(default.values, released_values(kernel, u, actions=[1, 0]))


def test_states_that_snap_to_one_grid_point_get_one_answer(bundle: Bundle) -> None:
    """Raw states less than half a grid step apart on every coordinate, on either side of a
    grid point, are answered with the answer at the grid point itself, though the mean at
    the raw states differs (so a pair's difference would otherwise show the mean's slope);
    the same through the public box from raw states."""
    d = bundle.dims
    rng = np.random.default_rng(3)
    i = rng.integers(2**20, 2**32 - 2**20, size=(300, d)).astype(np.float64)
    lo = (i - rng.uniform(0.05, 0.45, size=i.shape)) * UNIT
    hi = (i + rng.uniform(0.05, 0.45, size=i.shape)) * UNIT
    grid = i * UNIT
    assert (lo < grid).all() and (grid < hi).all()
    at = released_values(bundle, grid)
    assert np.array_equal(released_values(bundle, lo), at)
    assert np.array_equal(released_values(bundle, hi), at)
    assert (bundle.q_values_unit(lo) != bundle.q_values_unit(hi)).any()
    # the same from raw states, mapped into unit states by the release's public box
    lo_b, hi_b = bundle.box.lo, bundle.box.hi
    raw = [lo_b + x * (hi_b - lo_b) for x in (lo, hi)]
    assert np.array_equal(released_values(bundle, bundle.box.to_unit(raw[0])), at)
    assert np.array_equal(released_values(bundle, bundle.box.to_unit(raw[1])), at)


def test_the_bits_do_not_depend_on_batching_order_or_history(bundle: Bundle) -> None:
    """One call of 600 states (above FEW_VALUES values), one call per state (below it), random
    chunks in shuffled order with other states asked in between, and the same states asked
    twice in one call: the same bits (compared as integers, so -0.0 and 0.0 differ)."""
    u = _units(bundle.dims, 600, seed=4)
    m = bundle.n_actions
    assert 600 * m * bundle.dims > FEW_VALUES and m * bundle.dims <= FEW_VALUES
    whole = released_values(bundle, u)
    singles = np.vstack([released_values(bundle, u[k : k + 1]) for k in range(len(u))])
    assert np.array_equal(whole.view(np.uint64), singles.view(np.uint64))
    rng = np.random.default_rng(5)
    cuts = np.sort(rng.choice(np.arange(1, 600), size=20, replace=False))
    chunks = list(zip(np.r_[0, cuts], np.r_[cuts, 600], strict=True))
    rng.shuffle(chunks)
    pieces = np.empty_like(whole)
    for a, b in chunks:
        released_values(bundle, rng.uniform(size=(int(rng.integers(1, 50)), bundle.dims)))
        pieces[a:b] = released_values(bundle, u[a:b])
    assert np.array_equal(whole.view(np.uint64), pieces.view(np.uint64))
    perm = rng.permutation(600)
    assert np.array_equal(released_values(bundle, u[perm]), whole[perm])
    twice = released_values(bundle, np.vstack([u, u[::-1]]))
    assert np.array_equal(twice[:600], whole) and np.array_equal(twice[600:], whole[::-1])


def test_the_same_bits_in_another_process_from_a_fresh_load(bundle: Bundle) -> None:
    """Nothing a process remembers enters an answer: another interpreter that loads the
    bundle from disk and asks a few states gets the same bits."""
    u = _units(bundle.dims, 40, seed=6)
    code = (
        "import sys, numpy as np; from qveil.bundle import load_bundle; "
        "from qveil.answer import released_values; "
        "u = np.frombuffer(bytes.fromhex(sys.argv[2])).reshape(-1, int(sys.argv[3])); "
        "print(released_values(load_bundle(sys.argv[1]), u).tobytes().hex())"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(bundle.path), u.tobytes().hex(), str(bundle.dims)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == released_values(bundle, u).tobytes().hex()


def test_another_key_gives_other_answers(mlp: Bundle, tmp_path: Path) -> None:
    """The answers are the key's: the same model and card written with another key answer
    differently (the noise differs; the means are the same)."""
    import shutil

    from qveil.bundle import KEY_FILE
    from qveil.keyed import seeded_key

    other = Path(shutil.copytree(mlp.path, tmp_path / "other"))
    (other / KEY_FILE).write_bytes(seeded_key(22))
    b2 = load_bundle(other, verify=False)  # the card's key_sha256 is the first key's
    u = _units(1, 200, seed=7)
    a, b = released_values(mlp, u), released_values(b2, u)
    assert np.array_equal(mlp.q_values_unit(u), b2.q_values_unit(u))
    assert (a != b).mean() > 0.99


def test_flat_states_of_a_one_dimensional_release_and_bad_states(
    mlp: Bundle, kernel: Bundle
) -> None:
    """With d = 1 a flat list is n states. A unit state outside [0, 1] or NaN is refused (the
    caller clips through the public box first), as is a batch of the wrong width."""
    u = _units(1, 50, seed=8)
    assert np.array_equal(released_values(mlp, u.reshape(-1)), released_values(mlp, u))
    for bad in ([[1.5]], [[-1e-9]], [[float("nan")]]):
        with pytest.raises(InvalidArgument):
            released_values(mlp, bad)
    with pytest.raises(InvalidArgument):
        released_values(kernel, np.full((4, 3), 0.5))  # 4 states of 3 coordinates, not d = 4


def test_grid_round() -> None:
    """Round to the nearest multiple of a power of two (exact scaling), halves to even, no
    negative zero (one bit pattern per answer)."""
    g = 2.0**-20
    x = np.array([0.0, -0.0, -0.25 * g, 0.5 * g, 1.5 * g, 2.5 * g, -1.5 * g, 3.3 * g, 1e6 + g / 3])
    got = grid_round(x, g)
    assert np.array_equal(got, np.array([0, 0, 0, 0, 2, 2, -2, 3, 1e6 * 2**20]) * g)
    assert not np.signbit(got[:4]).any()
    coarse = grid_round(np.array([0.1, -0.7, 1.23]), 2.0**-2)
    assert np.array_equal(coarse, [0.0, -0.75, 1.25])
    assert DEFAULT_VALUE_GRID == 2.0**-20
