"""Keyed release noise: every noise path of a release is a pure function of one secret key.

A release's noise is a set of independent 1-D Ornstein-Uhlenbeck paths (docs/privacy.md
section 10), path ``p = action * dims + coordinate``, each

    g_p ~ GP(0, sigma^2 exp(-beta_j |x - y|)) on [0, 1],     j = p mod dims,

evaluated only on the dyadic grid ``i 2^-K``, i = 0 .. 2^K, K = :data:`GRID_LEVELS` = 32,
by the midpoint (Levy) construction:

* level 0: g(0) = sigma z(0, 0);  g(1) = rho g(0) + s_0 z(0, 1), with rho = exp(-beta) and
  s_0 = sigma sqrt(1 - rho^2);
* level l >= 1: the bracket [L, R] of width 2^-(l-1) that holds the target (bracket index
  j = t >> (K - l + 1) for the target's grid index t) has its midpoint m at distance
  h = 2^-l from both ends; with a = exp(-beta h),

      g(m) = c_l (g(L) + g(R)) + s_l z(l, j),
      c_l = a / (1 + a^2),   s_l = sigma sqrt((1 - a^2) / (1 + a^2)),

  and the descent continues into the half that holds the target until the target is a
  bracket end (at most K levels). Every 1 - exp(-2 x) is ``-expm1(-2 x)``.

The OU process is Markov, so given the bracket ends the midpoint is independent of
everything outside the bracket and has exactly the bridge law above: each node is drawn once,
from a node set fixed in advance, so the values at any set of grid points have the process's
finite-dimensional law whatever points are asked for and in whatever order.

**The normals.** z(l, j) of path p is one AES-256 block (the release key; ECB, i.e. the raw
block cipher used as a PRF) of the 16-byte counter block

    byte 0: DOMAIN_TAG | byte 1: level l | bytes 2-7: path p (little-endian, < 2^48)
    | bytes 8-15: j (little-endian uint64)

whose output's first 8 bytes, read as a little-endian uint64 w, give a 52-bit integer
k = w mod 2^52 and a sign bit (w >> 52) & 1: u = (k + 1/2) / 2^53 is an exact double in
(0, 1/2), and z = -ndtri(u) if the sign bit is set, else ndtri(u). So the normals are exactly
symmetric, discretised at 2^-53 in probability, and cut at |z| = -ndtri(2^-54) = 8.29 (a true
normal lies beyond that with probability 1.1e-16).

**Exactly reproducible.** Each value is computed by the same float operations in the same
order whether it is asked for alone or in a batch of 10,000, in plain Python floats (calls
with at most :data:`FEW_VALUES` values below the table) or numpy arrays (the others), so
results are bit-identical however the states are split into calls, in whatever order, in any
process (with the same scipy: the normals go through its ``ndtri``, always on a float64
array; tests/unit/core/test_keyed.py pins golden values). A call of at most
:data:`FEW_VALUES` values (states x actions x coordinates, grid indices as snap gives them)
also builds its counter blocks and reads its table entries in Python (one AES call and one
``ndtri`` call in all; the normals of levels below a target's own are not drawn, as their
nodes are not used): on the serving path numpy's fixed cost per call, not the arithmetic,
is what a single state pays.

**The table.** When a :class:`KeyedPaths` is built, the values at all grid points of the top
:data:`TABLE_LEVELS` = 12 levels (multiples of 2^-12: 4097 values a path) are computed
level by level, vectorised (a pure function of the key, so its cost reveals nothing); a query
starts from its level-12 bracket and descends the remaining 20 levels.

Pure: the only I/O is ``os.urandom`` in :func:`new_key`. Thread-safe: a :class:`KeyedPaths`
never changes after it is built, and each thread uses its own AES encryptor.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import threading
from collections.abc import Sequence
from typing import cast

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes
from scipy.special import ndtri

from qveil.errors import InvalidArgument

__all__ = [
    "DOMAIN_TAG",
    "FEW_VALUES",
    "GRID_LEVELS",
    "KEY_BYTES",
    "TABLE_LEVELS",
    "KeyedPaths",
    "level_constants",
    "new_key",
    "seeded_key",
    "snap",
    "sum_coordinates",
]

FloatArray = npt.NDArray[np.float64]
UInt64Array = npt.NDArray[np.uint64]

#: K: the grid is i 2^-K, i = 0 .. 2^K (spacing 2.3e-10 in unit coordinates).
GRID_LEVELS: int = 32
#: The release key: an AES-256 key.
KEY_BYTES: int = 32
#: T: the levels whose values are tabulated when the paths are built (2^T + 1 per path).
TABLE_LEVELS: int = 12
#: Byte 0 of every counter block ("K"): keeps these blocks apart from any other use of the key.
DOMAIN_TAG: int = 0x4B
#: Calls with at most this many values (states x actions x dims) below the table descend in
#: plain Python floats, the others in numpy (the same operations, so the same bits): the
#: measured crossover (about 95 us each way at 32 values, on a shared 2-core machine).
FEW_VALUES: int = 32

_K = GRID_LEVELS
_T = TABLE_LEVELS
_N = 1 << _K  # the largest grid index
_TABLE_SHIFT = _K - _T  # grid index >> this = table index of the bracket's left end
_TABLE_LOW = (1 << _TABLE_SHIFT) - 1
_TABLE_SIZE = (1 << _T) + 1
_MAX_PATHS = 1 << 48
_MASK52 = (1 << 52) - 1
_TWO_M53 = 2.0**-53
_UNIT = 2.0**-_K
_SCALE = float(_N)
_DEEP = _K - _T  # levels below the table
#: Counter blocks per AES + ndtri pass, and targets per descent slice: every temporary array
#: stays under glibc's mmap threshold (128 KiB), so it is reused memory, not fresh pages
#: (fresh pages cost about as much as the arithmetic here).
_NODE_CHUNK = 4096
_DEEP_LEVELS = np.arange(_T + 1, _K + 1, dtype=np.uint64)
#: word 0 of the counter block of each level below the table, without the path
_LEVEL_WORDS = np.uint64(DOMAIN_TAG) | (_DEEP_LEVELS << np.uint64(8))
#: j = t >> (K - l + 1) at each level below the table
_J_SHIFTS = np.uint64(_K + 1) - _DEEP_LEVELS
#: the table's nodes in z's order: level 0's two (j = 0, 1), then level l's 2^(l-1), l = 1..T
_TABLE_LEVELS_OF_NODES = np.repeat(
    np.arange(_T + 1, dtype=np.uint64), [2] + [1 << (level - 1) for level in range(1, _T + 1)]
)
_TABLE_WORDS = np.uint64(DOMAIN_TAG) | (_TABLE_LEVELS_OF_NODES << np.uint64(8))
_TABLE_JS = np.concatenate(
    [np.arange(2, dtype=np.uint64)]
    + [np.arange(1 << (level - 1), dtype=np.uint64) for level in range(1, _T + 1)]
)
#: bit K - l of t says which half of the level-l bracket holds t
_BITS = np.uint64(1) << (np.uint64(_K) - _DEEP_LEVELS)


def sum_coordinates(values: FloatArray) -> FloatArray:
    """(n, m, dims) per-coordinate values -> (n, m): added in the order j = 0, 1, ..., dims - 1
    (one order everywhere, so the same bits everywhere)."""
    res: FloatArray = values[:, :, 0]
    for j in range(1, values.shape[2]):
        res = res + values[:, :, j]
    return res


def seeded_key(seed: int) -> bytes:
    """A key derived from ``seed``: for tests and experiments only (whoever uses one marks the
    release ``seeded``; a release's key comes from :func:`new_key`)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise InvalidArgument(f"seed must be an integer, got {seed!r}")
    return hashlib.sha256(b"qveil seeded noise key\0" + str(int(seed)).encode()).digest()


def new_key() -> bytes:
    """A fresh release key: ``KEY_BYTES`` bytes of OS entropy (the only entropy drawn)."""
    return os.urandom(KEY_BYTES)


def snap(units: npt.ArrayLike) -> tuple[UInt64Array, FloatArray]:
    """Unit coordinates in [0, 1] (any shape) -> (grid index, snapped coordinate), same shape.

    The grid index is rint(u 2^K) (the nearest grid point; an exact tie, an odd multiple of
    2^-(K+1), goes to the even index) as uint64, the snapped coordinate index * 2^-K (exact).
    Evaluate the model's mean at the snapped coordinate too (docs/privacy.md section 10).
    NaN, infinities, values outside [0, 1] and non-numbers raise :class:`InvalidArgument`.
    At most :data:`FEW_VALUES` float64 coordinates are snapped with Python floats (``round``
    is round-half-even like ``np.rint``, and u 2^K and index 2^-K are exact): the same bits.
    """
    if type(units) is np.ndarray and units.dtype == np.float64 and units.size <= FEW_VALUES:
        flat: list[float] = units.reshape(-1).tolist()
        if all(0.0 <= v <= 1.0 for v in flat):  # else the numpy path names the bad value
            ints = [round(v * _SCALE) for v in flat]
            return (
                np.array(ints, dtype=np.uint64).reshape(units.shape),
                np.array([i * _UNIT for i in ints], dtype=np.float64).reshape(units.shape),
            )
    try:
        raw = np.asarray(units)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"unit coordinates must be numbers: {exc}") from None
    if raw.dtype.kind not in "iuf":
        raise InvalidArgument(f"unit coordinates must be real numbers, got dtype {raw.dtype}")
    u = raw.astype(np.float64, copy=False)
    bad = ~((u >= 0.0) & (u <= 1.0))  # NaN fails both comparisons
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        raise InvalidArgument(
            f"unit coordinate {u.reshape(-1)[i]!r} at index {i} is not a finite number in [0, 1]"
        )
    idx: UInt64Array = np.rint(u * _SCALE).astype(np.uint64)
    snapped: FloatArray = idx.astype(np.float64) * _UNIT
    return idx, snapped


