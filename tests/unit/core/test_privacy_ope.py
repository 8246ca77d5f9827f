"""The accountant of the private off-policy estimate (qveil.privacy.ope): calibrated to
epsilon, its sensitivity D_T + (q_hi - q_lo) / N, recomputed from its parameters alone (as the
ledger replays it)."""

from __future__ import annotations

import pytest

from qveil.privacy.ope import OPEPrivacyParams, account_ope, calibrate_ope


def test_accountant_calibrates_and_recomputes() -> None:
    p = OPEPrivacyParams(users=1000, reward_range=(0.0, 0.5), gamma=0.5, iterations=10,
                         delta=1e-5)  # fmt: skip
    r = calibrate_ope(p, epsilon=1.0)
    assert r.target is not None and r.target["met"] and r.epsilon == pytest.approx(1.0, rel=1e-6)
    assert r.sensitivity == pytest.approx(0.5 * (1 - 0.5**10) / (1000 * 0.25) + 1.0 / 1000)
    again = account_ope(p.replace(sigma=r.sigma))
    assert again.epsilon == pytest.approx(r.epsilon, rel=1e-12)
    from qveil.privacy.events import account_params

    assert account_params(r.params.to_dict()).epsilon == pytest.approx(r.epsilon, rel=1e-12)
