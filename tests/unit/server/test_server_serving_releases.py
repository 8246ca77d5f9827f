"""The release-management service (qveil.server.serving.releases) over a real SQLite store
and registry: a start registers and activates a receipted bundle, activation swaps releases
(by path or by id, found beside the served one), retirement is final, a bundle that does not
match its store record or has no receipt is refused, and a refused request changes nothing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from server_helpers import TEST_POPULATION, ModuleRegistry, make_bundle

from qveil.bundle import RECEIPT_FILE
from qveil.errors import FailedPrecondition, IntegrityError, InvalidArgument, NotFound
from qveil.server.serving.services import Services
from qveil.server.store import open_store
from qveil.server.store.base import SamplePathStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SamplePathStore]:
    with open_store(f"sqlite:///{tmp_path / 's.sqlite'}") as st:
        yield st


def _statuses(s: Services) -> dict[str, str]:
    return {r.release_id: r.status for r in s.releases.list_releases()[0]}


def test_start_activate_by_id_and_retire(
    tmp_path: Path, store: SamplePathStore, module_registry: ModuleRegistry
) -> None:
    b1 = make_bundle(tmp_path / "bundles" / "b1", seed=1, home=module_registry.home)
    b2 = make_bundle(tmp_path / "bundles" / "b2", seed=2, actions=2, home=module_registry.home)
    s = Services.create(store=store, registry=module_registry.registry)
    r1 = s.releases.start(b1).release_id
    assert s.releases.last_receipt is not None and s.releases.last_receipt.release_id == r1
    assert _statuses(s) == {r1: "active"}
    rel, previous = s.releases.activate(bundle_path=str(b2))
    r2 = rel.release_id
    assert previous == r1 and rel.n_actions == 2 and s.ctx.holder.current().release_id == r2
    assert _statuses(s) == {r1: "staged", r2: "active"}
    listed, active = s.releases.list_releases()
    assert active == r2 and {r.n_actions for r in listed} == {3, 2}
    # by id alone: the bundle is found beside the served one
    s.releases.known_bundles.clear()
    s.releases.known_bundles[r2] = b2.resolve()
    rel, previous = s.releases.activate(release_id=r1)
    assert (rel.release_id, previous) == (r1, r2)
    with pytest.raises(FailedPrecondition, match="is active; activate another release"):
        s.releases.retire(r1)
    assert s.releases.retire(r2).status == "retired"
    with pytest.raises(FailedPrecondition, match="is retired"):
        s.releases.activate(bundle_path=str(b2))
    assert _statuses(s) == {r1: "active", r2: "retired"}
    assert s.ctx.holder.current().release_id == r1


def test_bad_activation_and_retirement_requests_change_nothing(
    tmp_path: Path, store: SamplePathStore, module_registry: ModuleRegistry
) -> None:
    b1 = make_bundle(tmp_path / "b1", seed=1, home=module_registry.home)
    other = make_bundle(tmp_path / "elsewhere" / "b2", seed=2, home=module_registry.home)
    s = Services.create(store=store, registry=module_registry.registry)
    r1 = s.releases.start(b1).release_id
    before = _statuses(s)
    with pytest.raises(InvalidArgument, match="give release_id or bundle_path") as ei:
        s.releases.activate()
    assert ei.value.reason == "MISSING_RELEASE"
    with pytest.raises(InvalidArgument, match="release_id is required"):
        s.releases.retire("")
    with pytest.raises(NotFound, match="no bundle for release 'nope' on this server"):
        s.releases.activate(release_id="nope")
    with pytest.raises(InvalidArgument, match=f"holds release .*, not '{r1}x'"):
        s.releases.activate(release_id=r1 + "x", bundle_path=str(other))
    with pytest.raises(NotFound):
        s.releases.retire("nope")
    assert _statuses(s) == before and s.ctx.holder.current().release_id == r1


def test_a_bundle_without_its_receipt_is_refused_before_anything_is_stored(
    tmp_path: Path, store: SamplePathStore, module_registry: ModuleRegistry
) -> None:
    b = make_bundle(tmp_path / "b", seed=1, home=module_registry.home)
    (b / RECEIPT_FILE).unlink()
    s = Services.create(store=store, registry=module_registry.registry)
    with pytest.raises(Exception, match="receipt"):
        s.releases.start(b)
    assert store.releases.list_releases() == [] and s.ctx.holder.peek() is None


def test_a_release_registered_with_other_parameters_is_refused(
    tmp_path: Path, store: SamplePathStore, module_registry: ModuleRegistry
) -> None:
    b1 = make_bundle(tmp_path / "b1", seed=1, sigma=2.0, home=module_registry.home)
    s = Services.create(store=store, registry=module_registry.registry)
    rid = s.releases.start(b1).release_id
    imposter = make_bundle(
        tmp_path / "b2", seed=1, sigma=3.0, bundle_id=rid, home=module_registry.home
    )
    with pytest.raises(IntegrityError, match="registered in the store with different .*sigma"):
        s.releases.activate(bundle_path=str(imposter))
    assert s.ctx.holder.current().bundle.path == b1  # the served bundle stays


def test_stats_cards_budgets_and_spending(
    tmp_path: Path, store: SamplePathStore, module_registry: ModuleRegistry
) -> None:
    b = make_bundle(tmp_path / "b", seed=4, home=module_registry.home)
    s = Services.create(store=store, registry=module_registry.registry)
    assert s.releases.stored_points() == {} and s.releases.stats().active_release_id == ""
    rid = s.releases.start(b).release_id
    log = s.start_answer_log(store)
    try:
        s.query.get_values(np.array([0.0, 1.0]))
        assert log.flush(30)
    finally:
        log.close(30)
    assert s.releases.stored_points() == {(rid, a): 2 for a in range(3)}
    st = s.releases.stats()
    assert st.active_release_id == rid and st.states_answered == 6 and st.new_points == 6
    assert st.stored_points == {0: 2, 1: 2, 2: 2} and st.max_batch == 4096
    got_id, public, admin = s.releases.admin_card()
    assert got_id == rid and public == s.ctx.holder.current().bundle.public_card()
    assert "weights_sha256" in admin and "weights_sha256" not in public
    with pytest.raises(NotFound):
        s.releases.admin_card("nope")
    [budget] = s.releases.budget(TEST_POPULATION)
    assert budget["dataset_id"] == TEST_POPULATION
    assert rid in [e["release_id"] for e in budget["events"]]  # type: ignore[index]
    line = s.releases.spending(TEST_POPULATION)
    assert (
        line.startswith(f"population {TEST_POPULATION} spent eps=") and "budget eps=1e+07" in line
    )
    assert "not declared in registry" in s.releases.spending("nobody")
    shutil.rmtree(tmp_path / "b")  # a listing shows what the store knows
    s.releases._cards.clear()
    s.releases.known_bundles.clear()
    [only] = s.releases.list_releases()[0]
    assert only.release_id == rid and only.reason == "bundle not available on this server"
