"""Privacy ledger and admin audit log: composition under a cap, refusal that leaves
nothing behind, persistence across restarts, tamper detection, serialized concurrent records.

Real SQLite files (and the real PostgreSQL server for the concurrency test). Events come from
the accountant (output mode: no training needed). The ledger here is the class itself on a
store's database with dataset caps (``Ledger(db)``); the registry's population ledger, which
``qveil train`` and ``qveil admin`` use, is tested in test_server_governance_population.py."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from qveil.errors import BudgetExceeded, FailedPrecondition, InvalidArgument
from qveil.privacy import PrivacyParams, account
from qveil.privacy.ledger import PrivacyEvent, compose
from qveil.server.governance import audit_log
from qveil.server.governance.admin import open_admin
from qveil.server.governance.ledger import Ledger

BASE = PrivacyParams(
    mode="output",
    sigma=6.0,
    delta=1e-5,
    samples=1000,
    batch_size=10,
    lr=0.01,
    k=1.0,
    lipschitz=1.0,
    resets=1,
    actions=2,
    gamma=0.9,
    reward_bound=0.5,
)


def event(dataset: str, bundle: str, *, sigma: float = 6.0) -> PrivacyEvent:
    """A real event: the accountant's result for output-mode parameters."""
    return PrivacyEvent.from_result(
        account(BASE.replace(sigma=sigma)), dataset_id=dataset, bundle_id=bundle
    )


def cap_between_3_and_4() -> tuple[float, float]:
    """An epsilon cap that three identical events fit under and four do not."""
    evs = [event("d", f"b{i}") for i in range(4)]
    e3, e4 = compose(evs[:3])[0], compose(evs)[0]
    assert e3 < e4
    return (e3 + e4) / 2, 1e-3


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite'}"


def _sql(url: str, sql: str, *args: object) -> int:
    """Tamper with the database file behind qveil's back (a raw sqlite3 connection)."""
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        n = conn.execute(sql, args).rowcount
        conn.commit()
        return n
    finally:
        conn.close()


def test_three_releases_compose_fourth_is_refused_and_nothing_registered(store_url: str) -> None:
    cap_eps, cap_delta = cap_between_3_and_4()
    with open_admin(store_url, actor="tester") as ctx:
        led = Ledger(ctx.db)
        led.set_cap("ds", cap_epsilon=cap_eps, cap_delta=cap_delta, actor="tester")
        evs = [event("ds", f"bundle-{i}") for i in range(4)]
        for i, ev in enumerate(evs[:3]):
            led.record(ev, release_id=f"rel-{i}", actor="tester")
        spent = led.budget("ds").spent
        assert spent == compose(evs[:3])  # the accountant's composition, not a sum of ours
        log_before = audit_log.entries(ctx.db)
        with pytest.raises(BudgetExceeded) as info:
            led.record(evs[3], release_id="rel-3", actor="tester")
        exc = info.value
        assert exc.dataset_id == "ds"
        assert exc.spent == spent
        assert exc.requested == (evs[3].epsilon, evs[3].delta)
        assert exc.cap == (cap_eps, cap_delta)
        # the pre-check used before training raises the same, and writes nothing either
        with pytest.raises(BudgetExceeded):
            led.check(evs[3])
        rep = led.budget("ds")
        assert [e.release_id for e in rep.entries] == ["rel-0", "rel-1", "rel-2"]
        assert rep.spent == spent
        assert rep.remaining == pytest.approx((cap_eps - spent[0], cap_delta - spent[1]))
        assert audit_log.entries(ctx.db) == log_before
        assert led.verify().ok


def test_no_cap_no_spending_and_forged_numbers_refused(store_url: str) -> None:
    with open_admin(store_url, actor="t") as ctx:
        with pytest.raises(FailedPrecondition, match="no privacy cap"):
            Ledger(ctx.db).record(event("nocap", "b"), release_id="r", actor="t")
        Ledger(ctx.db).set_cap("ds", cap_epsilon=1e6, cap_delta=0.5, actor="t")
        honest = event("ds", "b")
        forged = dataclasses.replace(honest, epsilon=honest.epsilon / 10)
        with pytest.raises(InvalidArgument, match="accountant"):
            Ledger(ctx.db).record(forged, release_id="r", actor="t")
        assert Ledger(ctx.db).entries("ds") == []
        with pytest.raises(InvalidArgument):
            Ledger(ctx.db).set_cap("ds", cap_epsilon=float("nan"), cap_delta=0.1, actor="t")


def test_ledger_survives_restart(store_url: str) -> None:
    with open_admin(store_url, actor="a") as ctx:
        Ledger(ctx.db).set_cap("ds", cap_epsilon=100.0, cap_delta=1e-3, actor="a")
        Ledger(ctx.db).record(event("ds", "b0"), release_id="r0", actor="a")
        before = Ledger(ctx.db).budget("ds").to_dict()
        head = Ledger(ctx.db).verify().head_hash
    with open_admin(store_url, actor="b") as ctx:  # a new process would see the same
        assert Ledger(ctx.db).budget("ds").to_dict() == before
        assert Ledger(ctx.db).verify().head_hash == head
        Ledger(ctx.db).record(event("ds", "b1"), release_id="r1", actor="b")
        rep = Ledger(ctx.db).verify()
        assert rep.ok and rep.count == 3  # 2 events + 1 cap
        assert [e.seq for e in Ledger(ctx.db).entries("ds")] == [1, 2]
        assert audit_log.verify_audit_log(ctx.db).ok


