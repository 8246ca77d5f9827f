"""Retraining under the ledger (qveil.server.governance.retrain), called directly on a real
SQLite store and registry with a tiny seeded LineWalk config: where new bundles go, the
training config's checks, and refusals (before or after training) that leave no bundle, no
release and no charge, each logged (the whole lifecycle through ``qveil admin``:
test_server_governance_admin.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qveil.errors import BudgetExceeded, FailedPrecondition, InvalidArgument
from qveil.server.governance import admin, audit_log
from qveil.server.governance.ledger import Ledger
from qveil.server.governance.retrain import default_releases_dir, retrain


def test_new_bundles_go_beside_a_sqlite_store_file(tmp_path: Path) -> None:
    assert default_releases_dir(f"sqlite:///{tmp_path / 'a' / 's.sqlite'}") == tmp_path / "a"
    for none in ("sqlite://", "sqlite:///:memory:", "memory://x", "postgresql://h/db", "::"):
        assert default_releases_dir(none) is None


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        ({"sigma": 1.0, "epsilon": 1.0}, InvalidArgument, "give --epsilon or --sigma, not both"),
        ({"sigma": 0.0}, InvalidArgument, "sigma = 0 is the non-private baseline"),
        ({"sigma": 1.0, "mode": "nope"}, InvalidArgument, "mode"),
    ],
)
def test_a_bad_training_request_is_refused_and_logged(
    admin_store: str, tiny_config: Path, kwargs: dict[str, object], error: type, says: str
) -> None:
    with admin.open_admin(admin_store, actor="t") as ctx:
        ctx.ledger.set_cap("d", cap_epsilon=1e6, cap_delta=0.5, actor="t")
        with pytest.raises(error, match=says):
            retrain(ctx, config=tiny_config, dataset_id="d", **kwargs)  # type: ignore[arg-type]
        assert ctx.store.releases.list_releases() == [] and ctx.ledger.entries("d") == []
        last = audit_log.entries(ctx.db)[-1]
        assert (last.action, last.target, last.outcome) == ("retrain", "d", "refused")


def test_a_dataset_without_a_cap_is_refused_before_training(
    admin_store: str, tiny_config: Path
) -> None:
    with admin.open_admin(admin_store, actor="t") as ctx:
        with pytest.raises(FailedPrecondition, match="has no budget"):
            retrain(ctx, config=tiny_config, dataset_id="nobody", sigma=1.0, mode="gdp")
    srv = Path(admin_store.removeprefix("sqlite:///")).parent
    assert [p for p in srv.iterdir() if p.is_dir()] == []


def test_a_memory_store_needs_an_out_dir(tiny_config: Path, tmp_path: Path) -> None:
    with admin.open_admin(f"memory://{tmp_path.name}", actor="t") as ctx:
        ctx.ledger.set_cap("d", cap_epsilon=1e6, cap_delta=0.5, actor="t")
        with pytest.raises(InvalidArgument, match="give --out-dir"):
            retrain(ctx, config=tiny_config, dataset_id="d", sigma=1.0, mode="gdp", seed=1)
        assert ctx.ledger.entries("d") == []


def test_refusal_at_record_time_leaves_nothing(
    admin_store: str, tiny_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another retrain spent the budget while this one trained: the atomic check in
    Ledger.record refuses, the bundle is deleted, no release is registered."""
    with admin.open_admin(admin_store, actor="t") as ctx:
        ctx.ledger.set_cap("d", cap_epsilon=1.0, cap_delta=1e-3, actor="t")
        monkeypatch.setattr(Ledger, "check", lambda self, event, **kw: None)  # the pre-check passed
        with pytest.raises(BudgetExceeded) as info:
            retrain(ctx, config=tiny_config, dataset_id="d", sigma=1.0, mode="gdp", seed=1)
        assert info.value.cap == (1.0, 1e-3) and info.value.spent == (0.0, 0.0)
        assert ctx.store.releases.list_releases() == [] and ctx.ledger.entries("d") == []
        assert admin.releases(ctx) == []
    srv = Path(admin_store.removeprefix("sqlite:///")).parent
    assert [p for p in srv.iterdir() if p.is_dir()] == []
