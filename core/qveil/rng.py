"""Sources of randomness for the samplers that draw from OS entropy: Algorithm 1's training
noise, the private evaluation's Gaussian noise, ``qveil noise`` and the experiments. (A
release's served noise is a function of its one key, 32 bytes of OS entropy drawn once when the
release is written: :mod:`qveil.keyed`.)

Noise that protects data must come from OS entropy (non-negotiable 5): an attacker who learns
a PRNG's seed or state learns the noise and can subtract it. So the default source,
:class:`OSEntropy`, turns bytes from ``os.urandom`` straight into standard normals (52-bit
uniforms through the inverse normal CDF); there is no seed or generator state to leak. A seeded
``numpy.random.Generator`` is accepted for tests and experiments only; whoever uses one must
mark the resulting artefact ``seeded: true`` (see :func:`is_seeded`).

Samplers need only ``standard_normal(size=None)``, the :class:`NormalSource` protocol, which
both kinds satisfy. Nothing in qveil uses numpy's or Python's global random state.
"""

from __future__ import annotations

import os
import types
from typing import Protocol, overload, runtime_checkable

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

__all__ = ["NormalSource", "OSEntropy", "is_seeded", "resolve_rng", "seeded_rng"]

_TWO_POW_52 = float(2**52)


@runtime_checkable
class NormalSource(Protocol):
    """Anything that draws independent standard normals."""

    # as numpy's Generator.standard_normal: a float for no ``size``, an array for a shape
    @overload
    def standard_normal(self, size: None = None) -> float: ...
    @overload
    def standard_normal(self, size: int | tuple[int, ...]) -> NDArray[np.float64]: ...


class OSEntropy:
    """Standard normals from OS entropy: ``os.urandom`` -> uniform on (0, 1) -> Phi^{-1}.

    Each uniform is (k + 1/2) / 2^52 for a uniform 52-bit integer k: every such value is an
    exact double, the grid is symmetric about 1/2 (so the normals are exactly symmetric), and
    it never hits 0 or 1 (with 53 bits, k + 1/2 is not representable near 2^53 and rounds up
    to 1, which would give an infinite "normal"). The largest normal it can produce is about
    8.2 in absolute value (probability of a true normal beyond that: 2e-16).
    """

    @overload
    def standard_normal(self, size: None = None) -> float: ...
    @overload
    def standard_normal(self, size: int | tuple[int, ...]) -> NDArray[np.float64]: ...
    def standard_normal(
        self, size: int | tuple[int, ...] | None = None
    ) -> float | NDArray[np.float64]:
        if size is None:  # one draw (a single-state step): the same arithmetic without numpy arrays
            k = int.from_bytes(os.urandom(8), "little") >> 12
            return float(ndtri((k + 0.5) / _TWO_POW_52))
        n = int(np.prod(size))
        bits = np.frombuffer(os.urandom(8 * n), dtype="<u8") >> np.uint64(12)
        z: NDArray[np.float64] = ndtri((bits.astype(np.float64) + 0.5) / _TWO_POW_52)
        return z.reshape(size)

    def __repr__(self) -> str:
        return "OSEntropy()"


def seeded_rng(seed: int) -> np.random.Generator:
    """A reproducible generator, for tests and experiments only (marks output ``seeded``)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an integer, got {seed!r}")
    return np.random.default_rng(int(seed))


def is_seeded(rng: NormalSource) -> bool:
    """True unless ``rng`` draws from OS entropy."""
    return not isinstance(rng, OSEntropy)


def resolve_rng(rng: NormalSource | int | None) -> NormalSource:
    """``None`` -> OS entropy (the release default); an int -> seeded; a source -> itself.

    numpy's and Python's *global* random state (the ``numpy.random`` or ``random`` module,
    or numpy's hidden global ``RandomState``) are refused: shared, seedable by anyone, and
    silently correlated with every other user of the process.
    """
    if rng is None:
        return OSEntropy()
    if isinstance(rng, int | np.integer) and not isinstance(rng, bool):
        return seeded_rng(int(rng))
    if isinstance(rng, types.ModuleType) or rng is _numpy_global_state():
        raise TypeError("the global random state is not a valid noise source; pass a generator")
    if isinstance(rng, NormalSource):
        return rng
    raise TypeError(f"rng must be None, an int seed or a normal source, got {rng!r}")


def _numpy_global_state() -> object:
    """numpy's hidden global RandomState (behind ``np.random.normal`` etc.), if reachable."""
    return getattr(getattr(np.random, "mtrand", None), "_rand", None)
