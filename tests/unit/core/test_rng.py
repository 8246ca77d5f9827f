"""qveil.rng: OS-entropy normals are N(0, 1), unseeded and symmetric; seeded generators only on
request; the global random state is refused as a noise source."""

from __future__ import annotations

import random

import numpy as np
import pytest
from noise_helpers import UNSEEDED_LAW_LEVEL

from qveil.rng import NormalSource, OSEntropy, is_seeded, resolve_rng, seeded_rng
from qveil.stats import normality_report


def test_os_entropy_is_standard_normal() -> None:
    """KS, chi-square, mean and variance against N(0, 1) on 200k draws. The draws cannot be
    seeded, so the pass level is the suite-wide UNSEEDED_LAW_LEVEL; the same report rejects
    a 3 % scale error by ~19 standard errors (var_p ~ 1e-80)."""
    z = OSEntropy().standard_normal(200_000)
    rep = normality_report(z, level=UNSEEDED_LAW_LEVEL)
    assert rep["passed"], rep
    assert normality_report(z * 1.03, level=UNSEEDED_LAW_LEVEL)["var_p"] < 1e-20


def test_os_entropy_shapes_and_independence() -> None:
    src = OSEntropy()
    assert isinstance(src.standard_normal(), float)
    assert src.standard_normal((3, 4)).shape == (3, 4)
    assert src.standard_normal(0).shape == (0,)
    a, b = OSEntropy().standard_normal(1000), OSEntropy().standard_normal(1000)
    assert not np.allclose(a, b)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.15


def test_os_entropy_is_not_seeded() -> None:
    src = resolve_rng(None)
    assert isinstance(src, OSEntropy) and not is_seeded(src)
    assert is_seeded(resolve_rng(3)) and is_seeded(seeded_rng(3))
    assert not any(hasattr(src, a) for a in ("seed", "bit_generator", "state", "_seed"))


@pytest.mark.parametrize("byte", [b"\x00", b"\xff"])
def test_os_entropy_extremes_are_finite_and_symmetric(
    monkeypatch: pytest.MonkeyPatch, byte: bytes
) -> None:
    """All-zero and all-one entropy give -8.2 and +8.2, never +-inf (a 53-bit grid (k+1/2)/2^53
    rounds up to exactly 1 at k = 2^53 - 1 and would return +inf)."""
    monkeypatch.setattr("qveil.rng.os.urandom", lambda n: byte * n)
    z = OSEntropy().standard_normal(4)
    assert np.isfinite(z).all() and 8.0 < abs(z[0]) < 8.5
    monkeypatch.setattr(
        "qveil.rng.os.urandom", lambda n: (b"\x00" if byte == b"\xff" else b"\xff") * n
    )
    assert OSEntropy().standard_normal() == -z[0]


def test_seeded_rng_reproduces_and_checks_type() -> None:
    assert seeded_rng(5).standard_normal() == seeded_rng(5).standard_normal()
    for bad in [1.5, "1", True, None]:
        with pytest.raises(TypeError):
            seeded_rng(bad)  # type: ignore[arg-type]


def test_resolve_rng_refuses_global_state_and_junk() -> None:
    for bad in [np.random, random, np.random.mtrand._rand, "x", 1.0, True]:
        with pytest.raises(TypeError):
            resolve_rng(bad)  # type: ignore[arg-type]
    g = np.random.default_rng(1)
    assert resolve_rng(g) is g and isinstance(g, NormalSource)


def test_scalar_and_array_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """OSEntropy's one-draw fast path does the same arithmetic as the array path."""
    raw = bytes(range(1, 9))
    monkeypatch.setattr("qveil.rng.os.urandom", lambda n: raw * (n // 8))
    assert OSEntropy().standard_normal() == OSEntropy().standard_normal(1)[0]
