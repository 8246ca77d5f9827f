"""The store's release registry: the releases a store logs (their noise parameters and
status), the store's identity and its key-value metadata.

:class:`ReleaseRegistry` is the object a store hands out as ``store.releases`` (the release
service, admin and the audit ask it "which release, with which parameters"); it reads and
writes through the backend's release hooks (:class:`ReleaseTable`). Nothing here touches
noise points.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, TypedDict

import numpy as np

from qveil.common.typing import ReleaseHeader
from qveil.errors import IntegrityError, InvalidArgument, NotFound, echo
from qveil.json_types import JSONObject
from qveil.server.store.models import RELEASE_STATUSES

if TYPE_CHECKING:  # for annotations only
    from qveil.bundle import Bundle

__all__ = [
    "ReleaseRecord",
    "ReleaseRegistry",
    "ReleaseTable",
    "StoreParams",
    "check_action",
    "check_status",
    "new_identity",
    "new_record",
    "store_betas",
    "store_params",
    "validate_betas",
]

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseRecord(ReleaseHeader):
    """What the store keeps of a release: its header (noise parameters, beta on the unit
    interval, status), the fingerprint of its bundle, when it was registered, and its
    coordinates.

    A release with ``dims`` = d > 1 coordinates (the additive noise kernel
    sum_j exp(-beta_j |x_j - y_j|)) has, per action, d independent 1-D OU paths g_{a,j}, each
    with the full sigma and its own ``betas[j]``. The store keeps them as ``n_paths`` =
    n_actions * d paths, path index p = a * d + j (:meth:`path`); a 1-D release has d = 1, so
    path p is action p. ``beta`` is then ``betas[0]`` (kept for the 1-D readers) and
    ``interval`` the first coordinate's raw interval.
    """

    fingerprint: str
    created_at: datetime
    dims: int = 1
    betas: tuple[float, ...] = ()

    @property
    def n_paths(self) -> int:
        """Sample paths of the release: one per (action, coordinate)."""
        return self.n_actions * self.dims

    def path(self, action: int, coordinate: int) -> int:
        """The path index of (action, coordinate): action * dims + coordinate."""
        return int(action) * self.dims + int(coordinate)

    def split(self, path: int) -> tuple[int, int]:
        """(action, coordinate) of a path index."""
        return divmod(int(path), self.dims)

    def path_beta(self, path: int) -> float:
        """The OU rate of a path: betas[coordinate] (``beta`` for a 1-D release)."""
        return self.betas[int(path) % self.dims] if self.betas else self.beta

    def to_dict(self) -> JSONObject:
        """The record as an export file's release line names it (``betas`` [] for a 1-D
        release: its rate is ``beta``)."""
        return {
            "release_id": self.release_id,
            "fingerprint": self.fingerprint,
            "sigma": self.sigma,
            "beta": self.beta,
            "interval": list(self.interval),
            "n_actions": self.n_actions,
            "status": self.status,
            "created_at": self.created_at.isoformat(),
            "dims": self.dims,
            "betas": list(self.betas),
        }


def _params(r: ReleaseRecord) -> tuple[object, ...]:
    """What two records of one release must agree on."""
    return (r.fingerprint, r.sigma, r.beta, r.interval, r.n_actions, r.betas)


def new_record(
    *,
    release_id: str,
    fingerprint: str,
    sigma: float,
    beta: float,
    interval: tuple[float, float],
    n_actions: int,
    status: str,
    betas: Sequence[float] | None,
    created_at: datetime,
) -> ReleaseRecord:
    """The checked record of a release (InvalidArgument on any bad field)."""
    if not isinstance(release_id, str) or not _ID_RE.match(release_id):
        raise InvalidArgument(
            f"release_id must be 1-128 characters of [A-Za-z0-9._:@+-], got {echo(release_id)}"
        )
    if not isinstance(fingerprint, str) or not 0 < len(fingerprint) <= 256:
        raise InvalidArgument("fingerprint must be a non-empty string of <= 256 characters")
    try:
        s, b = float(sigma), float(beta)
        lo, hi = (float(v) for v in interval)
    except (TypeError, ValueError):
        raise InvalidArgument("sigma, beta and interval must be numbers") from None
    if not math.isfinite(s) or s < 0:
        raise InvalidArgument(f"sigma must be a finite number >= 0, got {sigma!r}")
    if not math.isfinite(b) or b <= 0:
        raise InvalidArgument(f"beta must be a finite number > 0, got {beta!r}")
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise InvalidArgument(f"interval needs finite lo < hi, got {interval!r}")
    if isinstance(n_actions, bool) or not isinstance(n_actions, int | np.integer) or n_actions < 1:
        raise InvalidArgument(f"n_actions must be an integer >= 1, got {n_actions!r}")
    check_status(status)
    bs = validate_betas(betas, b)
    return ReleaseRecord(
        release_id=release_id,
        status=status,
        sigma=s,
        beta=b,
        interval=(lo, hi),
        n_actions=int(n_actions),
        fingerprint=fingerprint,
        created_at=created_at,
        dims=len(bs) or 1,
        betas=bs,
    )


def validate_betas(betas: Sequence[float] | None, beta: float) -> tuple[float, ...]:
    """The per-coordinate OU rates of a d > 1 release (``()`` for a 1-D one: its ``beta``).
    Each must be finite and > 0, and ``beta`` must equal ``betas[0]``."""
    if betas is None or (isinstance(betas, list | tuple) and len(betas) == 0):
        return ()
    try:
        bs = tuple(float(v) for v in betas)
    except (TypeError, ValueError):
        raise InvalidArgument("betas must be a list of numbers") from None
    if not 1 <= len(bs) <= 4096:
        raise InvalidArgument(f"betas needs 1..4096 values, got {len(bs)}")
    if not all(math.isfinite(v) and v > 0 for v in bs):
        raise InvalidArgument(f"every beta must be a finite number > 0, got {list(bs)[:8]!r}")
    if bs[0] != beta:
        raise InvalidArgument(f"beta must equal betas[0] ({bs[0]!r}), got {beta!r}")
    return () if len(bs) == 1 else bs


def check_status(status: str) -> str:
    if status not in RELEASE_STATUSES:
        raise InvalidArgument(f"status must be one of {RELEASE_STATUSES}, got {status!r}")
    return status


def check_action(action: int, n_actions: int) -> int:
    if isinstance(action, bool) or not isinstance(action, int | np.integer):
        raise InvalidArgument(f"action must be an integer, got {action!r}")
    a = int(action)
    if not 0 <= a < n_actions:
        raise InvalidArgument(f"action {a} is out of range [0, {n_actions})")
    return a


class StoreParams(TypedDict):
    """A bundle's noise parameters as the store records them (``create_release`` keywords)."""

    beta: float
    interval: tuple[float, float]
    betas: list[float]


