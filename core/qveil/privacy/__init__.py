"""qveil.privacy: the accountant. Every privacy number qveil shows is computed here.

Pure functions of floats (no I/O, no randomness). Three modes (``paper``, ``gdp``,
``output``; see :mod:`qveil.privacy.accountant` and docs/privacy.md), Gaussian/GDP primitives
(:mod:`qveil.privacy.gaussian`), RKHS norms for Lemma 6 (:mod:`qveil.privacy.rkhs`) and the
ledger primitives (:mod:`qveil.privacy.ledger`).
"""

from __future__ import annotations

from qveil.privacy.accountant import account, calibrate
from qveil.privacy.gaussian import (
    analytic_gaussian_delta,
    analytic_gaussian_epsilon,
    analytic_gaussian_sigma,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
)
from qveil.privacy.ledger import PrivacyEvent, check_budget, compose, verify_event
from qveil.privacy.params import E3_SETTINGS, E3_SOURCES, MODES, PrivacyParams, PrivacyResult

__all__ = [
    "E3_SETTINGS",
    "E3_SOURCES",
    "MODES",
    "PrivacyEvent",
    "PrivacyParams",
    "PrivacyResult",
    "account",
    "analytic_gaussian_delta",
    "analytic_gaussian_epsilon",
    "analytic_gaussian_sigma",
    "calibrate",
    "check_budget",
    "compose",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "verify_event",
]
