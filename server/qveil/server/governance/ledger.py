"""The privacy ledger: every privacy event of every dataset, persisted in the store's database.

One row per :class:`qveil.privacy.PrivacyEvent` (its canonical JSON, exactly as the accountant
serialises it) per dataset, hash-chained per dataset (``qveil.server.governance.hashchain``), plus
an append-only history of each dataset's cap. Recording an event is one serialized transaction
(``AdminDB.write``: BEGIN IMMEDIATE on SQLite, an advisory lock per dataset on PostgreSQL):

    read the dataset's events and cap -> qveil.privacy.check_budget -> append -> audit-log entry

so two concurrent retrains cannot both fit under a cap that only one of them fits, and a refused
event leaves nothing behind (:class:`qveil.errors.BudgetExceeded` carries spent, requested and
cap). Composition is the accountant's (``qveil.privacy.compose``); this module adds no privacy
arithmetic of its own (non-negotiable 6), and :meth:`Ledger.verify` re-runs the accountant on
each event's own parameters so that an auditor trusts the record, not a number typed into it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa

from qveil.errors import FailedPrecondition, InvalidArgument, echo
from qveil.json_types import JSONObject
from qveil.privacy.ledger import (
    PrivacyEvent,
    check_budget,
    compose_with_rule,
    filter_check,
    filter_state,
    verify_event,
)
from qveil.privacy.record import Record
from qveil.server.governance import admin_tables as T
from qveil.server.governance import audit_log
from qveil.server.governance.admin_db import AdminDB
from qveil.server.governance.audit_log import ChainReport, utc_now
from qveil.server.governance.hashchain import GENESIS, link_hash
from qveil.server.store.models import TableRow

__all__ = ["BudgetReport", "Cap", "Ledger", "LedgerEntry"]

#: Relative tolerance when the accountant's recomputed epsilon is compared with the record's.
RECOMPUTE_RTOL = 1e-9


@dataclass(frozen=True, slots=True)
class Cap(Record):
    """A dataset's privacy cap (the newest row of its cap history)."""

    dataset_id: str
    epsilon: float
    delta: float
    seq: int
    actor: str
    created_at: str


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One recorded privacy event."""

    dataset_id: str
    seq: int
    release_id: str | None
    event: PrivacyEvent
    created_at: str
    hash: str

    def to_dict(self) -> JSONObject:
        return {
            "dataset_id": self.dataset_id,
            "seq": self.seq,
            "release_id": self.release_id,
            "bundle_id": self.event.bundle_id,
            "mode": self.event.mode,
            "epsilon": self.event.epsilon,
            "delta": self.event.delta,
            "created_at": self.created_at,
            "hash": self.hash,
            "event": json.loads(self.event.to_json()),
        }


@dataclass(frozen=True, slots=True)
class BudgetReport:
    """What ``qveil admin budget`` shows for one dataset."""

    dataset_id: str
    cap: Cap | None
    spent: tuple[float, float]
    remaining: tuple[float, float] | None
    entries: list[LedgerEntry] = field(default_factory=list)
    ephemeral: bool = False
    rule: str = ""

    def to_dict(self) -> JSONObject:
        return {
            "dataset_id": self.dataset_id,
            "cap": None if self.cap is None else self.cap.to_dict(),
            "spent": {"epsilon": self.spent[0], "delta": self.spent[1]},
            "remaining": None
            if self.remaining is None
            else {"epsilon": self.remaining[0], "delta": self.remaining[1]},
            "composition": "the population's privacy filter (qveil.privacy.filter_state) when "
            "it has a budget, else qveil.privacy.compose over the recorded events",
            "rule": self.rule,
            "events": [e.to_dict() for e in self.entries],
            "ephemeral": self.ephemeral,
        }


def _lock(dataset_id: str) -> str:
    return f"ledger:{dataset_id}"


def _check_dataset(dataset_id: str) -> str:
    if not isinstance(dataset_id, str) or not dataset_id.strip() or len(dataset_id) > 200:
        raise InvalidArgument(
            f"dataset id must be a non-empty string of <= 200 characters, got {echo(dataset_id)}"
        )
    return dataset_id


def _checked_event(event: PrivacyEvent) -> str:
    """The event's dataset id, once its (epsilon, delta) are valid numbers that the accountant
    reproduces from the event's own parameters now (non-negotiable 6)."""
    dataset_id = _check_dataset(event.dataset_id)
    if not (
        math.isfinite(event.epsilon)
        and event.epsilon >= 0
        and math.isfinite(event.delta)
        and 0 <= event.delta <= 1
    ):
        raise InvalidArgument(
            f"privacy event has invalid (epsilon, delta) = ({event.epsilon!r}, {event.delta!r})"
        )
    try:
        verify_event(event, rel_tol=RECOMPUTE_RTOL)
    except InvalidArgument as exc:
        raise InvalidArgument(f"privacy event refused: {exc}") from None
    return dataset_id


