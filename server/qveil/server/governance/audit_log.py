"""The admin audit log: append-only, hash-chained entries of who did what, when, with which
outcome.

Every admin operation (retrain, activate, retire, cap change, audit) appends one entry, also
when it is refused or fails. Entries are never updated or deleted; each one's ``hash`` links it
to the previous entry (``qveil.server.governance.hashchain``), so :func:`verify_audit_log` finds an
edited, deleted or reordered entry. Deleting the newest entries is caught where they are referenced
(ledger entries point back to the audit log and audits check high-water marks).

Never written to this log: tokens, secrets, and noise values (non-negotiable 4). :func:`append`
refuses parameter keys that name them (``token``, ``secret``, ``password``, ``noise``, ``g``,
``values``, ...), so a careless caller fails loudly in tests instead of leaking quietly.
"""

from __future__ import annotations

import getpass
import json
import math
import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa

from qveil.errors import (
    BudgetExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    QveilError,
)
from qveil.json_types import JSONMapping, JSONObject, JSONValue
from qveil.privacy.record import Record
from qveil.server.governance import admin_tables as T
from qveil.server.governance.admin_db import AdminDB, admin_db_for
from qveil.server.governance.hashchain import GENESIS, canonical_json, link_hash
from qveil.server.store.base import SamplePathStore
from qveil.server.store.models import TableRow

__all__ = [
    "OUTCOMES",
    "AuditEntry",
    "ChainReport",
    "append",
    "default_actor",
    "entries",
    "log_number",
    "log_outcome",
    "record_server_action",
    "server_action",
    "utc_now",
    "verify_audit_log",
]

OUTCOMES = ("ok", "refused", "failed", "error")
LOCK = "audit-log"
MAX_PARAMS_CHARS = 16_384
_FORBIDDEN = re.compile(
    r"(token|secret|passw|credential|private.?key|api.?key|noise|^g$|^gs$|values?$)", re.I
)


