"""``qveil admin``: retrain under the ledger with a fresh noise key per release (and the
registry's signed receipt of its charge), refusals that leave nothing behind, activation,
rollback and retirement on the store, and the audit log of it all. Real training (a tiny
LineWalk config, seeded), real SQLite files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from store_helpers import log_values

from qveil.bundle import load_bundle
from qveil.bundle.receipt import check_receipt
from qveil.cli import main
from qveil.errors import FailedPrecondition
from qveil.privacy import PrivacyParams, account
from qveil.server.governance import admin, audit_log
from qveil.server.governance.retrain import retrain


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, (json.loads(out) if "--json" in argv and code == 0 else out)


def _retrain_argv(admin_store: str, config: Path, dataset_id: str) -> list[str]:
    """``qveil admin retrain`` of ``config`` in gdp mode at sigma 1, seeded."""
    return [
        *("admin", "retrain", "--store", admin_store, "--config", str(config)),
        *("--dataset-id", dataset_id, "--sigma", "1.0", "--mode", "gdp", "--seed", "1"),
    ]


def _set_cap_argv(admin_store: str, dataset_id: str, epsilon: str) -> list[str]:
    """``qveil admin set-cap`` of ``dataset_id`` at (epsilon, 1e-3)."""
    return ["admin", "set-cap", "--store", admin_store, "--dataset-id", dataset_id,
            "--epsilon", epsilon, "--delta", "1e-3"]  # fmt: skip


# long-function: one release lifecycle top to bottom: retrain, activate, roll back, retire
def test_retrain_activate_rollback_retire(
    admin_store: str, tiny_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = _cli(
        capsys,
        *_set_cap_argv(admin_store, "users", "5000"),
    )
    assert code == 0
    code, r1 = _cli(
        capsys,
        *_retrain_argv(admin_store, tiny_config, "users"),
        "--activate",
        "--json",
    )
    assert code == 0
    rid1 = r1["release_id"]
    bundle1 = Path(r1["bundle_path"])
    assert r1["activated"] and bundle1.is_dir() and bundle1.name == rid1
    assert bundle1.parent == Path(admin_store.removeprefix("sqlite:///")).parent  # beside store

    with admin.open_admin(admin_store, actor="test") as ctx:
        # the recorded numbers are the accountant's, recomputed from the bundle's own card
        card = json.loads((bundle1 / "card.json").read_text())
        res = account(PrivacyParams.from_dict(card["privacy_params"]))
        [entry] = ctx.ledger.entries("users")
        assert entry.release_id == rid1
        assert entry.event.epsilon == res.epsilon and entry.event.delta == res.delta_total
        # the release answered two states: its answer log holds their values (the key's)
        b1 = load_bundle(bundle1)
        rec1 = ctx.store.releases.get_release(rid1)
        _xs, gs1, written, _ = log_values(ctx.store, b1.noise_paths, rid1, [0], [[0.25, 0.5]])
        assert written == 2
        # a second retrain (unseeded, as in production: its key is drawn from OS entropy): a
        # new release id, a new key (new noise), an empty answer log
        r2 = retrain(ctx, config=tiny_config, dataset_id="users", sigma=1.0, mode="gdp")
        rid2 = r2.release_id
        assert rid2 != rid1
        b2 = load_bundle(r2.bundle_path)
        assert b2.noise_key != b1.noise_key
        assert b2.card["key_sha256"] != b1.card["key_sha256"]
        assert ctx.store.count_points(rid2) == 0 and ctx.store.count_points(rid1) == 2
        assert r2.budget.spent[0] > entry.event.epsilon  # composed with the first
        # each bundle carries the registry's signed receipt of its own charge
        for b, want in ((b1, entry), (b2, r2.ledger_entry)):
            rc = check_receipt(
                b.path,
                release_id=b.bundle_id,
                key_sha256=b.card["key_sha256"],
                weights_sha256=b.card["weights_sha256"],
                card_sha256=b.card["card_sha256"],
                trusted=[ctx.registry.public_key],
            )
            assert (rc.population, rc.epsilon, rc.delta) == (
                "users",
                want.event.epsilon,
                want.event.delta,
            )
        status = {r.header.release_id: r.header.status for r in admin.releases(ctx)}
        assert status == {rid1: "active", rid2: "staged"}

        admin.activate(ctx, rid2)
        assert {r.header.release_id: r.header.status for r in admin.releases(ctx)} == {
            rid1: "staged",
            rid2: "active",
        }
        admin.activate(ctx, rid1)  # rollback: the old release, its logged noise unchanged
        assert ctx.store.releases.get_release(rid1).status == "active"
        assert rec1.fingerprint == ctx.store.releases.get_release(rid1).fingerprint
        assert [p.g for p in ctx.store.iter_points(rid1, 0)] == list(gs1[0])
        with pytest.raises(FailedPrecondition, match="is active"):
            admin.retire(ctx, rid1)
        admin.retire(ctx, rid2)
        with pytest.raises(FailedPrecondition, match="retired"):
            admin.activate(ctx, rid2)
        assert ctx.store.releases.get_release(rid2).status == "retired"

        log = audit_log.entries(ctx.db)  # the store's operations
        assert [(e.action, e.outcome) for e in log] == [
            ("retrain", "ok"),
            ("activate", "ok"),
            ("retrain", "ok"),
            ("activate", "ok"),
            ("activate", "ok"),
            ("retire", "refused"),
            ("retire", "ok"),
            ("activate", "refused"),
        ]
        # the registry's: the population's budget and spending
        reg_log = audit_log.entries(ctx.registry.db)
        assert [(e.action, e.outcome) for e in reg_log] == [
            ("ledger.set_cap", "ok"),
            ("ledger.record", "ok"),
            ("ledger.record", "ok"),
        ]
        assert audit_log.verify_audit_log(ctx.db).ok and ctx.ledger.verify().ok
        assert audit_log.verify_audit_log(ctx.registry.db).ok

    code, rows = _cli(capsys, "admin", "releases", "--store", admin_store, "--json")
    assert code == 0 and {r["release_id"] for r in rows} == {rid1, rid2}
    assert all(r["dataset_id"] == "users" and r["epsilon"] > 0 for r in rows)
    code, budget = _cli(capsys, "admin", "budget", "--store", admin_store, "--json")
    assert code == 0 and [b["dataset_id"] for b in budget] == ["users"]
    assert len(budget[0]["events"]) == 2 and budget[0]["remaining"]["epsilon"] > 0
    code, text = _cli(capsys, "admin", "log", "--store", admin_store)
    assert code == 0 and "retire" in text and "refused" in text


def test_retrain_over_budget_is_refused_before_training(
    admin_store: str, tiny_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_set_cap_argv(admin_store, "d", "1")) == 0
    code = main(_retrain_argv(admin_store, tiny_config, "d"))
    err = capsys.readouterr().err
    assert code == 2 and "budget of dataset 'd' exceeded" in err and "cap (eps=1" in err
    srv = Path(admin_store.removeprefix("sqlite:///")).parent
    assert sorted(p.name for p in srv.iterdir() if p.is_dir()) == []  # no bundle written
    with admin.open_admin(admin_store, actor="t") as ctx:
        assert ctx.store.releases.list_releases() == [] and ctx.ledger.entries("d") == []
        last = audit_log.entries(ctx.db)[-1]
        assert (last.action, last.outcome) == ("retrain", "refused")
        assert "exceeded" in last.detail
    # a dataset without a cap is refused too (no silent unlimited budget)
    assert main(_retrain_argv(admin_store, tiny_config, "other")) == 2
    assert "has no budget" in capsys.readouterr().err


def test_admin_needs_a_store(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QVEIL_STORE_URL", raising=False)
    assert main(["admin", "budget"]) == 2
    assert "needs --store" in capsys.readouterr().err