@dataclass(frozen=True)
class _Chain:
    """One of the ledger's two hash chains per dataset (events, caps): its table, how its rows
    are hashed, the audit-log entry that announces each row, and how a finding names a row."""

    table: sa.Table
    #: a row's name in findings ("event", "cap")
    kind: str
    #: the audit-log action announcing a row; its params name the row's seq and hash
    #: ``<prefix>_seq`` and ``<prefix>_hash``
    action: str
    prefix: str
    #: the finding for a seq that is not the expected one (format: ``expected``, ``seq``)
    gap: str
    #: what a row that does not link to the one before it is said not to link to
    before: str
    #: findings about a stored row's own content (where, dataset id, row), beyond its link
    row_findings: Callable[[str, str, TableRow], list[str]] | None = None

    @property
    def seq_key(self) -> str:
        return f"{self.prefix}_seq"

    @property
    def hash_key(self) -> str:
        return f"{self.prefix}_hash"

    @property
    def columns(self) -> tuple[str, ...]:
        """The row's own columns: all but its dataset, seq, time and hashes (all hashed)."""
        chain = ("dataset_id", "seq", "created_at", "prev_hash", "hash")
        return tuple(c.name for c in self.table.columns if c.name not in chain)


_EVENTS = _Chain(
    table=T.ledger_events,
    kind="event",
    action="ledger.record",
    prefix="ledger",
    gap="sequence gap: expected event {expected}, found {seq}",
    before="the event before it",
    row_findings=lambda where, ds, r: _event_findings(where, ds, r),
)
_CAPS = _Chain(
    table=T.ledger_caps,
    kind="cap",
    action="ledger.set_cap",
    prefix="cap",
    gap="cap sequence gap: expected {expected}, found {seq}",
    before="the one before it",
)


def _hashed(dataset_id: str, seq: int, created_at: str, values: JSONObject) -> JSONObject:
    """What the hash of a chain row covers: its dataset, seq and time, and its own columns
    (the event's JSON under the name ``event``)."""
    own = {("event" if k == "event_json" else k): v for k, v in values.items()}
    return {"dataset_id": dataset_id, "seq": seq, **own, "created_at": created_at}


def _stored(chain: _Chain, r: TableRow) -> JSONObject:
    """The own columns of a stored row of ``chain``, each number as the float it was hashed as."""
    t = chain.table
    return {
        c: float(getattr(r, c)) if isinstance(t.c[c].type, sa.Double) else getattr(r, c)
        for c in chain.columns
    }


def _append_link(
    db: AdminDB,
    conn: sa.Connection,
    chain: _Chain,
    dataset_id: str,
    values: JSONObject,
    *,
    actor: str,
    params: JSONObject,
) -> tuple[int, str, str]:
    """Append the next row of ``dataset_id``'s hash chain ``chain`` (``values`` its own
    columns) and the audit-log entry by ``actor`` that announces it (``params`` plus the
    dataset id and the row's seq and hash): seq one past the last, created now, hashed with
    the previous hash. Returns (seq, created_at, hash)."""
    t = chain.table
    last = conn.execute(
        sa.select(t.c.seq, t.c.hash)
        .where(t.c.dataset_id == dataset_id)
        .order_by(t.c.seq.desc())
        .limit(1)
    ).first()
    seq = 1 if last is None else int(last.seq) + 1
    prev = GENESIS if last is None else str(last.hash)
    at = utc_now()
    h = link_hash(prev, _hashed(dataset_id, seq, at, values))
    conn.execute(
        t.insert().values(
            dataset_id=dataset_id, seq=seq, created_at=at, prev_hash=prev, hash=h, **values
        )
    )
    audit_log.append(
        db,
        conn=conn,
        actor=actor,
        action=chain.action,
        target=dataset_id,
        outcome="ok",
        params={"dataset_id": dataset_id, chain.seq_key: seq, chain.hash_key: h} | params,
    )
    return seq, at, h