def level_constants(
    beta: float, sigma: float, levels: int = GRID_LEVELS
) -> tuple[list[float], list[float]]:
    """The construction's constants for one path, ``(c, s)``, each of length ``levels + 1``.

    ``c[0], s[0]`` = rho = exp(-beta) and sigma sqrt(1 - rho^2), level 0's law of g(1) given
    g(0); for l >= 1, with a = exp(-beta 2^-l), ``c[l]`` = a / (1 + a^2) and ``s[l]`` =
    sigma sqrt((1 - a^2) / (1 + a^2)), the midpoint's weight on each bracket end and its
    standard deviation given them. 1 - a^2 is -expm1(-2 beta h): full relative precision
    from beta h ~ 1e-10 up (and a underflows cleanly to 0 for a large beta h). The one place
    these numbers are computed (the tests replace it to show their checks' power)."""
    c = [math.exp(-beta)]
    s = [sigma * math.sqrt(-math.expm1(-2.0 * beta))]
    for level in range(1, levels + 1):
        h = math.ldexp(1.0, -level)
        a = math.exp(-beta * h)
        c.append(a / (1.0 + a * a))
        s.append(sigma * math.sqrt(-math.expm1(-2.0 * beta * h) / (1.0 + a * a)))
    return c, s


def _normals(enc: CipherContext, blocks: npt.NDArray[np.uint64]) -> FloatArray:
    """The standard normals of counter blocks given as (..., 2) uint64 words (word 0 = bytes
    0-7, word 1 = bytes 8-15, little-endian), in passes of at most ``_NODE_CHUNK`` blocks."""
    shape = blocks.shape[:-1]
    flat = np.ascontiguousarray(blocks, dtype="<u8").reshape(-1, 2)
    n = flat.shape[0]
    if n <= _NODE_CHUNK:
        return _normals_pass(enc, flat).reshape(shape)
    z = np.empty(n, dtype=np.float64)
    for a in range(0, n, _NODE_CHUNK):
        z[a : a + _NODE_CHUNK] = _normals_pass(enc, flat[a : a + _NODE_CHUNK])
    return z.reshape(shape)


