"""The estimator's public spec (qveil.kfqi_spec): the default value must lie in the Q range
(D_T's proof needs it), whose ends a config names are accepted exactly as written."""

from __future__ import annotations

import pytest

from qveil.errors import InvalidArgument
from qveil.kfqi_spec import KernelFQISpec


def test_default_value_must_lie_in_the_q_range() -> None:
    """D_T's proof needs the default inside [min(lo, 0), max(hi, 0)] / (1 - gamma)."""
    spec = KernelFQISpec(gamma=0.5, iterations=1, betas=(1.0,), default=0.0)
    assert spec.default_value((0.0, 1.0)) == 0.0
    assert KernelFQISpec(gamma=0.5, iterations=1, betas=(1.0,)).default_value((0, 1)) == 1.0
    with pytest.raises(InvalidArgument, match="Q range"):
        KernelFQISpec(gamma=0.5, iterations=1, betas=(1.0,), default=2.5).default_value((0, 1))


def test_the_ends_of_the_q_range_are_accepted_exactly() -> None:
    """The pessimistic end a config names is accepted as written: rewards in [-1, 0] at
    gamma 0.99 give the Q range [-100, 0] (float arithmetic on 1 - 0.99 gives
    -99.99999999999991, which refused -100.0), and the private evaluation clips into the
    same ends."""
    from qveil.kfqi_spec import q_range
    from qveil.privacy.ope import OPEPrivacyParams

    assert q_range((-1.0, 0.0), 0.99) == (-100.0, 0.0)
    assert q_range((0.0, 1.0), 0.9) == (0.0, 10.0)
    assert q_range((-100.0, 100.0), 0.5) == (-200.0, 200.0)
    for default in (-100.0, 0.0):
        spec = KernelFQISpec(gamma=0.99, iterations=1, betas=(1.0,), default=default)
        assert spec.default_value((-1.0, 0.0)) == default
    with pytest.raises(InvalidArgument, match=r"Q range \[-100, 0\]"):
        KernelFQISpec(gamma=0.99, iterations=1, betas=(1.0,), default=-100.001).default_value(
            (-1.0, 0.0)
        )
    ope = OPEPrivacyParams(users=10, reward_range=(-1.0, 0.0), gamma=0.99, iterations=1, delta=1e-5)
    assert ope.q_range == (-100.0, 0.0)