class Ledger:
    """The privacy ledger of one store database (see the module docstring)."""

    def __init__(self, db: AdminDB, *, population: bool = False) -> None:
        self.db = db
        #: a population ledger (the registry's): caps are population budgets, enforced by a
        #: privacy filter (``qveil.privacy.filter_check``), and a budget is required
        self.population = population

    # ---------------------------------------------------------------- caps
    def set_cap(self, dataset_id: str, *, cap_epsilon: float, cap_delta: float, actor: str) -> Cap:
        """Append a new cap for ``dataset_id`` (audit-logged). A cap below what is already spent
        is allowed: it only blocks further events."""
        _check_dataset(dataset_id)
        eps, delta = float(cap_epsilon), float(cap_delta)
        if not (math.isfinite(eps) and eps > 0):
            raise InvalidArgument(f"cap epsilon must be a finite number > 0, got {cap_epsilon!r}")
        if not (math.isfinite(delta) and 0 <= delta < 1):
            raise InvalidArgument(f"cap delta must be in [0, 1), got {cap_delta!r}")
        with self.db.write(_lock(dataset_id)) as conn:
            if self.population and self._cap(conn, dataset_id) is not None:
                raise FailedPrecondition(
                    f"population {dataset_id!r} is declared already: a population has one "
                    "budget, never raised (qveil budget show NAME)"
                )
            seq, at, h = _append_link(
                self.db,
                conn,
                _CAPS,
                dataset_id,
                {"cap_epsilon": eps, "cap_delta": delta, "actor": actor},
                actor=actor,
                params={"cap_epsilon": eps, "cap_delta": delta},
            )
        return Cap(dataset_id, eps, delta, seq, actor, at)

    def cap(self, dataset_id: str) -> Cap | None:
        with self.db.read() as conn:
            return self._cap(conn, dataset_id)

    @staticmethod
    def _cap(conn: sa.Connection, dataset_id: str) -> Cap | None:
        t = T.ledger_caps
        r = conn.execute(
            sa.select(t).where(t.c.dataset_id == dataset_id).order_by(t.c.seq.desc()).limit(1)
        ).first()
        if r is None:
            return None
        return Cap(
            r.dataset_id,
            float(r.cap_epsilon),
            float(r.cap_delta),
            int(r.seq),
            r.actor,
            r.created_at,
        )

    # ---------------------------------------------------------------- events
    @staticmethod
    def _entries(conn: sa.Connection, dataset_id: str) -> list[LedgerEntry]:
        t = T.ledger_events
        out = []
        for r in conn.execute(sa.select(t).where(t.c.dataset_id == dataset_id).order_by(t.c.seq)):
            out.append(
                LedgerEntry(
                    r.dataset_id,
                    int(r.seq),
                    r.release_id,
                    PrivacyEvent.from_json(r.event_json),
                    r.created_at,
                    r.hash,
                )
            )
        return out

    def entries(self, dataset_id: str) -> list[LedgerEntry]:
        """The dataset's recorded events, oldest first."""
        with self.db.read() as conn:
            return self._entries(conn, dataset_id)

    def datasets(self) -> list[str]:
        """Every dataset with a cap or an event."""
        with self.db.read() as conn:
            a = conn.execute(sa.select(T.ledger_events.c.dataset_id).distinct()).scalars().all()
            b = conn.execute(sa.select(T.ledger_caps.c.dataset_id).distinct()).scalars().all()
        return sorted(set(a) | set(b))

    def check(self, event: PrivacyEvent, *, budget: float | None = None) -> None:
        """Raise :class:`BudgetExceeded` (or :class:`FailedPrecondition` when the dataset has no
        cap) if ``event`` would not fit now; writes nothing. Used before training starts so that
        a refused retrain costs no compute; :meth:`record` checks again atomically."""
        with self.db.read() as conn:
            self._check(conn, event, budget=budget)

    def _check(
        self,
        conn: sa.Connection,
        event: PrivacyEvent,
        *,
        require_cap: bool = True,
        budget: float | None = None,
    ) -> Cap | None:
        """The dataset's cap (if any; required unless ``require_cap=False``) and the operator's
        ``--budget`` (an epsilon) must both hold with ``event`` added."""
        cap = self._cap(conn, event.dataset_id)
        if cap is None and require_cap:
            if self.population:
                raise FailedPrecondition(
                    f"population {event.dataset_id!r} has no budget: declare it once with "
                    f"qveil budget create {event.dataset_id} --epsilon EPS --delta DELTA"
                )
            raise FailedPrecondition(
                f"dataset {event.dataset_id!r} has no privacy cap; set one first: qveil admin "
                f"set-cap --dataset-id {event.dataset_id} --epsilon EPS --delta DELTA"
            )
        events = [e.event for e in self._entries(conn, event.dataset_id)]
        if cap is not None and self.population:
            filter_check(events, event, budget_epsilon=cap.epsilon, budget_delta=cap.delta)
        elif cap is not None:
            check_budget(events, event, cap_epsilon=cap.epsilon, cap_delta=cap.delta)
        if budget is not None:
            check_budget(events, event, cap_epsilon=budget, cap_delta=1.0)
        return cap

    def entry_for_release(self, release_id: str) -> LedgerEntry | None:
        """The ledger entry recorded for ``release_id`` (in any dataset), or None."""
        t = T.ledger_events
        with self.db.read() as conn:
            row = conn.execute(
                sa.select(t.c.dataset_id).where(t.c.release_id == release_id).limit(1)
            ).first()
            if row is None:
                return None
            found = [
                e for e in self._entries(conn, str(row.dataset_id)) if e.release_id == release_id
            ]
        return found[0] if found else None

    def record(
        self,
        event: PrivacyEvent,
        *,
        release_id: str | None,
        actor: str,
        require_cap: bool = True,
        budget: float | None = None,
    ) -> LedgerEntry:
        """Check the cap and append ``event`` in one serialized transaction, with its audit-log
        entry. Raises :class:`BudgetExceeded` (nothing written) when it does not fit, and
        :class:`InvalidArgument` when the accountant does not reproduce the event's numbers
        from its own parameters."""
        dataset_id = _checked_event(event)
        t = T.ledger_events
        event_json = event.to_json()
        with self.db.write(_lock(dataset_id)) as conn:
            self._check(conn, event, require_cap=require_cap, budget=budget)
            if (
                release_id is not None
                and conn.execute(sa.select(t.c.seq).where(t.c.release_id == release_id)).first()
                is not None
            ):
                raise FailedPrecondition(f"release {echo(release_id)} already has a ledger entry")
            eps, delta = float(event.epsilon), float(event.delta)
            seq, at, h = _append_link(
                self.db,
                conn,
                _EVENTS,
                dataset_id,
                {
                    "release_id": release_id,
                    "bundle_id": event.bundle_id,
                    "event_json": event_json,
                    "epsilon": eps,
                    "delta": delta,
                },
                actor=actor,
                params={
                    "release_id": release_id,
                    "epsilon": eps,
                    "delta": delta,
                    "mode": event.mode,
                },
            )
        return LedgerEntry(dataset_id, seq, release_id, event, at, h)

    def spent(self, dataset_id: str) -> tuple[float, float]:
        """(epsilon, delta) composed by the accountant over the dataset's events."""
        return self.budget(dataset_id).spent

    def budgets(self, dataset_id: str | None = None) -> list[BudgetReport]:
        """The budget of one dataset, or of every dataset (``None``)."""
        ids = [dataset_id] if dataset_id is not None else self.datasets()
        return [self.budget(d) for d in ids]

    def budget(self, dataset_id: str) -> BudgetReport:
        """Cap, spent, remaining and the events of one dataset."""
        _check_dataset(dataset_id)
        with self.db.read() as conn:
            cap = self._cap(conn, dataset_id)
            entries = self._entries(conn, dataset_id)
        events = [e.event for e in entries]
        remaining: tuple[float, float] | None
        if cap is not None and self.population:
            # a population: its privacy filter's one figure (what ``qveil budget show``,
            # ``qveil admin budget`` and ``admin ledger`` all print), never a delta above its cap
            state = filter_state(events, budget_epsilon=cap.epsilon, budget_delta=cap.delta)
            spent, remaining, rule = state.spent, state.remaining, state.rule
        else:
            # a dataset cap (not a population): composed as :meth:`record` checks it
            eps, delta, rule = compose_with_rule(events)
            spent = (float(eps), float(delta))
            remaining = (
                None
                if cap is None
                else (max(0.0, cap.epsilon - spent[0]), max(0.0, cap.delta - spent[1]))
            )
        return BudgetReport(
            dataset_id, cap, spent, remaining, entries, self.db.ephemeral, rule if entries else ""
        )

    # ---------------------------------------------------------------- verification
    def verify(self) -> ChainReport:
        """Every dataset's event chain and cap chain, each event's numbers recomputed by the
        accountant, and the cross-references with the audit log (which catch deleted newest
        rows: each event and cap row is announced by an audit-log entry and vice versa)."""
        problems: list[str] = []
        n = 0
        heads: list[str] = []
        chains = (_EVENTS, _CAPS)
        # (dataset, seq, hash) of the rows the audit log announces, and of the rows found
        refs: dict[str, set[tuple[str, int, str]]] = {c.kind: set() for c in chains}
        seen: dict[str, set[tuple[str, int, str]]] = {c.kind: set() for c in chains}
        with self.db.read() as conn:
            for e in conn.execute(
                sa.select(T.audit_log.c.action, T.audit_log.c.params_json).where(
                    T.audit_log.c.action.in_([c.action for c in chains])
                )
            ):
                c = next(c for c in chains if c.action == e.action)
                try:
                    p = json.loads(e.params_json)
                    refs[c.kind].add((p["dataset_id"], int(p[c.seq_key]), p[c.hash_key]))
                except (ValueError, KeyError, TypeError):
                    problems.append("audit log: an entry referencing the ledger is unreadable")
            datasets = sorted(
                set(conn.execute(sa.select(T.ledger_events.c.dataset_id).distinct()).scalars())
                | set(conn.execute(sa.select(T.ledger_caps.c.dataset_id).distinct()).scalars())
            )
            for ds in datasets:
                for c in chains:
                    k, head = self._verify_chain(conn, c, ds, problems, seen[c.kind])
                    n += k
                    heads.append(head)
        for c in chains:
            for ds, seq, h in sorted(refs[c.kind] - seen[c.kind]):
                problems.append(
                    f"ledger {ds!r}: {c.kind} {seq} announced in the audit log "
                    f"(hash {h[:12]}) is missing or changed"
                )
            for ds, seq, _h in sorted(seen[c.kind] - refs[c.kind]):
                problems.append(f"ledger {ds!r}: {c.kind} {seq} has no audit-log entry")
        head = link_hash(GENESIS, {"heads": heads}) if heads else GENESIS
        return ChainReport(ok=not problems, count=n, head_hash=head, problems=problems)

    @staticmethod
    def _verify_chain(
        conn: sa.Connection,
        chain: _Chain,
        ds: str,
        problems: list[str],
        seen: set[tuple[str, int, str]],
    ) -> tuple[int, str]:
        """Walk ``ds``'s rows of ``chain`` in seq order: gaps, links, hashes (and each event's
        own numbers); returns (rows, head hash)."""
        t = chain.table
        prev, expected, n = GENESIS, 1, 0
        for r in conn.execute(sa.select(t).where(t.c.dataset_id == ds).order_by(t.c.seq)):
            n += 1
            seq = int(r.seq)
            where = f"ledger {ds!r}: {chain.kind} {seq}"
            if seq != expected:
                problems.append(f"ledger {ds!r}: " + chain.gap.format(expected=expected, seq=seq))
            if r.prev_hash != prev:
                problems.append(f"{where} does not link to {chain.before}")
            if link_hash(r.prev_hash, _hashed(ds, seq, r.created_at, _stored(chain, r))) != r.hash:
                problems.append(f"{where} was edited (hash mismatch)")
            seen.add((ds, seq, r.hash))
            prev, expected = r.hash, seq + 1
            if chain.row_findings is not None:
                problems.extend(chain.row_findings(where, ds, r))
        return n, prev


def _event_findings(where: str, ds: str, r: TableRow) -> list[str]:
    """What is wrong with a stored event row's own content: unreadable JSON, another
    dataset, columns that differ from the event, numbers the accountant does not reproduce."""
    try:
        ev = PrivacyEvent.from_json(r.event_json)
    except Exception as exc:  # noqa: BLE001 - any parse failure is a finding
        return [f"{where}: event JSON unreadable: {exc}"]
    out = []
    if ev.dataset_id != ds:
        out.append(f"{where}: event names dataset {ev.dataset_id!r}")
    if ev.epsilon != float(r.epsilon) or ev.delta != float(r.delta):
        out.append(f"{where}: epsilon/delta columns differ from the event")
    return out + [f"{where}: {m}" for m in _recompute(ev)]


def _recompute(ev: PrivacyEvent) -> list[str]:
    """Re-run the accountant on the event's own parameters (``qveil.privacy.ledger.verify_event``);
    report any disagreement with the recorded numbers."""
    try:
        verify_event(ev, rel_tol=RECOMPUTE_RTOL)
    except Exception as exc:  # noqa: BLE001 - an unrecomputable event is a finding
        return [f"the accountant does not reproduce it: {exc}"]
    return []