def utc_now() -> str:
    """Current UTC time as ISO-8601 text with microseconds (stored and hashed as text)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def default_actor() -> str:
    """``user@host`` of the calling process (the CLI's actor when no server role is involved)."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True, slots=True)
class AuditEntry(Record):
    """One admin audit-log entry."""

    seq: int
    at: str
    actor: str
    action: str
    target: str
    params: JSONObject
    outcome: str
    detail: str
    prev_hash: str
    hash: str


@dataclass(frozen=True, slots=True)
class ChainReport(Record):
    """Result of verifying one hash chain (audit log, or one dataset's ledger)."""

    ok: bool
    count: int
    head_hash: str
    problems: list[str] = field(default_factory=list)


def _check_params(params: JSONMapping, path: str = "params") -> None:
    for k, v in params.items():
        if _FORBIDDEN.search(str(k)):
            raise InvalidArgument(
                f"audit log refuses field {path}.{k}: tokens, secrets and noise values are never "
                "logged"
            )
        if isinstance(v, Mapping):
            _check_params(v, f"{path}.{k}")


def _fields(
    seq: int,
    at: str,
    actor: str,
    action: str,
    target: str,
    params_json: str,
    outcome: str,
    detail: str,
) -> JSONObject:
    return {
        "seq": seq,
        "at": at,
        "actor": actor,
        "action": action,
        "target": target,
        "params": params_json,
        "outcome": outcome,
        "detail": detail,
    }


def append(
    db: AdminDB,
    *,
    actor: str,
    action: str,
    target: str = "",
    outcome: str,
    params: JSONMapping | None = None,
    detail: str = "",
    conn: sa.Connection | None = None,
) -> AuditEntry:
    """Append one entry (durably, serialized with every other writer) and return it.

    ``conn``: an open write transaction of :meth:`AdminDB.write` to append inside (so that an
    entry and the record it describes commit together); otherwise a transaction of its own.
    """
    if outcome not in OUTCOMES:
        raise InvalidArgument(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    if not action:
        raise InvalidArgument("audit log entries need an action")
    p = dict(params or {})
    _check_params(p)
    params_json = canonical_json(p)
    if len(params_json) > MAX_PARAMS_CHARS:
        raise InvalidArgument(f"audit log params too large ({len(params_json)} characters)")
    if conn is None:
        with db.write(LOCK) as c:
            return _append(c, actor, action, target, outcome, params_json, detail)
    db.lock(conn, LOCK)  # inside the caller's write transaction: serialize with other appends
    return _append(conn, actor, action, target, outcome, params_json, detail)


def _append(
    conn: sa.Connection,
    actor: str,
    action: str,
    target: str,
    outcome: str,
    params_json: str,
    detail: str,
) -> AuditEntry:
    t = T.audit_log
    last = conn.execute(sa.select(t.c.seq, t.c.hash).order_by(t.c.seq.desc()).limit(1)).first()
    seq = 1 if last is None else int(last.seq) + 1
    prev = GENESIS if last is None else str(last.hash)
    at = utc_now()
    h = link_hash(prev, _fields(seq, at, actor, action, target, params_json, outcome, detail))
    conn.execute(
        t.insert().values(
            seq=seq,
            at=at,
            actor=actor,
            action=action,
            target=target,
            params_json=params_json,
            outcome=outcome,
            detail=detail,
            prev_hash=prev,
            hash=h,
        )
    )
    return AuditEntry(
        seq, at, actor, action, target, json.loads(params_json), outcome, detail, prev, h
    )


def _row_entry(r: TableRow) -> AuditEntry:
    try:
        params = json.loads(r.params_json)
    except ValueError:
        params = {"_unparseable": True}
    return AuditEntry(
        int(r.seq),
        r.at,
        r.actor,
        r.action,
        r.target,
        params,
        r.outcome,
        r.detail,
        r.prev_hash,
        r.hash,
    )


def entries(
    db: AdminDB, *, action: str | None = None, target: str | None = None, limit: int | None = None
) -> list[AuditEntry]:
    """Entries in sequence order, optionally filtered (newest ``limit`` when given)."""
    t = T.audit_log
    q = sa.select(t)
    if action is not None:
        q = q.where(t.c.action == action)
    if target is not None:
        q = q.where(t.c.target == target)
    if limit is not None:
        q = q.order_by(t.c.seq.desc()).limit(int(limit))
    else:
        q = q.order_by(t.c.seq)
    with db.read() as conn:
        rows = [_row_entry(r) for r in conn.execute(q)]
    return sorted(rows, key=lambda e: e.seq)


def verify_audit_log(db: AdminDB) -> ChainReport:
    """Recompute the chain: sequence 1, 2, ... without gaps, every link and hash intact."""
    t = T.audit_log
    problems: list[str] = []
    prev = GENESIS
    expected = 1
    n = 0
    with db.read() as conn:
        for r in conn.execute(sa.select(t).order_by(t.c.seq)):
            n += 1
            seq = int(r.seq)
            if seq != expected:
                problems.append(f"audit log: sequence gap: expected entry {expected}, found {seq}")
            if r.prev_hash != prev:
                problems.append(f"audit log: entry {seq} does not link to the entry before it")
            h = link_hash(
                r.prev_hash,
                _fields(seq, r.at, r.actor, r.action, r.target, r.params_json, r.outcome, r.detail),
            )
            if h != r.hash:
                problems.append(f"audit log: entry {seq} was edited (hash mismatch)")
            prev = r.hash
            expected = seq + 1
    return ChainReport(ok=not problems, count=n, head_hash=prev, problems=problems)


def log_number(v: JSONValue) -> float | str:
    """A float for the audit log's JSON: finite as is, NaN or infinity as text."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else str(f)


def log_outcome(
    db: AdminDB,
    actor: str,
    action: str,
    target: str,
    exc: BaseException | None,
    params: JSONObject,
) -> None:
    """Audit-log the outcome of an operation (refused for domain refusals, failed otherwise)."""
    if exc is None:
        outcome, detail = "ok", ""
    elif isinstance(exc, BudgetExceeded | FailedPrecondition | InvalidArgument | NotFound):
        outcome, detail = "refused", str(exc)
    else:
        outcome, detail = "failed", f"{type(exc).__name__}: {exc}"
    try:
        append(
            db,
            actor=actor,
            action=action,
            target=target,
            outcome=outcome,
            params=params,
            detail=detail[:2000],
        )
    except QveilError:
        if exc is None:
            raise


def record_server_action(
    db: AdminDB,
    *,
    actor: str,
    action: str,
    target: str,
    error: BaseException | None = None,
    params: JSONObject | None = None,
) -> None:
    """Audit-log an operation the server performed (AdminService handlers call this)."""
    log_outcome(db, actor, action, target, error, dict(params or {}, path="server"))


@contextmanager
def server_action(
    store: SamplePathStore,
    action: str,
    target: str,
    *,
    actor: str = "server (admin role)",
    **params: JSONValue,
) -> Iterator[None]:
    """Wrap one AdminService operation of a running server: its outcome (ok, refused with the
    reason, failed) is appended to the admin audit log of the server's store."""
    db = admin_db_for(store)
    try:
        yield
    except Exception as exc:
        record_server_action(
            db, actor=actor, action=action, target=target, error=exc, params=params
        )
        raise
    record_server_action(db, actor=actor, action=action, target=target, params=params)
