"""The per-(release, action) hash chain over stored noise points. Pure: no I/O.

Each row's ``hash`` is SHA-256 (or HMAC-SHA-256 under a server key) of the previous row's
hash followed by ``seq`` (big-endian int64), ``x`` and ``g`` (big-endian IEEE doubles, so the
exact stored bits are covered). The first row's "previous hash" is a genesis value bound to the
release id and action, so a chain cannot be moved to another release or action.

What a chain catches: a changed x or g, a deleted or reordered row (the next link breaks, or a
gap in ``seq`` shows), rows moved between actions. :func:`verify_chain` also reports a state
stored twice (the table has no unique x since migration 0005: such a row may even carry a
valid link if whoever wrote it could compute the chain). A truncation of the newest rows is only
caught against a remembered high-water mark / head hash (e.g. an audit report); without a key,
someone with write access can recompute the whole chain, with a key they cannot.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from qveil.json_types import JSONObject

__all__ = ["ActionIntegrity", "ChainHasher", "IntegrityReport", "genesis", "verify_chain"]

_PACK = struct.Struct(">qdd").pack
_TAG = b"qveil.noise-chain.v1\x00"


def genesis(release_id: str, action: int, key: bytes | None = None) -> bytes:
    """The "previous hash" of the first point of (release_id, action)."""
    msg = _TAG + release_id.encode("utf-8") + b"\x00" + struct.pack(">q", int(action))
    if key:
        return hmac.new(key, msg, hashlib.sha256).digest()
    return hashlib.sha256(msg).digest()


class ChainHasher:
    """Computes links ``H(prev || seq || x || g)``, keyed (HMAC) when a key is given."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or None

    @property
    def keyed(self) -> bool:
        return self._key is not None

    def genesis(self, release_id: str, action: int) -> bytes:
        return genesis(release_id, action, self._key)

    def link(self, prev: bytes, seq: int, x: float, g: float) -> bytes:
        msg = prev + _PACK(seq, x, g)
        if self._key is not None:
            return hmac.new(self._key, msg, hashlib.sha256).digest()
        return hashlib.sha256(msg).digest()

    def links(self, prev: bytes, seq: int, xs: list[float], gs: list[float]) -> list[bytes]:
        """The links of consecutive rows seq + 1, seq + 2, ... with states ``xs`` and values
        ``gs`` after ``prev``: exactly ``link`` applied row by row (a batch's chain in one
        tight loop, without a method call per row)."""
        out: list[bytes] = []
        append, pack = out.append, _PACK
        if self._key is not None:
            key, digest = self._key, hmac.digest
            for x, g in zip(xs, gs, strict=True):
                seq += 1
                prev = digest(key, prev + pack(seq, x, g), "sha256")
                append(prev)
        else:
            sha256 = hashlib.sha256
            for x, g in zip(xs, gs, strict=True):
                seq += 1
                prev = sha256(prev + pack(seq, x, g)).digest()
                append(prev)
        return out

    def key_check(self, store_id: str) -> str:
        """A value only the same key (or the same absence of a key) reproduces for this store:
        a wrong ``QVEIL_STORE_KEY`` is told apart from tampered rows."""
        return self.link(self.genesis(f"qveil.key-check:{store_id}", 0), 0, 0.0, 0.0).hex()


@dataclass(frozen=True)
class ActionIntegrity:
    """Verification result of one (release, action) chain.

    ``high_water`` is the largest stored seq (0 when empty), ``head_hash`` its hash;
    ``first_broken`` the seq of the first row whose stored hash does not follow from the row
    before it (None when every link holds); ``gaps`` the missing seq ranges (inclusive).
    """

    action: int
    ok: bool
    count: int
    high_water: int
    head_hash: str | None
    first_broken: int | None
    gaps: tuple[tuple[int, int], ...] = ()
    problems: tuple[str, ...] = ()

    def to_dict(self) -> JSONObject:
        return asdict(self) | {
            "gaps": [list(g) for g in self.gaps],
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class IntegrityReport:
    """Verification of a release: ``ok`` when every action's chain verifies."""

    release_id: str
    ok: bool
    keyed: bool
    actions: tuple[ActionIntegrity, ...] = field(default_factory=tuple)

    @property
    def first_broken(self) -> dict[int, int | None]:
        return {a.action: a.first_broken for a in self.actions}

    @property
    def gaps(self) -> dict[int, tuple[tuple[int, int], ...]]:
        return {a.action: a.gaps for a in self.actions}

    @property
    def high_water(self) -> dict[int, int]:
        return {a.action: a.high_water for a in self.actions}

    def to_dict(self) -> JSONObject:
        return asdict(self) | {"actions": [a.to_dict() for a in self.actions]}


def verify_chain(
    release_id: str,
    action: int,
    rows: Iterable[tuple[int, float, float, str]],
    hasher: ChainHasher,
) -> ActionIntegrity:
    """Check ``rows`` = (seq, x, g, hash hex) in increasing seq order against the chain.

    Every link is recomputed from the *stored* previous hash, so one changed row breaks exactly
    its own link (and is reported as ``first_broken``), a deleted row shows as a gap plus a
    broken link at the next row.
    """
    prev = hasher.genesis(release_id, action)
    expect = 1
    count = 0
    first_broken: int | None = None
    gaps: list[tuple[int, int]] = []
    problems: list[str] = []
    last_seq, last_hash = 0, None
    seen_x: dict[float, int] = {}  # state -> seq of its first row (the log has no unique x)
    for seq, x, g, h in rows:
        seq, x, g = int(seq), float(x), float(g)
        count += 1
        if seq < expect:
            problems.append(f"seq {seq} out of order or repeated (expected >= {expect})")
        elif seq > expect:
            gaps.append((expect, seq - 1))
        if not (0.0 <= x <= 1.0) or not math.isfinite(g):
            problems.append(f"seq {seq}: x={x!r} g={g!r} is not a valid point")
        if x in seen_x:
            problems.append(f"seq {seq}: state {x!r} stored twice (first at seq {seen_x[x]})")
        else:
            seen_x[x] = seq
        try:
            stored = bytes.fromhex(h)
        except (TypeError, ValueError):
            stored = b""
        if hasher.link(prev, seq, x, g) != stored and first_broken is None:
            first_broken = seq
        prev = stored
        expect = max(expect, seq + 1)
        last_seq, last_hash = max(last_seq, seq), h
    if first_broken is not None:
        problems.insert(0, f"hash chain broken at seq {first_broken}")
    if gaps:
        problems.append(
            "missing seq " + ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in gaps[:10])
        )
    ok = first_broken is None and not gaps and not problems
    return ActionIntegrity(
        action=int(action),
        ok=ok,
        count=count,
        high_water=last_seq,
        head_hash=last_hash,
        first_broken=first_broken,
        gaps=tuple(gaps),
        problems=tuple(problems),
    )
