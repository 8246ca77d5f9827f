"""The one entry point that re-accounts any recorded parameter set (a card's or a ledger
event's ``privacy_params``): :func:`account_params` picks the accountant the record names
and recomputes its result from the parameters alone (the ledger replays events this way;
``qveil serve`` and ``qveil admin retrain`` re-check a bundle's card with it).

It stands above every accountant (:mod:`qveil.privacy.fqi`, :mod:`qveil.privacy.kfqi`,
:mod:`qveil.privacy.ope`, :mod:`qveil.privacy.accountant`), which import nothing from it.
Pure functions of public parameters: no I/O, no randomness.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qveil.errors import InvalidArgument
from qveil.privacy.accountant import account
from qveil.privacy.fqi import FQIPrivacyParams, account_fqi
from qveil.privacy.kfqi import KernelFQIPrivacyParams, account_kernel_fqi
from qveil.privacy.ope import OPEPrivacyParams, account_ope
from qveil.privacy.params import PrivacyParams

__all__ = ["account_params"]


def account_params(pp: Mapping[str, Any]) -> Any:
    """The accountant's result for any recorded parameter set: the fqi accountant for mode
    fqi (the kernel estimator's, a private off-policy evaluation's, or the retired grid
    fit's, by the record's ``estimator``), else Algorithm 1's."""
    if not isinstance(pp, Mapping):
        raise InvalidArgument(f"privacy params must be a mapping, got {type(pp).__name__}")
    if pp.get("mode") == "fqi":
        if pp.get("estimator") == "ope":  # a private off-policy evaluation (qveil.ope)
            return account_ope(OPEPrivacyParams.from_dict(pp))
        if pp.get("estimator") == "kernel":  # the d-coordinate variant
            return account_kernel_fqi(KernelFQIPrivacyParams.from_dict(pp))
        return account_fqi(FQIPrivacyParams.from_dict(pp))
    return account(PrivacyParams.from_dict(pp))
