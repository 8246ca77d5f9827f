"""The store's interface and the backend-independent part of ``get_or_sample``.

Every backend keeps, per (release, action), an in-process copy of the committed points: a
sorted map x -> g plus the high-water mark (largest seq seen) and the head hash. Values never
change, so a state found in the copy is answered without touching the database (cached hits
are always right). States not in the copy are resolved by group commit (:meth:`_resolve`):
the new states of every caller, release and action that arrive while a commit is in flight
are stored together by the next transaction. That transaction holds the lock of each of its
(release, action) pairs (process-wide thread locks taken in sorted order, plus the backend's
cross-process lock: SQLite ``BEGIN IMMEDIATE``, PostgreSQL ``pg_advisory_xact_lock`` per pair,
in sorted order), and *inside* it, per pair:

1. read from the database every row committed since the copy's high-water mark (seq order),
   so any neighbour another thread, process or replica inserted is known (skipped when the
   backend can tell that nobody else wrote: SQLite ``PRAGMA data_version``);
2. look up the nearest stored point on each side of every new state (the copy's sorted
   index, :mod:`.pathindex`, vectorised) and call :func:`qveil.noise.sample_batch`:
   the new states are drawn one after another in the order given, each conditioned on its
   nearest neighbours among the stored points and the batch's earlier draws; by the Markov
   property of the OU kernel that is the exact joint conditional law (NOTES-privacy section
   1); the store does no math;
3. insert the new rows of all pairs (seq = high-water + 1, ..., chained hashes per pair) and
   check they were all written (a row that is not ours means a lost race: roll back and
   retry the whole transaction);
4. commit durably; only then add the new points to the copies and wake their callers (a
   failed attempt has changed no copy: there is nothing to undo).

A value drawn in an attempt that fails is never returned and never enters the copy; so a
crash before the commit loses only points nobody was answered with.

**One value per state without a unique index.** The database table is an append log
(migration 0005): its only key is (release, action, coordinate, seq). Step 1 makes the copy
complete under the lock, so step 2 draws only states that no committed row holds. A writer
whose copy missed a row (a bug in step 1) is still stopped by the database in step 3: its
seqs start at its high-water mark + 1, which is the missed row's seq, so that insert is
skipped by the primary key, the confirm re-select sees a row that is not its own, and the
transaction is rolled back and retried with a full re-read (the version token is dropped).
A second row for one state can therefore only come from a bug or from tampering: loading
it (:meth:`SamplePathStore._apply`) refuses the path, which is then neither sampled nor
answered by this process again (IntegrityError, nothing written), while the other paths of
a group commit are stored; ``verify`` and ``qveil audit`` report the row.
"""

from __future__ import annotations

import math
import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from itertools import repeat
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from qveil.errors import IntegrityError, InvalidArgument, NotFound, QveilError, Unavailable, echo
from qveil.noise import sample_batch, validate_unit_states
from qveil.rng import NormalSource, is_seeded, resolve_rng
from qveil.server.store.integrity import (
    ChainHasher,
    IntegrityReport,
    verify_chain,
)
from qveil.server.store.models import RELEASE_STATUSES
from qveil.server.store.pathindex import SortedPoints

__all__ = [
    "FullRow",
    "InsertRecord",
    "NoisePoint",
    "ReleaseBinding",
    "ReleaseRecord",
    "Row",
    "SamplePathStore",
]

FloatArray = npt.NDArray[np.float64]
#: A stored row as the backends exchange it: (seq, x, g, created_at, hash hex).
Row = tuple[int, float, float, float, str]
#: A row with its key: (release_id, action, seq, x, g, created_at, hash hex).
FullRow = tuple[str, int, int, float, float, float, str]

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")
MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class ReleaseRecord:
    """One release's noise parameters (beta on the unit interval) and status.

    A release with ``dims`` = d > 1 coordinates (issue 16: the additive noise kernel
    sum_j exp(-beta_j |x_j - y_j|)) has, per action, d independent 1-D OU paths g_{a,j}, each
    with the full sigma and its own ``betas[j]``. The store keeps them as ``n_paths`` =
    n_actions * d paths, path index p = a * d + j (:meth:`path`); a 1-D release has d = 1, so
    path p is action p, exactly as before. ``beta`` is then ``betas[0]`` (kept for the 1-D
    readers) and ``interval`` the first coordinate's raw interval.
    """

    release_id: str
    fingerprint: str
    sigma: float
    beta: float
    interval: tuple[float, float]
    n_actions: int
    status: str
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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["interval"] = list(self.interval)
        d["created_at"] = self.created_at.isoformat()
        d["betas"] = list(self.betas)  # [] for a 1-D release (its rate is beta)
        return d


@dataclass(frozen=True)
class ReleaseBinding:
    """A release bound to a store (issue 14, item 2): the fingerprint of the bundle whose noise
    the store holds, when it was bound and the id of the store that first drew the noise (this
    store, or the one it was imported from)."""

    release_id: str
    fingerprint: str
    bound_at: str
    origin_store_id: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class NoisePoint:
    """A stored noise value: per-action insertion ``seq``, unit state ``x``, value ``g``,
    ``created_at`` (unix seconds, UTC) and its chain ``hash`` (hex)."""

    seq: int
    x: float
    g: float
    created_at: float
    hash: str

    @property
    def created_datetime(self) -> datetime:
        return datetime.fromtimestamp(self.created_at, UTC)


@dataclass(frozen=True, slots=True)
class InsertRecord:
    """Debug record of one insertion: what it saw (nearest committed-or-earlier-in-batch
    neighbours) when it was drawn. Used by the concurrency tests."""

    seq: int
    x: float
    g: float
    left: float | None
    right: float | None