def _normals_pass(enc: CipherContext, blocks: npt.NDArray[np.uint64]) -> FloatArray:
    """One AES call and one ndtri call: u = (k + 1/2) 2^-53 from the low 52 bits k of each
    output's first 8 bytes (little-endian), z = ndtri(u), negated when bit 52 is set."""
    data = blocks.reshape(-1).view(np.uint8)
    out = np.empty(data.size + 15, dtype=np.uint8)  # update_into wants a block of slack
    enc.update_into(data.data, out.data)  # much faster than update() on big inputs
    w = out[: data.size].view("<u8")[0::2]
    u = ((w & np.uint64(_MASK52)).astype(np.float64) + 0.5) * _TWO_M53
    z: FloatArray = ndtri(u)
    return np.where((w & np.uint64(1 << 52)) != 0, -z, z)


def _check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InvalidArgument(f"{name} must be a finite number > 0, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise InvalidArgument(f"{name} must be a finite number > 0, got {value!r}")
    return v


class KeyedPaths:
    """Every noise path of one release: path id p = action * dims + coordinate.

    ``key``: the release's secret (``KEY_BYTES`` bytes; :func:`new_key`), never shown in a
    repr or an error. ``betas``: one beta > 0 per state coordinate (``dims = len(betas)``).
    ``sigma`` >= 0: every path carries the full sigma (an additive kernel, docs/privacy.md
    2.6); sigma = 0 gives zeros. ``n_actions`` >= 1.

    :meth:`noise` gives, for grid indices of shape (n, dims) (see :func:`snap`), the
    (n, n_actions) sums sum_j g_{a dims + j}(idx[:, j]); :meth:`path_values` one path's
    values. Both are bit-identical however the states are split into calls.
    """

    __slots__ = (
        "_key",
        "_betas",
        "_sigma",
        "_n_actions",
        "_dims",
        "_c",
        "_s",
        "_cs",
        "_ss",
        "_table",
        "_flat",
        "_local",
        "_pids",
    )

    def __init__(self, *, key: bytes, betas: Sequence[float], sigma: float, n_actions: int) -> None:
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            what = f"{len(key)} bytes" if isinstance(key, bytes) else type(key).__name__
            raise InvalidArgument(f"key must be exactly {KEY_BYTES} bytes, got {what}")
        if isinstance(betas, str | bytes) or not isinstance(betas, Sequence | np.ndarray):
            raise InvalidArgument(f"betas must be a sequence of numbers, got {betas!r}")
        if len(betas) == 0:
            raise InvalidArgument("betas must hold one beta per state coordinate, got none")
        bs = tuple(_check_positive(f"betas[{i}]", b) for i, b in enumerate(betas))
        if isinstance(sigma, bool) or not isinstance(sigma, int | float | np.integer | np.floating):
            raise InvalidArgument(f"sigma must be a finite number >= 0, got {sigma!r}")
        sg = float(sigma)
        if not math.isfinite(sg) or sg < 0:
            raise InvalidArgument(f"sigma must be a finite number >= 0, got {sigma!r}")
        if isinstance(n_actions, bool) or not isinstance(n_actions, int | np.integer):
            raise InvalidArgument(f"n_actions must be an integer >= 1, got {n_actions!r}")
        if n_actions < 1:
            raise InvalidArgument(f"n_actions must be an integer >= 1, got {n_actions!r}")
        if int(n_actions) * len(bs) >= _MAX_PATHS:
            raise InvalidArgument(
                f"n_actions x dims must be below 2^48, got {int(n_actions)} x {len(bs)}"
            )
        self._key = key
        self._betas = bs
        self._sigma = sg
        self._n_actions = int(n_actions)
        self._dims = len(bs)
        self._local = threading.local()
        self._pids = np.arange(self.n_paths, dtype=np.uint64).reshape(1, self._n_actions, -1)
        per_beta = [level_constants(b, sg) for b in bs]
        n_paths = self._n_actions * self._dims
        # per path: c[l], s[l] (Python floats for the few-values path, arrays for the others)
        self._cs = [per_beta[p % self._dims][0] for p in range(n_paths)]
        self._ss = [per_beta[p % self._dims][1] for p in range(n_paths)]
        self._c = np.array(self._cs, dtype=np.float64).reshape(n_paths, _K + 1)
        self._s = np.array(self._ss, dtype=np.float64).reshape(n_paths, _K + 1)
        self._table = self._build_table()
        self._table.flags.writeable = False
        # a memoryview of float64 (fast float reads; numpy types .data as of bytes)
        self._flat = cast("memoryview[float]", self._table.reshape(-1).data)

    # -- properties ------------------------------------------------------------------------

    @property
    def dims(self) -> int:
        return self._dims

    @property
    def n_actions(self) -> int:
        return self._n_actions

    @property
    def sigma(self) -> float:
        return self._sigma

    @property
    def betas(self) -> tuple[float, ...]:
        return self._betas

    @property
    def n_paths(self) -> int:
        return self._n_actions * self._dims

    def __repr__(self) -> str:  # never the key
        return (
            f"KeyedPaths(dims={self._dims}, n_actions={self._n_actions}, "
            f"sigma={self._sigma!r}, betas={self._betas!r})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("KeyedPaths holds a release key and is not pickled; pass the key")

    # -- public API ------------------------------------------------------------------------

    def path_values(self, path: int, idx: UInt64Array) -> FloatArray:
        """g_path at the grid indices ``idx`` (1-D, integers in [0, 2^K]), as float64."""
        if isinstance(path, bool) or not isinstance(path, int | np.integer):
            raise InvalidArgument(f"path must be an integer, got {path!r}")
        if not 0 <= path < self.n_paths:
            raise InvalidArgument(f"path {path!r} is not in [0, {self.n_paths})")
        arr = _check_indices(idx, None)
        if self._sigma == 0.0 or arr.size == 0:
            return np.zeros(arr.size, dtype=np.float64)
        return self._values(np.full(arr.size, int(path), dtype=np.uint64), arr)

    def coordinate_values(
        self, idx: UInt64Array, actions: Sequence[int] | None = None
    ) -> FloatArray:
        """Grid indices of shape (n, dims) -> (n, len(actions), dims): g_{a dims + j}(idx[:, j])
        for each action a of ``actions`` (default: all) and coordinate j, unsummed (what the
        answer log keeps, path by path)."""
        acts = list(range(self._n_actions)) if actions is None else [int(a) for a in actions]
        for a in acts:
            if not 0 <= a < self._n_actions:
                raise InvalidArgument(f"action {a!r} is not in [0, {self._n_actions})")
        dims = self._dims
        if (
            type(idx) is np.ndarray
            and idx.dtype == np.uint64
            and idx.ndim == 2
            and idx.shape[1] == dims
            and 0 < idx.size * len(acts) <= FEW_VALUES
            and self._sigma != 0.0
        ):  # a few values (what snap gives for a query's few states): in Python
            rows: list[list[int]] = idx.tolist()
            for row in rows:
                for t_ in row:
                    if t_ > _N:
                        raise InvalidArgument(f"grid index {t_} is above 2^{_K} = {_N}")
            vals = self._few_values(rows, acts)
            return np.array(vals, dtype=np.float64).reshape(len(rows), len(acts), dims)
        arr = _check_indices(idx, dims)
        n = arr.shape[0]
        shape = (n, len(acts), dims)
        if self._sigma == 0.0 or n == 0 or not acts:
            return np.zeros(shape, dtype=np.float64)
        t = np.empty(shape, dtype=np.uint64)
        t[...] = arr[:, None, :]
        p = np.empty(shape, dtype=np.uint64)
        p[...] = self._pids[:, acts, :]
        return self._values(p.reshape(-1), t.reshape(-1)).reshape(shape)

    def noise(self, idx: UInt64Array, actions: Sequence[int] | None = None) -> FloatArray:
        """Grid indices of shape (n, dims) -> (n, len(actions)) (default: every action):
        sum_j g_{a dims + j}(idx[:, j]), the coordinates' values added in the order
        j = 0, 1, ..., dims - 1 (:func:`sum_coordinates`)."""
        return sum_coordinates(self.coordinate_values(idx, actions))

    # -- the construction ------------------------------------------------------------------

    def _encryptor(self) -> CipherContext:
        """This thread's AES-256-ECB encryptor (stateless between whole blocks; one per
        thread, since an encryptor is not safe to share)."""
        enc: CipherContext | None = getattr(self._local, "enc", None)
        if enc is None:
            enc = Cipher(algorithms.AES(self._key), modes.ECB()).encryptor()
            self._local.enc = enc
        return enc

    def _build_table(self) -> FloatArray:
        """g_p at the 2^T + 1 grid points of the top T levels, for every path p: the normals
        of all their nodes at once (:func:`_normals`), then levels 0..T, each level one
        vectorised step over its nodes and the paths."""
        n_paths = self.n_paths
        pid = np.arange(n_paths, dtype=np.uint64)[:, None]
        blocks = np.empty((n_paths, _TABLE_SIZE, 2), dtype=np.uint64)
        blocks[:, :, 0] = _TABLE_WORDS[None, :] | (pid << np.uint64(16))
        blocks[:, :, 1] = _TABLE_JS[None, :]
        z = _normals(Cipher(algorithms.AES(self._key), modes.ECB()).encryptor(), blocks)
        c, s = self._c, self._s
        tab = np.empty((n_paths, _TABLE_SIZE), dtype=np.float64)
        tab[:, 0] = self._sigma * z[:, 0]
        tab[:, -1] = c[:, 0] * tab[:, 0] + s[:, 0] * z[:, 1]
        pos = 2  # the level's first normal in z's columns
        for level in range(1, _T + 1):
            step = 1 << (_T - level + 1)  # bracket width, in table indices
            width = 1 << (level - 1)  # brackets at this level
            tab[:, step // 2 :: step] = (
                c[:, level, None] * (tab[:, :-1:step] + tab[:, step::step])
                + s[:, level, None] * z[:, pos : pos + width]
            )
            pos += width
        return tab

    def _values(self, paths: UInt64Array, ts: UInt64Array) -> FloatArray:
        """g_paths[k](ts[k]) (1-D arrays): a table point is read from the table; any other
        target descends from its level-T bracket through all K - T levels below the table
        (the nodes past the level where it is a midpoint are drawn and not used: it is then
        the left end of every bracket, so its value stays in g_left)."""
        base = paths * np.uint64(_TABLE_SIZE) + (ts >> np.uint64(_TABLE_SHIFT))
        out: FloatArray = self._table.reshape(-1)[base]
        deep = np.flatnonzero(ts & np.uint64(_TABLE_LOW))
        if deep.size == 0:
            return out
        t, p, b = ts[deep], paths[deep], base[deep]
        if deep.size <= FEW_VALUES:
            z = self._deep_normals(p << np.uint64(16), t, 0, _DEEP).T.tolist()
            out[deep] = self._descend_few(p.tolist(), t.tolist(), b.tolist(), z)
        else:
            out[deep] = self._descend_many(p, t, b)
        return out

    def _few_values(self, rows: list[list[int]], acts: list[int]) -> list[float]:
        """:meth:`coordinate_values` of a few grid index rows (Python ints, checked) in
        plain Python, flattened in (state, action, coordinate) order: the table entry of a
        table point; for any other target the normals of levels T + 1 .. its own level
        (:meth:`_deep_normals`'s counter blocks, packed here; one AES call and one ``ndtri``
        call for the whole call, u and the sign as :func:`_normals_pass` computes them),
        then :meth:`_descend_few`. The same operations, so the same bits."""
        dims, tab = self._dims, self._flat
        out: list[float] = []
        deep: list[tuple[int, int, int, int, int]] = []  # (out index, path, t, base, stop)
        words: list[int] = []
        for row in rows:
            for a in acts:
                p = a * dims
                for t in row:
                    base = p * _TABLE_SIZE + (t >> _TABLE_SHIFT)
                    if t & _TABLE_LOW:
                        stop = _K - ((t & -t).bit_length() - 1)  # the level where t is a midpoint
                        w0 = DOMAIN_TAG | (p << 16)
                        for level in range(_T + 1, stop + 1):
                            words.append(w0 | (level << 8))
                            words.append(t >> (_K + 1 - level))
                        deep.append((len(out), p, t, base, stop))
                        out.append(0.0)
                    else:
                        out.append(tab[base])
                    p += 1
        if not deep:
            return out
        n = len(words)
        ct = self._encryptor().update(struct.pack(f"<{n}Q", *words))
        ws = struct.unpack(f"<{n}Q", ct)[0::2]  # each output block's first 8 bytes
        z: list[float] = ndtri(
            np.array([((w & _MASK52) + 0.5) * _TWO_M53 for w in ws], dtype=np.float64)
        ).tolist()
        z = [-v if w >> 52 & 1 else v for v, w in zip(z, ws, strict=True)]
        zs: list[list[float]] = []  # each target's normals, levels T + 1 .. its own
        k = 0
        for _at, _p, _t, _base, stop in deep:
            zs.append(z[k : k + stop - _T])
            k += stop - _T
        got = self._descend_few(
            [d[1] for d in deep], [d[2] for d in deep], [d[3] for d in deep], zs
        )
        for (at, *_rest), g in zip(deep, got, strict=True):
            out[at] = g
        return out

    def _deep_normals(self, w0: UInt64Array, t: UInt64Array, i0: int, i1: int) -> FloatArray:
        """(levels, targets) normals z(l, t >> (K - l + 1)) for the levels l = T + 1 + i,
        i0 <= i < i1, of the targets ``t``; ``w0`` = path << 16 per target."""
        blocks = np.empty((i1 - i0, t.size, 2), dtype=np.uint64)
        blocks[:, :, 0] = _LEVEL_WORDS[i0:i1, None] | w0[None, :]
        blocks[:, :, 1] = t[None, :] >> _J_SHIFTS[i0:i1, None]
        return _normals(self._encryptor(), blocks)

    def _descend_few(
        self, paths: list[int], ts: list[int], bases: list[int], zs: list[list[float]]
    ) -> list[float]:
        """:meth:`_descend_many` in plain Python floats (the same operations in the same
        order), stopping at the level where the target is the midpoint; ``zs[k]`` holds the
        normals of target k from level T + 1 on (at least up to that level)."""
        tab, c_all, s_all = self._flat, self._cs, self._ss
        res: list[float] = []
        for p, t, base, z in zip(paths, ts, bases, zs, strict=True):
            cs, ss = c_all[p], s_all[p]
            g_left, g_right = tab[base], tab[base + 1]
            stop = _K - ((t & -t).bit_length() - 1)  # the level where t is a midpoint
            for level in range(_T + 1, stop + 1):
                g = cs[level] * (g_left + g_right) + ss[level] * z[level - _T - 1]
                if t >> (_K - level) & 1:
                    g_left = g
                else:
                    g_right = g
            res.append(g_left)
        return res

    def _descend_many(self, p: UInt64Array, t: UInt64Array, base: UInt64Array) -> FloatArray:
        """The descent from the level-T bracket (table entries ``base``, ``base + 1``) of the
        targets ``t`` of paths ``p``. At level l the bracket's midpoint gets
        c_l (g_left + g_right) + s_l z; bit K - l of t says which half holds t (1: the right
        one, so g_left becomes the midpoint's value). When t is the midpoint that bit is 1
        and every lower one 0, so g_left keeps t's value to the end. Normals are drawn for
        a group of levels and a slice of targets at a time (at most ``_NODE_CHUNK`` nodes)."""
        m = t.size
        flat = self._table.reshape(-1)
        g_left, g_right = flat[base], flat[base + np.uint64(1)]
        w0 = p << np.uint64(16)
        pi = p.astype(np.intp)
        same = len(set(self._betas)) == 1  # one set of constants: multiply by Python floats
        step = min(m, _NODE_CHUNK)
        group = max(1, _NODE_CHUNK // step)
        for i0 in range(0, _DEEP, group):
            i1 = min(_DEEP, i0 + group)
            for a in range(0, m, step):
                tt = t[a : a + step]
                z = self._deep_normals(w0[a : a + step], tt, i0, i1)
                gl, gr = g_left[a : a + step], g_right[a : a + step]
                for i in range(i0, i1):
                    level = _T + 1 + i
                    if same:
                        c, s = self._cs[0][level], self._ss[0][level]
                        g = c * (gl + gr) + s * z[i - i0]
                    else:
                        pa = pi[a : a + step]
                        g = self._c[pa, level] * (gl + gr) + self._s[pa, level] * z[i - i0]
                    right = (tt & _BITS[i]) != 0
                    gl = np.where(right, g, gl)
                    gr = np.where(right, gr, g)
                g_left[a : a + step], g_right[a : a + step] = gl, gr
        return g_left


def _check_indices(idx: object, dims: int | None) -> UInt64Array:
    """Grid indices as uint64: 1-D (``dims`` None) or (n, dims), integers in [0, 2^K]."""
    try:
        raw = np.asarray(idx)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"grid indices must be integers: {exc}") from None
    if raw.dtype.kind not in "iu" and not (raw.dtype.kind in "fO" and raw.size == 0):
        raise InvalidArgument(f"grid indices must be integers, got dtype {raw.dtype}")
    if dims is None and raw.ndim != 1:
        raise InvalidArgument(f"grid indices must be a 1-D array, got shape {raw.shape}")
    if dims is not None and (raw.ndim != 2 or raw.shape[1] != dims):
        raise InvalidArgument(f"grid indices must have shape (n, {dims}), got {raw.shape}")
    if raw.size and raw.dtype.kind == "i" and int(raw.min()) < 0:
        raise InvalidArgument(f"grid index {int(raw.min())} is negative")
    arr = raw.astype(np.uint64, copy=False)
    if arr.size and int(arr.max()) > _N:
        raise InvalidArgument(f"grid index {int(arr.max())} is above 2^{_K} = {_N}")
    return arr
