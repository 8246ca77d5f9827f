"""OUSamplePath's contract: duplicates, bad input (nothing stored), restore, reproducibility,
the sorted index against brute force, StateInterval, and no global RNG anywhere."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from qveil.errors import InvalidArgument
from qveil.noise import OUSamplePath, StateInterval, validate_unit_states
from qveil.rng import OSEntropy

ROOT = Path(__file__).resolve().parents[3]


def _path(seed: int | None = 1) -> OUSamplePath:
    return OUSamplePath(beta=50.0, sigma=0.6, rng=seed)


def test_duplicates_in_one_call_get_one_value_and_requery_is_stable() -> None:
    path = _path()
    g = path.sample([0.3, 0.3, 0.5, 0.3, 0.5, -0.0, 0.0])
    assert g[0] == g[1] == g[3] and g[2] == g[4] and g[5] == g[6]
    assert len(path) == 3
    assert np.array_equal(path.sample([0.5, 0.3, 0.0]), g[[2, 0, 5]])
    assert 0.3 in path and 0.4 not in path and "0.3" not in path


BAD_INPUTS = [
    [0.2, math.nan],
    [0.2, math.inf],
    [0.2, -math.inf],
    [0.2, -1e-300],
    [0.2, 1.0000000000000002],
    [[0.2, 0.3]],
    np.zeros((2, 2)),
    ["0.5"],
    [0.2, None],
    [True, False],
    [0.5 + 0j],
    [10**400],
    10**400,
    math.nan,
]


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[repr(b)[:30] for b in BAD_INPUTS])
def test_bad_input_raises_and_stores_nothing(bad: object) -> None:
    path = _path()
    path.sample([0.1, 0.9])
    before = path.points()
    with pytest.raises(InvalidArgument):
        path.sample(bad)  # type: ignore[arg-type]
    after = path.points()
    assert len(path) == 2
    assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])


def test_add_points_is_all_or_nothing() -> None:
    path = OUSamplePath.from_points([0.1, 0.5], [1.0, 2.0], beta=3.0, sigma=1.0, rng=0)
    for xs, gs in [
        ([0.2, 0.5], [0.0, 2.5]),  # changes a stored value
        ([0.2, 0.2], [0.0, 0.1]),  # one state, two values
        ([0.2, 0.3], [0.0, math.nan]),
        ([0.2, 0.3], [0.0]),
        ([0.2, 1.5], [0.0, 0.0]),
    ]:
        with pytest.raises(InvalidArgument):
            path.add_points(xs, gs)
        assert np.array_equal(path.points()[0], [0.1, 0.5])
    path.add_points([0.5, 0.2, 0.2], [2.0, 0.0, 0.0])  # agreeing repeats are fine
    assert np.array_equal(path.points()[1], [1.0, 0.0, 2.0])


def test_seeded_runs_reproduce_and_seeds_differ() -> None:
    xs = np.random.default_rng(3).random(500)
    a, b, c = _path(42).sample(xs), _path(42).sample(xs), _path(43).sample(xs)
    assert np.array_equal(a, b) and not np.allclose(a, c)
    g1, g2 = (
        OUSamplePath(beta=5.0, sigma=1.0).sample(xs),
        OUSamplePath(beta=5.0, sigma=1.0).sample(xs),
    )
    assert not np.allclose(g1, g2)  # OS entropy: no two paths alike


def test_restore_keeps_values_and_index() -> None:
    path = _path(5)
    xs = np.random.default_rng(4).random(3000)
    g = path.sample(xs)
    restored = OUSamplePath.from_points(*path.points(), beta=50.0, sigma=0.6, rng=6)
    assert len(restored) == len(path)
    assert np.array_equal(restored.sample(xs[::-1]), g[::-1])  # stored values answered
    assert restored.conditional(0.123456) == path.conditional(0.123456)


def test_sorted_index_against_brute_force() -> None:
    """Enough points to split index blocks many times, in random batches; every neighbour
    query, membership test, points() and max_abs() agree with a plain sorted list."""
    rng = np.random.default_rng(8)
    path = _path(9)
    xs = np.concatenate([rng.random(6000), np.linspace(0, 1, 1001), [0.0, 1.0, 0.5]])
    rng.shuffle(xs)
    vals: dict[float, float] = {}
    for chunk in np.array_split(xs, 37):
        for x, g in zip(chunk.tolist(), path.sample(chunk).tolist(), strict=True):
            assert vals.setdefault(x, g) == g
    px, pg = path.points()
    keys = sorted(vals)
    assert px.tolist() == keys and pg.tolist() == [vals[k] for k in keys]
    assert len(path) == len(keys) and path.max_abs() == max(abs(v) for v in vals.values())
    arr = np.array(keys)
    for q in rng.random(300).tolist() + keys[:50] + [0.0, 1.0]:
        left, right = path.neighbours(q)
        i, j = np.searchsorted(arr, q, "left"), np.searchsorted(arr, q, "right")
        assert left == ((keys[i - 1], vals[keys[i - 1]]) if i > 0 else None)
        assert right == ((keys[j], vals[keys[j]]) if j < len(keys) else None)


def test_sigma_zero_and_empty() -> None:
    path = OUSamplePath(beta=1.0, sigma=0.0, rng=1)
    assert np.array_equal(path.sample([0.1, 0.7]), [0.0, 0.0])
    assert _path().sample([]).shape == (0,) and _path().max_abs() == 0.0
    assert _path().points()[0].shape == (0,)
    for kw in [
        {"beta": 0.0, "sigma": 1.0},
        {"beta": -1.0, "sigma": 1.0},
        {"beta": math.inf, "sigma": 1.0},
        {"beta": 1.0, "sigma": -1.0},
        {"beta": 1.0, "sigma": math.nan},
    ]:
        with pytest.raises(InvalidArgument):
            OUSamplePath(**kw)  # type: ignore[arg-type]


def test_validate_unit_states() -> None:
    assert validate_unit_states(0.5).tolist() == [0.5]
    out = validate_unit_states([-0.0, 1])
    assert out.tolist() == [0.0, 1.0] and not np.signbit(out[0])
    # a few float64 states are checked as Python floats, more with numpy: the same bits and
    # the same verdicts either way
    rng = np.random.default_rng(4)
    for n in (1, 3, 16, 17, 40):
        xs = rng.uniform(0, 1, n)
        xs[0], xs[-1] = -0.0, 1.0
        got = validate_unit_states(xs)
        assert got.tobytes() == validate_unit_states(list(xs)).tobytes()
        assert not np.signbit(got[0]) and got[1:-1].tobytes() == xs[1:-1].tobytes()
        for bad in (math.nan, math.inf, 1.0000001, -1e-300):
            ys = xs.copy()
            ys[n // 2] = bad
            with pytest.raises(InvalidArgument):
                validate_unit_states(ys)


def test_state_interval_maps_and_rejects() -> None:
    iv = StateInterval(-2.0, 6.0)
    assert iv.to_unit([-2.0, 2.0, 6.0]).tolist() == [0.0, 0.5, 1.0]
    assert iv.from_unit([0.0, 0.25, 1.0]).tolist() == [-2.0, 0.0, 6.0]
    s = np.random.default_rng(1).uniform(-2, 6, 100)
    np.testing.assert_allclose(iv.from_unit(iv.to_unit(s)), s, rtol=0, atol=1e-14)
    for bad in [[6.0000001], [-2.1], [math.nan], [math.inf], [[0.0]]]:
        with pytest.raises(InvalidArgument):
            iv.to_unit(bad)
    for lo, hi in [(1.0, 1.0), (2.0, 1.0), (0.0, math.inf), (math.nan, 1.0)]:
        with pytest.raises(InvalidArgument):
            StateInterval(lo, hi)


def test_no_global_rng_state_is_touched() -> None:
    np_state, py_state = np.random.get_state(), random.getstate()  # noqa: NPY002
    xs = np.linspace(0, 1, 200)
    _path(None).sample(xs)
    _path(3).sample(xs)
    OSEntropy().standard_normal(100)
    after = np.random.get_state()  # noqa: NPY002
    assert all(np.array_equal(a, b) for a, b in zip(np_state, after, strict=True))
    assert random.getstate() == py_state


# numpy's global-state functions: np.random.<lowercase function>( except the constructors.
_GLOBAL_NP = re.compile(r"\b(?:np|numpy)\.random\.(?!default_rng\b|SeedSequence\b)([a-z_]+)\s*\(")
_PY_RANDOM = re.compile(r"^\s*(?:import random\b|from random import)", re.M)


def test_source_has_no_global_rng_calls() -> None:
    """No module of the product calls numpy's global RNG (np.random.normal, .seed, ...); the
    noise math (core/) and the server do not import Python's `random` either. (The client's
    retry jitter may use `random`: it is not noise.)"""
    offenders = []
    for part in ["core", "server", "trainer", "client", "experiments"]:
        for f in sorted((ROOT / part).rglob("*.py")):
            text = f.read_text()
            offenders += [
                f"{f.relative_to(ROOT)}: np.random.{m}(" for m in _GLOBAL_NP.findall(text)
            ]
            if part in ("core", "server") and _PY_RANDOM.search(text):
                offenders.append(f"{f.relative_to(ROOT)}: imports random")
    assert not offenders, offenders
    # the check itself can fail:
    assert _GLOBAL_NP.findall("z = np.random.normal(0, 1); np.random.default_rng(1)") == ["normal"]


def test_batching_does_not_change_seeded_values() -> None:
    """Point by point, in chunks (small and large code paths) or all at once: the same seeded
    path, because new states are always drawn in first-occurrence order."""
    xs = np.random.default_rng(1).random(2000)
    one = _path(3)
    by_point = np.array([one.sample(x)[0] for x in xs.tolist()])
    chunked = _path(3)
    by_chunk = np.concatenate([chunked.sample(c) for c in np.array_split(xs, 150)])
    assert np.array_equal(by_point, _path(3).sample(xs))
    assert np.array_equal(by_chunk, by_point)


def test_sample_one_equals_sample_and_refuses_bad_input() -> None:
    """The single-state fast path draws exactly what ``sample`` draws from the same source,
    returns stored values for known states, and refuses what ``sample`` refuses."""
    import numpy as np
    import pytest

    from qveil.errors import InvalidArgument
    from qveil.noise import OUSamplePath

    xs = np.random.default_rng(7).random(500)
    a = OUSamplePath(beta=50.0, sigma=0.7, rng=3)
    b = OUSamplePath(beta=50.0, sigma=0.7, rng=3)
    one = [a.sample_one(float(x)) for x in xs]
    many = [float(b.sample(np.array([x]))[0]) for x in xs]
    assert one == many
    assert a.sample_one(float(xs[10])) == one[10]  # stored value, no new draw
    n = len(a)
    for bad in (float("nan"), float("inf"), -1e-9, 1.0 + 1e-9, True, "0.3", 10**400):
        with pytest.raises(InvalidArgument):
            a.sample_one(bad)  # type: ignore[arg-type]
    assert len(a) == n