class _ActionState:
    """The in-process copy of one (release, action): every committed point with seq <= hw,
    as a dict x -> g (exact look-ups) and a :class:`SortedPoints` index (neighbours)."""

    __slots__ = ("values", "index", "hw", "head", "version", "broken", "published")

    def __init__(self, head: bytes) -> None:
        self.values: dict[float, float] = {}
        self.index = SortedPoints()
        self.hw = 0
        self.head = head
        #: the highest seq whose chain head the witness has recorded (see ``set_witness``)
        self.published = 0
        #: the backend's write-version token at which the copy was last known complete
        self.version: object | None = None
        #: why the stored log of this path was refused (a gap, a state stored twice); once
        #: set, nothing of the path is answered or drawn by this process again
        self.broken: str | None = None

    def check(self) -> None:
        """Raise IntegrityError when the path's log was refused (see ``broken``)."""
        if self.broken is not None:
            raise IntegrityError(self.broken)


class _GroupCommit:
    """The store's group-commit queue: (release, action) -> states waiting for the next
    transaction, the leader lock (held by the thread running a transaction) and a
    generation counter bumped (under ``cond``) after every leader's transaction."""

    __slots__ = ("queue", "rels", "queue_lock", "leader", "cond", "gen")

    def __init__(self) -> None:
        self.queue: dict[tuple[str, int], dict[float, None]] = {}
        self.rels: dict[str, ReleaseRecord] = {}
        self.queue_lock = threading.Lock()
        self.leader = threading.Lock()
        self.cond = threading.Condition(threading.Lock())
        self.gen = 0


class WriteTxn(Protocol):
    """One write transaction of a backend, holding the cross-process locks of its actions."""

    def version(self) -> object | None:
        """A token that stays equal only while no other connection commits anything (SQLite
        ``PRAGMA data_version`` with a connection epoch), or None (always re-read)."""
        ...

    def fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]: ...
    def head(self, release_id: str, action: int) -> tuple[int, str | None]: ...
    def insert(self, rows: Sequence[FullRow]) -> None: ...
    def confirm(self, rows: Sequence[FullRow]) -> bool: ...


class Admission(Protocol):
    """What :meth:`SamplePathStore.reserve` asks to admit a request's new points
    (``qveil.server.quotas.Quotas``)."""

    def admit(
        self,
        caller: str,
        release_id: str,
        *,
        new_states: int,
        new_points: int,
        stored: int | Callable[[], int],
        still_new: Callable[[], int] | None = None,
    ) -> int: ...


class Retry(Exception):  # noqa: N818 - control flow, not an error
    """Raised inside a write attempt: roll back and run the whole transaction again."""