def _fill_ledger(db: Any) -> None:
    """A cap and three events."""
    Ledger(db).set_cap("ds", cap_epsilon=100.0, cap_delta=1e-3, actor="a")
    for i in range(3):
        Ledger(db).record(event("ds", f"b{i}"), release_id=f"r{i}", actor="a")


def _fill_audit_log(db: Any) -> None:
    """Four entries, one refused."""
    for i, outcome in enumerate(("ok", "ok", "refused", "ok")):
        audit_log.append(
            db,
            actor="a",
            action="activate",
            target=f"r{i}",
            outcome=outcome,
            params={"release_id": f"r{i}"},
        )


#: each hash-chained log: how a test fills it, how it is verified
LOGS: dict[str, tuple[Callable[[Any], None], Callable[[Any], Any]]] = {
    "ledger": (_fill_ledger, lambda db: Ledger(db).verify()),
    "audit log": (_fill_audit_log, audit_log.verify_audit_log),
}


@pytest.mark.parametrize(
    "log, tamper, finding",
    [
        (
            "ledger",
            "UPDATE ledger_events SET epsilon = epsilon / 2 WHERE seq = 2",
            "event 2 was edited",
        ),
        (
            "ledger",
            "UPDATE ledger_events SET event_json = replace(event_json, '\"sigma\": 6.0', "
            "'\"sigma\": 60.0') WHERE seq = 1",
            "event 1 was edited",
        ),
        ("ledger", "DELETE FROM ledger_events WHERE seq = 1", "sequence gap"),
        ("ledger", "DELETE FROM ledger_events WHERE seq = 3", "event 3 announced in the audit log"),
        ("ledger", "UPDATE ledger_caps SET cap_epsilon = 1e9", "cap 1 was edited"),
        (
            "audit log",
            "UPDATE admin_audit_log SET outcome = 'ok' WHERE seq = 3",
            "entry 3 was edited",
        ),
        (
            "audit log",
            "UPDATE admin_audit_log SET actor = 'someone-else' WHERE seq = 1",
            "entry 1 was edited",
        ),
        ("audit log", "DELETE FROM admin_audit_log WHERE seq = 2", "sequence gap"),
    ],
)
def test_an_edited_log_is_detected(store_url: str, log: str, tamper: str, finding: str) -> None:
    """One row of the ledger or the admin audit log edited or deleted behind the server's
    back: verify (on a fresh connection) fails and names what it found."""
    fill, verify = LOGS[log]
    with open_admin(store_url, actor="a") as ctx:
        fill(ctx.db)
        assert verify(ctx.db).ok
    assert _sql(store_url, tamper) == 1
    with open_admin(store_url, actor="a") as ctx:
        rep = verify(ctx.db)
        assert not rep.ok
        assert any(finding in p for p in rep.problems), rep.problems


def _race(url: str, n_threads: int) -> tuple[int, int, float]:
    """n threads, each its own admin connection, record one event at the same moment under a cap
    that fits exactly three. Returns (recorded, refused, cap epsilon)."""
    cap_eps, cap_delta = cap_between_3_and_4()
    with open_admin(url, actor="setup") as ctx:
        Ledger(ctx.db).set_cap("race", cap_epsilon=cap_eps, cap_delta=cap_delta, actor="setup")
    barrier = threading.Barrier(n_threads)
    results: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        with open_admin(url, actor=f"w{i}") as ctx:
            ev = event("race", f"b{i}")
            barrier.wait()
            try:
                Ledger(ctx.db).record(ev, release_id=f"r{i}", actor=f"w{i}")
                out = "ok"
            except BudgetExceeded:
                out = "refused"
            with lock:
                results.append(out)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results.count("ok"), results.count("refused"), cap_eps


def test_concurrent_records_are_serialized(sql_url: str) -> None:
    """Six threads race to record under a cap with room for three, on SQLite and PostgreSQL:
    without a serializing transaction (SQLite's BEGIN IMMEDIATE), several would read 'two
    spent' together and all fit."""
    ok, refused, cap_eps = _race(sql_url, 6)
    assert (ok, refused) == (3, 3)
    with open_admin(sql_url, actor="x") as ctx:
        assert Ledger(ctx.db).budget("race").spent[0] <= cap_eps
        assert Ledger(ctx.db).verify().ok and audit_log.verify_audit_log(ctx.db).ok


def test_ledger_on_memory_store_is_marked_ephemeral() -> None:
    with open_admin("memory://", actor="a") as ctx:
        Ledger(ctx.db).set_cap("ds", cap_epsilon=100.0, cap_delta=1e-3, actor="a")
        Ledger(ctx.db).record(event("ds", "b"), release_id="r", actor="a")
        assert Ledger(ctx.db).budget("ds").ephemeral
        assert Ledger(ctx.db).verify().ok