def store_params(bundle: Bundle) -> StoreParams:
    """The store's noise parameters of a bundle (``create_release`` keywords): its betas (one
    per coordinate; d = 1: one), with beta and interval its first coordinate's."""
    betas = [float(b) for b in bundle.betas]
    iv = bundle.box.intervals[0]
    return {"beta": betas[0], "interval": (iv.lo, iv.hi), "betas": betas}


def store_betas(betas: Sequence[float] | None) -> tuple[float, ...]:
    """How the store records ``betas``: () for a 1-D release (its beta is ``beta``)."""
    return () if betas is None or len(betas) == 1 else tuple(float(b) for b in betas)


def new_identity(prefix: str) -> str:
    return f"{prefix}:{uuid.uuid4().hex}"


class ReleaseTable(Protocol):
    """The backend's release rows and metadata (:mod:`.memory`, :mod:`.sql`)."""

    def _check_open(self) -> None: ...

    def _db_insert_release(self, rec: ReleaseRecord) -> bool:
        """Insert; False when the id exists (nothing changed)."""
        ...

    def _db_get_release(self, release_id: str) -> ReleaseRecord | None: ...
    def _db_list_releases(self) -> list[ReleaseRecord]: ...
    def _db_set_status(self, release_id: str, status: str) -> bool: ...

    def _db_store_id(self) -> str:
        """The store's random persistent identity (``store_meta.store_id``)."""
        ...

    def _db_meta(self, key: str) -> str | None:
        """A value of the store's key-value metadata (``store_meta``), None when absent."""
        ...

    def _db_set_meta(self, values: dict[str, str], *, only_if_absent: bool) -> None:
        """Write metadata values in one transaction (insert, or also overwrite)."""
        ...


