"""Each exact OU conditional (left only, right only, bridge) against dense GP conditioning in
60-digit arithmetic, over beta * d from 1e-12 to 1e5 (docs/privacy.md section 9).

Tolerances: std relative 1e-10; mean within 1e-10 of the scale |g_left| + |g_right|. A naive
implementation with 1 - exp(-2 beta d) instead of expm1 misses the std at beta * d = 1e-12 by
about 1e-4 relative (see test_naive_one_minus_exp_fails_the_tolerance), so these tolerances
have teeth; the paper's equation (2) misses by O(1) (test_noise_conformance.py).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from noise_helpers import dense_conditional

from qveil.errors import InvalidArgument
from qveil.noise import OUSamplePath, conditional_moments

RTOL = 1e-10
BETA_D = [1e-12, 1e-9, 1e-6, 1e-3, 0.1, 0.7, 3.0, 30.0, 700.0, 1e4, 1e5]
GL, GR = 0.8123, -1.4711  # stored neighbour values (sigma-scale)


def _check(got: tuple[float, float], ref: tuple[float, float], scale: float) -> None:
    (m, s), (mr, sr) = got, ref
    assert abs(m - mr) <= RTOL * scale, (m, mr)
    assert abs(s - sr) <= RTOL * sr, (s, sr)


@pytest.mark.parametrize("beta", [1.0, 2222.0])
@pytest.mark.parametrize("bd", BETA_D)
def test_one_sided_matches_dense(beta: float, bd: float) -> None:
    sigma = 0.37
    d = bd / beta
    ref = dense_conditional(d, [0.0], [GL], beta=beta, sigma=sigma)
    left = conditional_moments(
        beta=beta, sigma=sigma, d_left=d, g_left=GL, d_right=None, g_right=None
    )
    right = conditional_moments(
        beta=beta, sigma=sigma, d_left=None, g_left=None, d_right=d, g_right=GL
    )
    _check(left, ref, abs(GL))
    _check(right, ref, abs(GL))  # stationary, reversible: the same law from the right


@pytest.mark.parametrize("beta", [1.0, 2222.0])
@pytest.mark.parametrize(("bd1", "bd2"), list(itertools.product(BETA_D, BETA_D[::2])))
def test_bridge_matches_dense(beta: float, bd1: float, bd2: float) -> None:
    sigma = 1.9
    d1, d2 = bd1 / beta, bd2 / beta
    ref = dense_conditional(0.0, [-d1, d2], [GL, GR], beta=beta, sigma=sigma)  # exact positions
    got = conditional_moments(beta=beta, sigma=sigma, d_left=d1, g_left=GL, d_right=d2, g_right=GR)
    _check(got, ref, abs(GL) + abs(GR))


def test_literal_distance_1e_12_and_far_neighbours() -> None:
    """Distance exactly 1e-12 (decimal positions, exact in the reference), beta = 2222."""
    beta, sigma = 2222.0, 0.5
    ref = dense_conditional("1e-12", ["0", "0.3"], [GL, GR], beta=beta, sigma=sigma)
    got = conditional_moments(
        beta=beta, sigma=sigma, d_left=1e-12, g_left=GL, d_right=0.3 - 1e-12, g_right=GR
    )
    _check(got, ref, abs(GL) + abs(GR))


def test_no_neighbour_is_the_prior() -> None:
    assert conditional_moments(
        beta=3.0, sigma=0.4, d_left=None, g_left=None, d_right=None, g_right=None
    ) == (0.0, 0.4)


def _path_cases() -> list[tuple[str, float, list[float], float]]:
    """(case, beta, stored states, query) with the query's neighbours at the grid distances;
    extra far stored points check the Markov property (they must not matter)."""
    cases = []
    for bd in [1e-12, 1e-6, 0.1, 3.0, 1e4, 1e5]:
        beta = max(5.0, bd / 0.2)
        d = bd / beta  # <= 0.2, so the far points stay beyond the neighbours
        x = 0.5
        xl, xr = x - d, x + d
        far = [0.01, 0.02, 0.98]
        cases.append(("left-only", beta, [0.01, 0.02, xl], x))
        cases.append(("right-only", beta, [xr, 0.98], x))
        cases.append(("bridge", beta, [*far, xl, x + 2 * d], x))
    return cases


@pytest.mark.parametrize(("case", "beta", "stored", "x"), _path_cases())
def test_path_conditional_and_draw_match_dense(
    case: str, beta: float, stored: list[float], x: float
) -> None:
    """OUSamplePath.conditional (all stored points, so also the Markov property) matches dense
    conditioning on *every* stored point; and the sampler's inlined hot loop draws exactly
    mean + std * z from those moments."""
    sigma = 0.8
    rng = np.random.default_rng(7)
    gs = rng.standard_normal(len(stored)) * sigma
    path = OUSamplePath.from_points(stored, gs, beta=beta, sigma=sigma, rng=1)
    mean, std = path.conditional(x)
    ref = dense_conditional(x, stored, gs.tolist(), beta=beta, sigma=sigma)
    _check((mean, std), ref, float(np.abs(gs).sum()))

    class Replay:  # a normal source returning a fixed z, to read the sampler's arithmetic
        def standard_normal(self, size: object = None) -> object:
            return np.full(size, 1.25) if size is not None else 1.25

    drawn = OUSamplePath.from_points(stored, gs, beta=beta, sigma=sigma, rng=Replay())
    g = float(drawn.sample([x])[0])
    assert g == pytest.approx(mean + 1.25 * std, rel=1e-15, abs=1e-300)


def test_naive_one_minus_exp_fails_the_tolerance() -> None:
    """Power of the tolerance: 1 - exp(-2 beta d) (instead of expm1) at beta * d = 1e-12."""
    beta, sigma, d = 1.0, 1.0, 1e-12
    _, ref_std = dense_conditional(d, [0.0], [GL], beta=beta, sigma=sigma)
    naive = sigma * math.sqrt(1.0 - math.exp(-2.0 * beta * d))
    assert abs(naive - ref_std) > 1e3 * RTOL * ref_std


def test_conditional_moments_rejects_bad_arguments() -> None:
    ok = {"beta": 1.0, "sigma": 1.0, "d_left": 0.1, "g_left": 0.0, "d_right": None, "g_right": None}
    for bad in [
        {"beta": 0.0},
        {"beta": math.nan},
        {"sigma": -1.0},
        {"d_left": -0.1},
        {"d_left": math.nan},
        {"d_left": 0.0, "d_right": 0.0, "g_right": 1.0},
        {"g_left": math.inf},
        {"g_left": None},
        {"d_right": 0.2},
    ]:
        with pytest.raises(InvalidArgument):
            conditional_moments(**{**ok, **bad})
