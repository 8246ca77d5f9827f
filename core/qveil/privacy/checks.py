"""Argument checks shared by the privacy modules: name the parameter, repeat the bad value."""

from __future__ import annotations

import math
import numbers

from qveil.errors import InvalidArgument

__all__ = ["number", "positive"]


def number(
    name: str,
    value: object,
    *,
    lo: float | None = None,
    lo_open: bool = True,
    hi: float | None = None,
    hi_open: bool = True,
) -> float:
    """``value`` as a finite float within the given bounds, else :class:`InvalidArgument`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise InvalidArgument(f"{name} must be finite, got {value!r}")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise InvalidArgument(f"{name} must be {'>' if lo_open else '>='} {lo:g}, got {value!r}")
    if hi is not None and (v > hi or (hi_open and v == hi)):
        raise InvalidArgument(f"{name} must be {'<' if hi_open else '<='} {hi:g}, got {value!r}")
    return v


def positive(name: str, value: object) -> float:
    """``value`` as a finite float > 0."""
    return number(name, value, lo=0.0)


#: Appended to every basis, once: the guarantee is for the release's ONE noise key.
ONE_KEY = (
    " The guarantee is for the release's one noise key, drawn once from OS entropy at train: "
    "every answer is computed from it (the Gaussian-process mechanism at the points of the "
    "grid i 2^-32 of each unit coordinate, by a keyed exact construction of the OU path; "
    "computational, through the AES-256 PRF, as any noise drawn from a CSPRNG). Every copy of "
    "the release answers the same values; new noise needs a new release, charged again."
)