class ReleaseRegistry:
    """Releases, identity and metadata of one store (see the module docstring)."""

    def __init__(self, db: ReleaseTable) -> None:
        self._db = db
        #: the last record read of each release (its parameters never change; ``release``)
        self._cache: dict[str, ReleaseRecord] = {}
        self._store_id: str | None = None

    def create_release(
        self,
        *,
        release_id: str,
        fingerprint: str,
        sigma: float,
        beta: float,
        interval: tuple[float, float],
        n_actions: int,
        status: str = "staged",
        betas: Sequence[float] | None = None,
    ) -> ReleaseRecord:
        """Register a release. Idempotent for identical parameters; a different release under
        an existing id is refused (InvalidArgument). ``betas`` (one per coordinate)
        makes a release of d = len(betas) coordinates; None (or one beta) is a 1-D release."""
        self._db._check_open()
        rec = new_record(
            release_id=release_id,
            fingerprint=fingerprint,
            sigma=sigma,
            beta=beta,
            interval=interval,
            n_actions=n_actions,
            status=status,
            betas=betas,
            created_at=datetime.now(UTC),
        )
        if self._db._db_insert_release(rec):
            self._cache[rec.release_id] = rec
            return rec
        old = self.get_release(rec.release_id)
        if _params(old) != _params(rec):
            raise InvalidArgument(
                f"release {echo(rec.release_id)} already exists with different parameters "
                f"(fingerprint {old.fingerprint!r}, sigma {old.sigma!r}, beta {old.beta!r}, "
                f"interval {old.interval!r}, n_actions {old.n_actions}, "
                f"betas {list(old.betas)!r})"
            )
        return old

    def register_bundle(self, bundle: Bundle) -> ReleaseRecord:
        """The store's record of the bundle's release, created (staged) when absent; a record
        with different parameters is refused (IntegrityError: a release id names one noise
        path). How a server's start and ``qveil admin retrain`` register a release."""
        rid = bundle.bundle_id
        sp = store_params(bundle)
        fingerprint = str(bundle.card.get("card_sha256") or bundle.card.get("weights_sha256"))
        try:
            rec = self.get_release(rid)
        except NotFound:
            return self.create_release(
                release_id=rid,
                fingerprint=fingerprint,
                sigma=bundle.sigma,
                n_actions=bundle.n_actions,
                status="staged",
                **sp,
            )
        mismatch = [
            name
            for name, a, b in (
                ("fingerprint", rec.fingerprint, fingerprint),
                ("sigma", float(rec.sigma), bundle.sigma),
                ("beta", float(rec.beta), sp["beta"]),
                ("betas", tuple(rec.betas), store_betas(sp["betas"])),
                ("interval", tuple(map(float, rec.interval)), sp["interval"]),
                ("n_actions", int(rec.n_actions), bundle.n_actions),
            )
            if a != b
        ]
        if mismatch:
            raise IntegrityError(
                f"release {echo(rid)} is registered in the store with different "
                f"{', '.join(mismatch)} than the bundle"
            )
        return rec

    def get_release(self, release_id: str) -> ReleaseRecord:
        """The release's current record (status read from the database), or NotFound."""
        self._db._check_open()
        if not isinstance(release_id, str):
            raise InvalidArgument(f"release_id must be a string, got {echo(release_id)}")
        rec = self._db._db_get_release(release_id)
        if rec is None:
            raise NotFound(f"no release {echo(release_id)} in this store")
        self._cache[release_id] = rec
        return rec

    def list_releases(self) -> list[ReleaseRecord]:
        self._db._check_open()
        return self._db._db_list_releases()

    @property
    def store_id(self) -> str:
        """This store's random, persistent identity: drawn when the store was created, the same
        for every process and replica that opens it, different for any other (or re-created)
        database."""
        self._db._check_open()
        if self._store_id is None:
            self._store_id = self._db._db_store_id()
        return self._store_id

    def meta_value(self, key: str, make: Callable[[], str]) -> str:
        """The store's metadata value under ``key``; when absent, ``make()`` is stored first
        (the first writer wins a race: every process reads the one value stored)."""
        self._db._check_open()
        got = self._db._db_meta(key)
        if got is None:
            self._db._db_set_meta({key: make()}, only_if_absent=True)
            got = self._db._db_meta(key)
        assert got is not None
        return got

    def set_release_status(self, release_id: str, status: str) -> ReleaseRecord:
        self._db._check_open()
        check_status(status)
        if not self._db._db_set_status(release_id, status):
            raise NotFound(f"no release {echo(release_id)} in this store")
        return self.get_release(release_id)

    def release(self, release_id: str) -> ReleaseRecord:
        """The release's record, read once (its noise parameters never change), or NotFound."""
        rec = self._cache.get(release_id)
        return rec if rec is not None else self.get_release(release_id)

    def dims(self, release_id: str) -> int:
        """The release's coordinate count (1 when it is unknown here)."""
        rec = self._cache.get(release_id)
        if rec is None:
            rec = self._db._db_get_release(release_id)
        return 1 if rec is None else rec.dims

    def split(self, release_id: str, path: int) -> tuple[int, int]:
        """(action, coordinate) of a path index of the release (the backends' row key)."""
        return divmod(int(path), self.dims(release_id))
