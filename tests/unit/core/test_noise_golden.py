"""qveil.noise answers exactly what it answered when these answers were recorded.

``tests/data/noise_golden.npz`` holds the outputs of seeded calls of every sampler of
:mod:`qveil.noise` (the online ``OUSamplePath``, ``conditional_moments`` on one-sided,
two-sided and empty neighbourhoods), recorded before the OU conditional was written once for
all of them. A refactoring of the formulas must keep every bit (the law is proven elsewhere,
tests/unit/core/test_noise_conditionals.py; this pins the numbers). Regenerate only for an
intended change of the arithmetic:
``python tests/unit/core/test_noise_golden.py --write``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from qveil.noise import OUSamplePath, conditional_moments

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "noise_golden.npz"


def answers() -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(7)
    # the online path: batches small (scalar loop) and large, repeats, then single states
    for beta, sigma in ((0.5, 1.0), (3.0, 2.5), (40.0, 0.3)):
        path = OUSamplePath(beta=beta, sigma=sigma, rng=11)
        got = [path.sample(rng.uniform(0, 1, n)) for n in (1, 5, 16, 17, 300, 3)]
        got.append(np.array([path.sample_one(float(v)) for v in rng.uniform(0, 1, 20)]))
        got.append(path.sample(rng.uniform(0, 1, 50).round(2)))
        out[f"path_{beta}_{sigma}"] = np.concatenate(got)
    # the moments: every kind of neighbourhood, beta d from 1e-12 to 1e5
    rows = []
    for d1, d2 in ((None, None), (None, 0.3), (0.2, None), (1e-12, 0.5), (0.0, 0.1), (1e5, 1e-3)):
        for beta in (1e-3, 1.0, 50.0):
            m, s = conditional_moments(
                beta=beta,
                sigma=1.3,
                d_left=d1,
                g_left=None if d1 is None else -0.7,
                d_right=d2,
                g_right=None if d2 is None else 1.1,
            )
            rows.append((m, s))
    out["moments"] = np.array(rows)
    return out


def test_noise_answers_are_the_recorded_ones() -> None:
    want = np.load(GOLDEN)
    got = answers()
    assert sorted(want.files) == sorted(got)
    for k, v in got.items():
        assert v.tobytes() == want[k].tobytes(), k


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    np.savez(GOLDEN, **answers())