_LOCKS: dict[tuple[str, str, int], threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _process_lock(identity: str, release_id: str, action: int) -> threading.Lock:
    key = (identity, release_id, action)
    lock = _LOCKS.get(key)
    if lock is None:
        with _LOCKS_GUARD:
            lock = _LOCKS.setdefault(key, threading.Lock())
    return lock


def validate_release_fields(
    *,
    release_id: str,
    fingerprint: str,
    sigma: float,
    beta: float,
    interval: tuple[float, float],
    n_actions: int,
    status: str,
) -> tuple[str, str, float, float, tuple[float, float], int, str]:
    """Check and normalise the fields of a new release (InvalidArgument on any bad one)."""
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
    return release_id, fingerprint, s, b, (lo, hi), int(n_actions), status


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


class SamplePathStore(ABC):
    """Persistent per-(release, action) GP sample paths (see the module docstring).

    ``rng=None`` (production) draws from OS entropy; a seed is for tests only. ``key``
    (bytes) makes the integrity chain an HMAC under that server key.
    """

    #: backend name ("memory", "sqlite", "postgresql")
    backend = "abstract"

    def __init__(
        self, *, identity: str, rng: NormalSource | int | None = None, key: bytes | None = None
    ) -> None:
        self._identity = identity
        self._rng = resolve_rng(rng)
        self._hasher = ChainHasher(key)
        self._rel_cache: dict[str, ReleaseRecord] = {}
        self._states: dict[tuple[str, int], _ActionState] = {}
        self._states_guard = threading.Lock()
        self._closed = False
        self._insert_hook: Callable[[str, int, list[InsertRecord]], None] | None = None
        self._drawn = 0  # new points this object committed (metrics)
        self._drawn_guard = threading.Lock()
        self._pre_read_always = True
        #: group commit: a writer also stores the new states other threads queued meanwhile
        self.coalesce = True
        self._gc = _GroupCommit()
        self._witness: Witness | None = None
        self._witness_lock = threading.Lock()

    # -- backend hooks ----------------------------------------------------------------------

    @abstractmethod
    def _db_insert_release(self, rec: ReleaseRecord) -> bool:
        """Insert; False when the id exists (nothing changed)."""

    @abstractmethod
    def _db_get_release(self, release_id: str) -> ReleaseRecord | None: ...

    @abstractmethod
    def _db_list_releases(self) -> list[ReleaseRecord]: ...

    @abstractmethod
    def _db_set_status(self, release_id: str, status: str) -> bool: ...

    @abstractmethod
    def _db_fetch_since(self, release_id: str, action: int, hw: int) -> Sequence[Row]:
        """Rows with seq > hw in seq order (a read, no lock)."""

    def _db_fetch_since_many(
        self, release_id: str, hws: dict[int, int]
    ) -> dict[int, Sequence[Row]]:
        """For each path p of ``hws``: its rows with seq > hws[p], in seq order (a read, no
        lock). Default: one :meth:`_db_fetch_since` per path; a backend overrides it with
        one connection or one statement."""
        return {p: self._db_fetch_since(release_id, p, hw) for p, hw in hws.items()}

    @abstractmethod
    def _db_write_txn(self, keys: Sequence[tuple[str, int]]) -> AbstractContextManager[WriteTxn]:
        """A write transaction holding the cross-process locks of the (release, action)
        ``keys`` (sorted; taken in that order); commits on clean exit (durably, before
        returning), rolls back on an exception. Backend errors come out as Unavailable /
        IntegrityError / :class:`Retry`."""

    @abstractmethod
    def _db_iter_rows(self, release_id: str, action: int | None) -> Iterator[tuple[int, Row]]:
        """(action, row) in (action, seq) order."""

    @abstractmethod
    def _db_count(self, release_id: str | None, action: int | None) -> int: ...

    @abstractmethod
    def _db_import(
        self,
        rec: ReleaseRecord,
        rows: dict[int, list[Row]],
        binding: ReleaseBinding | None = None,
    ) -> None:
        """Insert a release, all its rows and its binding in one transaction (InvalidArgument
        if it exists)."""

    @abstractmethod
    def _db_store_id(self) -> str:
        """The store's random persistent identity (``store_meta.store_id``)."""

    @abstractmethod
    def _db_get_binding(self, release_id: str) -> ReleaseBinding | None: ...

    @abstractmethod
    def _db_meta(self, key: str) -> str | None:
        """A value of the store's key-value metadata (``store_meta``), None when absent."""

    @abstractmethod
    def _db_set_meta(self, values: dict[str, str], *, only_if_absent: bool) -> None:
        """Write metadata values in one transaction (insert, or also overwrite)."""

    @abstractmethod
    def _physical_identity(self) -> str:
        """What this database physically is, which no byte copy, clone or restore into a new
        file or database carries: a SQLite file's inode, a PostgreSQL cluster's system
        identifier and database oid."""

    @abstractmethod
    def _db_insert_binding(self, binding: ReleaseBinding) -> bool:
        """Insert; False when the release is bound already (nothing changed)."""

    def _db_close(self) -> None:  # noqa: B027 - optional hook
        """Release the backend's resources (default: nothing)."""

    # -- releases ---------------------------------------------------------------------------

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
        an existing id is refused (InvalidArgument). ``betas`` (one per coordinate, issue 16)
        makes a release of d = len(betas) coordinates; None (or one beta) is a 1-D release."""
        self._check_open()
        rid, fp, s, b, iv, m, st = validate_release_fields(
            release_id=release_id,
            fingerprint=fingerprint,
            sigma=sigma,
            beta=beta,
            interval=interval,
            n_actions=n_actions,
            status=status,
        )
        bs = validate_betas(betas, b)
        rec = ReleaseRecord(rid, fp, s, b, iv, m, st, datetime.now(UTC), len(bs) or 1, bs)
        if self._db_insert_release(rec):
            self._rel_cache[rid] = rec
            return rec
        old = self.get_release(rid)
        if (old.fingerprint, old.sigma, old.beta, old.interval, old.n_actions, old.betas) != (
            fp,
            s,
            b,
            iv,
            m,
            bs,
        ):
            raise InvalidArgument(
                f"release {echo(rid)} already exists with different parameters "
                f"(fingerprint {old.fingerprint!r}, sigma {old.sigma!r}, beta {old.beta!r}, "
                f"interval {old.interval!r}, n_actions {old.n_actions}, "
                f"betas {list(old.betas)!r})"
            )
        return old

    def get_release(self, release_id: str) -> ReleaseRecord:
        """The release's current record (status read from the database), or NotFound."""
        self._check_open()
        if not isinstance(release_id, str):
            raise InvalidArgument(f"release_id must be a string, got {echo(release_id)}")
        rec = self._db_get_release(release_id)
        if rec is None:
            raise NotFound(f"no release {echo(release_id)} in this store")
        self._rel_cache[release_id] = rec
        return rec

    def list_releases(self) -> list[ReleaseRecord]:
        self._check_open()
        return self._db_list_releases()

    # -- one release, one store (issue 14, item 2) -----------------------------------------

    @property
    def store_id(self) -> str:
        """This store's random, persistent identity: drawn when the store was created, the same
        for every process and replica that opens it, different for any other (or re-created)
        database."""
        self._check_open()
        sid = getattr(self, "_store_id_cache", None)
        if sid is None:
            sid = self._db_store_id()
            self._store_id_cache = sid
        return sid

    def get_binding(self, release_id: str) -> ReleaseBinding | None:
        """The release's binding to this store, or None when it is not bound here."""
        self._check_open()
        return self._db_get_binding(release_id)

    def bind_release(self, release_id: str, fingerprint: str) -> ReleaseBinding:
        """Record that this store holds the noise of the release with ``fingerprint`` (the
        release must be registered). Idempotent for the same fingerprint; a different one is
        refused (IntegrityError): one release id names one bundle and one noise path."""
        self._check_open()
        self.get_release(release_id)  # NotFound
        if not isinstance(fingerprint, str) or not 0 < len(fingerprint) <= 128:
            raise InvalidArgument("a release fingerprint is a non-empty string of <= 128 chars")
        new = ReleaseBinding(
            release_id,
            fingerprint,
            datetime.now(UTC).isoformat(timespec="seconds"),
            self.store_id,
        )
        if self._db_insert_binding(new):
            return new
        old = self._db_get_binding(release_id)
        assert old is not None
        if old.fingerprint != fingerprint:
            raise IntegrityError(
                f"release {echo(release_id)} is bound to this store with fingerprint "
                f"{old.fingerprint[:16]}..., not {fingerprint[:16]}...: another bundle under "
                "the same release id"
            )
        return old

    # -- incarnation: which copy of the store is the live one --------------------------------

    def incarnation(self) -> Incarnation:
        """This store's incarnation: a random token drawn when the store was first opened
        (rewritten only by an administrator's adoption), the physical identity recorded with
        it, and the physical identity it has now. ``original`` is False for a byte copy, a
        clone or a backup restored into a new file or database: that copy is a new
        incarnation, which serves nothing until an administrator adopts it."""
        self._check_open()
        current = self._physical_identity()
        token = self._db_meta(INCARNATION_KEY)
        recorded = self._db_meta(PHYSICAL_KEY)
        if token is None or recorded is None:  # first open since incarnations exist
            self._db_set_meta(
                {INCARNATION_KEY: uuid.uuid4().hex, PHYSICAL_KEY: current}, only_if_absent=True
            )
            token, recorded = self._db_meta(INCARNATION_KEY), self._db_meta(PHYSICAL_KEY)
        assert token is not None and recorded is not None
        return Incarnation(token=token, recorded=recorded, current=current)

    def adopt_incarnation(self) -> Incarnation:
        """Make this copy a new incarnation: a fresh token and its current physical identity.
        Only ``qveil admin adopt-store`` calls this, after recording the adoption in the
        registry (which then refuses every other incarnation of the store)."""
        self._check_open()
        self._db_set_meta(
            {INCARNATION_KEY: uuid.uuid4().hex, PHYSICAL_KEY: self._physical_identity()},
            only_if_absent=False,
        )
        return self.incarnation()

    def set_witness(self, witness: Witness | None) -> None:
        """Before any value with a seq above what ``witness`` last recorded for its path is
        answered, ``witness(release_id, {path: (seq, head_hash_hex)})`` records the path's
        chain head outside this store (the registry), so that a restored backup missing an
        answered point is found behind. A witness that fails makes the call fail: nothing
        is answered that the witness has not recorded."""
        self._witness = witness

    def _witnessed(self, release_id: str, sts: Sequence[tuple[int, _ActionState]]) -> None:
        """Publish the chain heads of the (path, state) pairs ``sts`` (the caller's, already
        looked up) that are ahead of the witness (no-op without one, and for paths already
        published: an integer compare per path)."""
        w = self._witness
        if w is None or all(st.hw <= st.published for _, st in sts):
            return
        with self._witness_lock:
            # (path, state, seq, head) read together under the path's lock (commits apply
            # rows under it: hw and head always match) and captured once: a commit may
            # advance hw meanwhile, and only what the witness recorded may be marked published
            ahead = []
            for p, st in sts:
                with _process_lock(self._identity, release_id, p):
                    hw, head = st.hw, st.head.hex()
                if hw > st.published:
                    ahead.append((p, st, hw, head))
            if ahead:
                w(release_id, {p: (hw, head) for p, _, hw, head in ahead})
                for _, st, hw, _ in ahead:
                    st.published = max(st.published, hw)

    def set_release_status(self, release_id: str, status: str) -> ReleaseRecord:
        self._check_open()
        check_status(status)
        if not self._db_set_status(release_id, status):
            raise NotFound(f"no release {echo(release_id)} in this store")
        return self.get_release(release_id)

    def _dims(self, release_id: str) -> int:
        """The release's coordinate count (1 when it is unknown here)."""
        rec = self._rel_cache.get(release_id)
        if rec is None:
            rec = self._db_get_release(release_id)
        return 1 if rec is None else rec.dims

    def _split(self, release_id: str, path: int) -> tuple[int, int]:
        """(action, coordinate) of a path index of the release (the backends' row key)."""
        return divmod(int(path), self._dims(release_id))

    def _release(self, release_id: str) -> ReleaseRecord:
        rec = self._rel_cache.get(release_id)
        return rec if rec is not None else self.get_release(release_id)

    # -- noise ------------------------------------------------------------------------------

    def _state(self, release_id: str, action: int) -> _ActionState:
        key = (release_id, action)
        st = self._states.get(key)
        if st is None:
            with self._states_guard:
                st = self._states.get(key)
                if st is None:
                    st = _ActionState(self._hasher.genesis(release_id, action))
                    self._states[key] = st
        return st

    @staticmethod
    def _apply(st: _ActionState, rows: Sequence[Row]) -> None:
        """Add committed rows (consecutive seqs after st.hw) to the in-process copy."""
        if not rows:
            return
        values = st.values
        expect = st.hw + 1
        if [r[0] for r in rows] != list(range(expect, expect + len(rows))):
            found = next(r[0] for k, r in enumerate(rows) if r[0] != expect + k)
            st.broken = (
                f"noise log has a gap or reorder: expected seq {expect}.., found {found}; "
                "refusing to sample against an incomplete path or answer from it (run "
                "qveil audit)"
            )
            raise IntegrityError(st.broken)
        pairs = {r[1]: r[2] for r in rows}
        if len(pairs) != len(rows) or not values.keys().isdisjoint(pairs):
            # the append log has no unique x (migration 0005): a second row for one state is
            # a bug or tampering. The path is refused whole; the message names seqs only
            # (errors reach callers; a stored value never does)
            first: dict[float, int] = {}
            for r in rows:
                if r[1] in values or r[1] in first:
                    again = f" (also at seq {first[r[1]]})" if r[1] in first else ""
                    st.broken = (
                        f"noise log stores one state twice: the row at seq {r[0]} repeats a "
                        f"stored state{again}; refusing to sample or answer from this path "
                        "(run qveil audit)"
                    )
                    raise IntegrityError(st.broken)
                first[r[1]] = r[0]
        values.update(pairs)
        st.index.add(pairs)
        st.hw = expect + len(rows) - 1
        st.head = bytes.fromhex(rows[-1][4])

    def _catch_up(self, st: _ActionState, fetch: Callable[[], Sequence[Row]]) -> None:
        """``_apply(st, fetch())``; a log refused by ``_apply`` marks the path broken (its
        callers get the IntegrityError) instead of failing the other paths of the batch."""
        try:
            self._apply(st, fetch())
        except IntegrityError:
            if st.broken is None:  # not a refused log: a database error
                raise

    @property
    def points_drawn(self) -> int:
        """New noise points this store object has drawn and committed since it was opened."""
        return self._drawn

    def count_new(self, release_id: str, action: int, xs: npt.ArrayLike) -> int:
        """How many distinct unit states of ``xs`` are not in the in-process copy of
        (release, action). No database read: after :meth:`refresh` it is exact (up to points
        committed meanwhile); before, it may count a point another process stored. Used to
        classify a request before anything is sampled (issue 14 item 4)."""
        self._check_open()
        rel = self._release(release_id)
        a = check_action(action, rel.n_paths)
        values = self._state(release_id, a).values
        return sum(1 for v in dict.fromkeys(validate_unit_states(xs).tolist()) if v not in values)

    def new_mask(self, release_id: str, action: int, xs: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """For each unit state of ``xs`` (in order, duplicates included): True when it is not
        in the in-process copy of (release, action). No database read, as :meth:`count_new`:
        a request's new states are the states with a new point on any of its paths."""
        self._check_open()
        rel = self._release(release_id)
        a = check_action(action, rel.n_paths)
        values = self._state(release_id, a).values
        xl: list[float] = validate_unit_states(xs).tolist()
        return np.fromiter((v not in values for v in xl), dtype=np.bool_, count=len(xl))

    def known_points(self, release_id: str) -> int:
        """The release's points in the in-process copies (no database read): what
        :meth:`refresh` last loaded plus what this process committed since."""
        self._check_open()
        rel = self._release(release_id)
        return sum(len(self._state(release_id, a).values) for a in range(rel.n_paths))

    def refresh(self, release_id: str) -> int:
        """Bring the in-process copies of every path of the release up to date with the
        database (rows committed by other threads, processes or replicas; the first call
        loads them) in one read (:meth:`_db_fetch_since_many`), and return the release's
        stored points, all paths. The paths' locks are held, in path order, from the read to
        the last copy updated (a commit of this process cannot interleave)."""
        self._check_open()
        rel = self._release(release_id)
        paths = range(rel.n_paths)
        sts = [self._state(release_id, p) for p in paths]
        locks = [_process_lock(self._identity, release_id, p) for p in paths]
        for lk in locks:
            lk.acquire()
        try:
            rows = self._db_fetch_since_many(
                release_id, {p: st.hw for p, st in zip(paths, sts, strict=True)}
            )
            for p, st in zip(paths, sts, strict=True):
                self._apply(st, rows[p])
        finally:
            for lk in reversed(locks):
                lk.release()
        return sum(len(st.values) for st in sts)

    def known_values(
        self, release_id: str, paths: Sequence[int], columns: Sequence[FloatArray]
    ) -> list[FloatArray] | None:
        """The answer to a request whose states are all stored: ``out[k][i]`` =
        g_{paths[k]}(columns[k][i]) from the in-process copies, or None as soon as one state
        of one path is not in its copy (the caller then goes through :meth:`reserve` and
        :meth:`get_or_sample_paths`). No database read, no Python per state (one C-level
        dict look-up per value); a state that is not a stored unit state (out of [0, 1],
        NaN) is simply not found. Paths are checked; a refused path raises IntegrityError.
        Chain heads ahead of the witness are published before the values are returned, as
        on every answer (:meth:`set_witness`)."""
        self._check_open()
        rel = self._release(release_id)
        out: list[FloatArray] = []
        sts: list[tuple[int, _ActionState]] = []
        for p, col in zip(paths, columns, strict=True):
            a = check_action(p, rel.n_paths)
            st = self._state(release_id, a)
            st.check()
            n = int(col.size)
            v = np.fromiter(
                map(st.values.get, col.tolist(), repeat(math.nan, n)), np.float64, count=n
            )
            if np.isnan(v).any():  # stored values are finite: NaN marks a state not stored
                return None
            out.append(v)
            sts.append((a, st))
        self._witnessed(release_id, sts)
        return out

    def reserve(
        self,
        release_id: str,
        pairs: Sequence[tuple[int, FloatArray]],
        *,
        quotas: Admission,
        caller: str,
        rows: tuple[FloatArray, Sequence[npt.NDArray[np.intp]]] | None = None,
    ) -> int:
        """Admission of a request before anything is sampled: count its new states and new
        points and reserve them under ``caller``'s budget and the release's cap
        (``quotas.admit``), returning the reservation's ticket (0: nothing new; pass it to
        ``quotas.done`` once the request's points are committed or failed), or raise
        ResourceExhausted with nothing stored.

        ``pairs``: (store path, unique unit values) of the request. A 1-D release passes its
        unique states once per action; a d-coordinate release passes each (action,
        coordinate) path with that coordinate's unique values, and ``rows``: the request's
        states [n, d] and, per pair, the index of each state's value in the pair's values.
        A new state is a state with a new point on any path; it costs one point per new
        value of each path. Stored states pass without a database read; otherwise the
        release's copies are brought up to date first in one read (:meth:`refresh`), so
        points other processes or replicas stored are known, not new, and count against
        the cap."""
        rid = release_id

        def still_new() -> int:
            return sum(self.count_new(rid, p, u) for p, u in pairs)

        if not any(self.count_new(rid, p, u) for p, u in pairs):
            return 0
        self.refresh(rid)
        masks = [self.new_mask(rid, p, u) for p, u in pairs]
        new_points = sum(int(m.sum()) for m in masks)
        if rows is None:  # every pair holds the same unique states
            new_states = int(np.logical_or.reduce(masks).sum()) if masks else 0
        else:
            xs, index = rows
            row_new = np.zeros(xs.shape[0], dtype=np.bool_)
            for m, idx in zip(masks, index, strict=True):
                row_new |= m[idx]
            new_states = int(np.unique(xs[row_new], axis=0).shape[0])
        return quotas.admit(
            caller,
            rid,
            new_states=new_states,
            new_points=new_points,
            stored=lambda: self.known_points(rid),
            still_new=still_new,
        )

    def get_or_sample(self, release_id: str, action: int, xs: npt.ArrayLike) -> FloatArray:
        """g_action(x) for each unit state of ``xs``: stored values as stored, new states drawn
        exactly given their stored neighbours and committed durably before this returns.

        Duplicates get one value; bad input raises InvalidArgument and stores nothing.
        """
        self._check_open()
        rel = self._release(release_id)
        a = check_action(action, rel.n_paths)
        xl: list[float] = validate_unit_states(xs).tolist()
        st = self._state(release_id, a)
        st.check()
        get = st.values.get
        out = [get(v) for v in xl]
        if None in out:
            missing = [v for v in dict.fromkeys(xl) if get(v) is None]
            self._resolve(rel, {a: missing})
            out = [get(v) for v in xl]
        self._witnessed(release_id, [(a, st)])
        return np.array(out, dtype=np.float64)

    def get_or_sample_actions(
        self, release_id: str, actions: Sequence[int], xs: npt.ArrayLike
    ) -> FloatArray:
        """``out[i, j] = g_{actions[j]}(xs[i])`` (as :meth:`get_or_sample` per action), with
        the new points of all the actions stored in ONE durable transaction (group commit),
        not one per action. Bad input raises InvalidArgument and stores nothing."""
        self._check_open()
        rel = self._release(release_id)
        acts = [check_action(a, rel.n_paths) for a in actions]
        if len(set(acts)) != len(acts):
            raise InvalidArgument(f"actions must be distinct, got {list(actions)!r}")
        xl: list[float] = validate_unit_states(xs).tolist()
        cols = self._get_or_sample_many(rel, acts, [xl] * len(acts))
        out = np.empty((len(xl), len(acts)), dtype=np.float64)
        for j, col in enumerate(cols):
            out[:, j] = col
        return out

    def get_or_sample_paths(
        self, release_id: str, paths: Sequence[int], xs: Sequence[npt.ArrayLike]
    ) -> list[FloatArray]:
        """``out[k][i] = g_{paths[k]}(xs[k][i])``: each path with its own unit states (a d > 1
        release, issue 16: path a * d + j takes the j-th coordinates), as
        :meth:`get_or_sample` per path, with the new points of all the paths stored in ONE
        durable transaction (group commit). Bad input raises InvalidArgument and stores
        nothing."""
        self._check_open()
        rel = self._release(release_id)
        ps = [check_action(p, rel.n_paths) for p in paths]
        if len(set(ps)) != len(ps) or len(ps) != len(xs):
            raise InvalidArgument("paths must be distinct, one list of states per path")
        xls: list[list[float]] = [validate_unit_states(x).tolist() for x in xs]
        return self._get_or_sample_many(rel, ps, xls)

    def _get_or_sample_many(
        self, rel: ReleaseRecord, paths: list[int], xls: list[list[float]]
    ) -> list[FloatArray]:
        """The shared body of :meth:`get_or_sample_actions` and :meth:`get_or_sample_paths`
        (paths checked and distinct, states validated): every path's missing states stored
        in ONE :meth:`_resolve` transaction, then each path's values read back."""
        sts = [self._state(rel.release_id, p) for p in paths]
        wants: dict[int, list[float]] = {}
        for p, st, xl in zip(paths, sts, xls, strict=True):
            st.check()
            values = st.values
            miss = [v for v in dict.fromkeys(xl) if v not in values]
            if miss:
                wants[p] = miss
        if wants:
            self._resolve(rel, wants)
        self._witnessed(rel.release_id, list(zip(paths, sts, strict=True)))
        out = []
        for st, xl in zip(sts, xls, strict=True):
            get = st.values.__getitem__
            out.append(np.array([get(v) for v in xl], dtype=np.float64))
        return out

    def _resolve(self, rel: ReleaseRecord, wants: dict[int, list[float]]) -> None:
        """Store the states of ``wants`` (action -> states) not stored yet, in one write
        transaction, before returning (see the module docstring).

        Group commit (``coalesce``), the WAL-writer pattern: a thread queues its (release,
        action, state) triples in the store's queue, then either becomes the leader (the
        store's commit lock was free) and stores *everything queued so far, by any thread, of
        any release and action* in one transaction, or waits for the leader's commit to end
        and looks again (follower). New points that arrive while a commit is in flight thus
        go together into the next one. A caller returns only once its states are in the
        in-process copy, which happens only after the commit that holds them. If a leader's
        transaction fails, it raises to its own caller; the waiting threads' states are still
        missing, so one of them leads the next attempt with its own states again (nothing
        queued is silently dropped, nothing is answered).
        """
        rid = rel.release_id
        sts = {a: self._state(rid, a) for a in wants}
        if not self.coalesce:
            self._store_batch({(rid, a): xs for a, xs in wants.items()}, {rid: rel})
            for st in sts.values():
                st.check()
            return
        gc = self._gc
        while True:
            with gc.cond:
                gen = gc.gen
            todo = {}
            for a, xs in wants.items():
                st = sts[a]
                st.check()  # a path refused meanwhile (its log failed to load) is not waited on
                values = st.values
                left = [v for v in xs if v not in values]
                if left:
                    todo[a] = left
            if not todo:
                return  # a leader stored them all
            with gc.queue_lock:  # (re-)queue ours for the next leader
                gc.rels[rid] = rel
                for a, left in todo.items():
                    gc.queue.setdefault((rid, a), {}).update(dict.fromkeys(left))
            if gc.leader.acquire(blocking=False):
                try:
                    with gc.queue_lock:
                        batch = {k: list(v) for k, v in gc.queue.items()}
                        rels = dict(gc.rels)
                        gc.queue.clear()
                    self._store_batch(batch, rels)
                finally:
                    gc.leader.release()
                    with gc.cond:
                        gc.gen += 1
                        gc.cond.notify_all()
                continue  # ours were in that batch: the loop finds them and returns
            with gc.cond:  # a leader is committing: wait for its end (commit or failure)
                while gc.gen == gen:
                    gc.cond.wait(timeout=1.0)

    def _store_batch(
        self, batch: dict[tuple[str, int], list[float]], rels: dict[str, ReleaseRecord]
    ) -> None:
        """One write transaction storing the not-yet-stored states of ``batch`` ((release,
        action) -> states) under the locks of all its actions (process-wide thread locks
        taken in sorted order, plus the backend's cross-process locks); retried whole on a
        lost race. Points of one action are drawn in order, each conditioned on
        every point stored before it or earlier in the batch (:meth:`_draw`)."""
        keys = sorted(batch)
        locks = self._path_locks(keys)
        for lk in locks:
            lk.acquire()
        try:
            self._store_batch_locked(keys, batch, rels)
        finally:
            for lk in reversed(locks):
                lk.release()

    def _store_batch_locked(
        self,
        keys: list[tuple[str, int]],
        batch: dict[tuple[str, int], list[float]],
        rels: dict[str, ReleaseRecord],
    ) -> None:
        sts = {k: self._state(*k) for k in keys}
        for k in keys:
            st = sts[k]
            if st.broken is None and (st.hw == 0 or self._pre_read_always):
                # committed rows this process has not seen yet, read without the write lock
                # (on first touch this loads the whole action; later, other writers' rows)
                self._catch_up(st, partial(self._db_fetch_since, k[0], k[1], st.hw))
        # a path whose log was refused is left out; its callers get the IntegrityError, the
        # other paths of the batch are stored
        keys = [k for k in keys if sts[k].broken is None]
        todo = {k: [v for v in batch[k] if v not in sts[k].values] for k in keys}
        todo = {k: v for k, v in todo.items() if v}
        if not todo:
            return
        last: Exception | None = None
        for attempt in range(MAX_ATTEMPTS):
            try:
                drawn: dict[tuple[str, int], tuple[list[Row], list[InsertRecord] | None]] = {}
                now = time.time()  # one created_at per transaction
                with self._db_write_txn(sorted(todo)) as tx:
                    tok = tx.version()
                    for k in sorted(todo):
                        st = sts[k]
                        if tok is None or st.version != tok:
                            self._catch_up(st, partial(tx.fetch_since, k[0], k[1], st.hw))
                            if st.broken is not None:
                                continue  # refused: nothing drawn for it
                        new = [v for v in todo[k] if v not in st.values]
                        if new:
                            drawn[k] = self._draw(rels[k[0]], st, k[1], new, tx, now)
                    if not drawn:
                        return
                    rows = [(k[0], k[1], *r) for k in sorted(drawn) for r in drawn[k][0]]
                    tx.insert(rows)
                    if not tx.confirm(rows):
                        raise Retry("another writer stored rows concurrently")
                # committed durably: only now may the values be used
                with self._drawn_guard:
                    self._drawn += len(rows)
                for k in todo:
                    st = sts[k]
                    if k in drawn:
                        self._apply_committed(k, st, drawn[k][0])
                    # complete as of tok: re-read in the transaction, or nobody else wrote
                    # since, and our own rows are applied
                    st.version = tok
                for k, (_rows, seen) in drawn.items():
                    if self._insert_hook is not None and seen is not None:
                        self._insert_hook(k[0], k[1], seen)
                return
            except Retry as exc:
                last = exc
                # a lost race means some copy may be behind the database: the next attempt
                # re-reads every path under the lock, whatever the version token says
                for k in todo:
                    sts[k].version = None
                time.sleep(min(0.2, 0.002 * 2**attempt))
        where = ", ".join(f"release {echo(r)} action {a}" for r, a in sorted(todo))
        raise Unavailable(
            f"store: could not commit new noise points of {where} "
            f"after {MAX_ATTEMPTS} attempts ({last}); nothing was answered"
        )

    def _path_locks(self, keys: Sequence[tuple[str, int]]) -> list[threading.Lock]:
        """The process-wide locks of the (release, path) ``keys`` (sorted), taken in order
        around a write transaction (the backend's cross-process locks are taken inside)."""
        return [_process_lock(self._identity, r, a) for r, a in keys]

    def _chain_tail(
        self, release_id: str, st: _ActionState, path: int, tx: WriteTxn
    ) -> tuple[int, bytes]:
        """(seq, hash) the path's new rows chain onto: the copy's, complete under the lock."""
        return st.hw, st.head

    def _apply_committed(self, key: tuple[str, int], st: _ActionState, rows: list[Row]) -> None:
        """Add a committed transaction's own rows of one path to its copy."""
        self._apply(st, rows)

    def _draw(
        self,
        rel: ReleaseRecord,
        st: _ActionState,
        a: int,
        new: list[float],
        tx: WriteTxn,
        now: float,
    ) -> tuple[list[Row], list[InsertRecord] | None]:
        """Draw the distinct, not stored states ``new`` exactly, given the stored points, and
        chain their rows.

        The states are drawn, and take their seqs, in the order given, each conditioned on
        its nearest neighbours among the stored points and the batch's earlier states
        (:func:`qveil.noise.sample_batch`; the stored neighbours of the whole batch come
        from the copy's sorted index in two vectorised look-ups). Nothing enters the
        copy here: the caller applies the rows after the commit.
        """
        x = np.array(new, dtype=np.float64)
        lx, lg, rx, rg = st.index.neighbours(x)
        m = int(x.size)
        z = np.asarray(self._rng.standard_normal(m), dtype=np.float64).reshape(-1)
        if z.size != m or not np.isfinite(z).all():
            raise Unavailable("store: the normal source returned a bad draw; nothing was stored")
        g, seen_l, seen_r = sample_batch(
            x, lx, lg, rx, rg, beta=rel.path_beta(a), sigma=rel.sigma, z=z
        )
        seq, prev = self._chain_tail(rel.release_id, st, a, tx)
        xl = new
        gl: list[float] = g.tolist()
        hashes = self._hasher.links(prev, seq, xl, gl)
        rows: list[Row] = [
            (s, v, w, now, h.hex())
            for s, v, w, h in zip(range(seq + 1, seq + 1 + m), xl, gl, hashes, strict=True)
        ]
        recs = None
        if self._insert_hook is not None:  # what each draw was conditioned on (same rule)
            recs = [
                InsertRecord(
                    r[0],
                    r[1],
                    r[2],
                    None if lf == -math.inf else lf,
                    None if rt == math.inf else rt,
                )
                for r, lf, rt in zip(rows, seen_l.tolist(), seen_r.tolist(), strict=True)
            ]
        return rows, recs

    def iter_points(self, release_id: str, action: int) -> Iterator[NoisePoint]:
        """Stored points of one action in insertion-sequence order (read from the database)."""
        self._check_open()
        a = check_action(action, self._release(release_id).n_paths)
        for _a, (seq, x, g, c, h) in self._db_iter_rows(release_id, a):
            yield NoisePoint(seq, x, g, c, h)

    def count_points(self, release_id: str | None = None, action: int | None = None) -> int:
        self._check_open()
        if action is not None:
            if release_id is None:
                raise InvalidArgument("count_points: action needs a release_id")
            check_action(action, self._release(release_id).n_paths)
        elif release_id is not None:
            self._release(release_id)
        return self._db_count(release_id, action)

    @property
    def seeded(self) -> bool:
        """True when new noise comes from a seeded generator (tests, experiments): a server
        must refuse or flag that for a release; False for OS entropy (``rng=None``)."""
        return is_seeded(self._rng)

    def cached_points(self, release_id: str, action: int) -> int:
        """How many points of (release, action) this process holds in memory."""
        st = self._states.get((release_id, int(action)))
        return 0 if st is None else len(st.values)

    # -- integrity, export ------------------------------------------------------------------

    def verify(self, release_id: str, action: int | None = None) -> IntegrityReport:
        """Recompute every chain of the release (or one action) from the database."""
        self._check_open()
        rel = self._release(release_id)
        acts = range(rel.n_paths) if action is None else [check_action(action, rel.n_paths)]
        results = []
        for a in acts:
            rows = ((s, x, g, h) for _a, (s, x, g, _c, h) in self._db_iter_rows(release_id, a))
            results.append(verify_chain(release_id, a, rows, self._hasher))
        return IntegrityReport(
            release_id=release_id,
            ok=all(r.ok for r in results),
            keyed=self._hasher.keyed,
            actions=tuple(results),
        )

    def export(self, release_id: str, path: str, *, move_token: str | None = None) -> int:
        """Write the release and all its points as JSONL (see :mod:`.export`); returns rows."""
        from qveil.server.store.export import export_release

        self._check_open()
        return export_release(self, release_id, path, move_token=move_token)

    def import_(self, path: str) -> ReleaseRecord:
        """Load a JSONL export, verifying counts, seqs and every chain link first."""
        from qveil.server.store.export import import_release

        self._check_open()
        return import_release(self, path)

    # -- lifecycle ----------------------------------------------------------------------------

    def set_debug_hook(self, hook: Callable[[str, int, list[InsertRecord]], None] | None) -> None:
        """Test aid: after each commit, ``hook(release_id, action, records)`` with what every
        inserted point was conditioned on (draws are then made one by one; same law)."""
        self._insert_hook = hook

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("the store is closed")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db_close()

    def __enter__(self) -> SamplePathStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._identity}>"


INCARNATION_KEY = "incarnation"
PHYSICAL_KEY = "physical_identity"

#: ``witness(release_id, {path: (seq, head_hash_hex)})``: see :meth:`SamplePathStore.set_witness`.
Witness = Callable[[str, dict[int, tuple[int, str]]], None]


@dataclass(frozen=True)
class Incarnation:
    """Which copy of a store this is (:meth:`SamplePathStore.incarnation`)."""

    token: str
    recorded: str
    current: str

    @property
    def original(self) -> bool:
        """True when this is the file or database the token was recorded in."""
        return self.recorded == self.current


def new_identity(prefix: str) -> str:
    return f"{prefix}:{uuid.uuid4().hex}"


__all__ += [
    "QveilError",
    "Admission",
    "Retry",
    "WriteTxn",
    "Incarnation",
    "Witness",
    "check_action",
    "check_status",
    "validate_betas",
    "validate_release_fields",
    "new_identity",
]
