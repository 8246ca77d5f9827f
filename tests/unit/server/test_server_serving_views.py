"""The API's views of the server's domain objects (qveil.server.serving.views): a loaded bundle
as its public release (the card's allow-list only), a release known only from the store, a
stored point with its raw state, an integrity report with its gaps."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from server_helpers import make_bundle

from qveil.bundle import Bundle, load_bundle
from qveil.server.serving import views
from qveil.server.store.base import StoredPoint
from qveil.server.store.integrity import ActionIntegrity, IntegrityReport
from qveil.server.store.releases import new_record


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    return load_bundle(make_bundle(tmp_path_factory.mktemp("views") / "b", seed=3, actions=2))


def test_a_bundle_is_its_public_card(bundle: Bundle) -> None:
    rel = views.release_from_bundle(bundle, value_grid=2.0**-20)
    card = bundle.public_card()
    assert rel.release_id == bundle.bundle_id == card["bundle_id"]
    assert rel.card == card and rel.status == ""  # no store record given
    assert (rel.interval, rel.n_actions, rel.dims) == ((-1.0, 2.0), 2, 1)
    assert rel.state_intervals == ((-1.0, 2.0),) and rel.betas == bundle.betas
    assert rel.sigma == card["sigma"] and rel.epsilon == card["epsilon"]
    assert rel.seeded is True and rel.env_id == "LineWalk-v0" and rel.value_grid == 2.0**-20
    assert rel.created_at is not None and rel.created_at.tzinfo is not None
    # nothing of the admin card reaches the view
    text = json.dumps(rel.card)
    for secret in ("weights_sha256", "key_sha256"):
        assert secret not in text


def test_a_bundle_with_a_record_takes_its_status(bundle: Bundle) -> None:
    rec = new_record(
        release_id=bundle.bundle_id,
        fingerprint="f",
        sigma=bundle.sigma,
        beta=bundle.betas[0],
        interval=(-1.0, 2.0),
        n_actions=2,
        status="active",
        betas=None,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert views.release_from_bundle(bundle, record=rec, value_grid=1.0).status == "active"


def test_a_release_known_only_from_the_store() -> None:
    rec = new_record(
        release_id="r1",
        fingerprint="f",
        sigma=2.0,
        beta=0.5,
        interval=(-3.0, 4.0),
        n_actions=3,
        status="retired",
        betas=None,
        created_at=datetime(2026, 1, 2, 3, 4, 5),
    )
    rel = views.release_from_record(rec, value_grid=0.25)
    assert (rel.release_id, rel.status, rel.sigma, rel.beta) == ("r1", "retired", 2.0, 0.5)
    assert rel.interval == (-3.0, 4.0) and rel.n_actions == 3 and rel.value_grid == 0.25
    assert math.isnan(rel.epsilon) and math.isnan(rel.delta) and rel.card == {}
    assert rel.reason == "bundle not available on this server" and rel.holds is False
    assert rel.created_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)  # naive read as UTC
    assert rel.state_intervals == ((-3.0, 4.0),) and rel.betas == (0.5,)


def test_a_stored_point_maps_its_unit_state_onto_the_interval() -> None:
    p = StoredPoint(seq=4, x=0.25, g=-1.5, created_at=1_700_000_000.0, hash="ab")
    got = views.noise_point(p, lo=-1.0, hi=3.0)
    assert (got.seq, got.x, got.state, got.g, got.hash) == (4, 0.25, 0.0, -1.5, "ab")
    assert got.created_at == datetime.fromtimestamp(1_700_000_000.0, UTC)


def test_an_integrity_report_lists_at_most_100_missing_seqs() -> None:
    broken = ActionIntegrity(
        action=1,
        ok=False,
        count=5,
        high_water=500,
        head_hash="h",
        first_broken=7,
        gaps=((3, 4), (10, 300)),
        problems=("seq 7 bad", "gap"),
    )
    fine = ActionIntegrity(
        action=0, ok=True, count=2, high_water=2, head_hash="h0", first_broken=None
    )
    report = IntegrityReport(release_id="r", ok=False, keyed=True, actions=(fine, broken))
    res = views.integrity_from_report("r", report)
    assert res.release_id == "r" and res.ok is False
    a0, a1 = res.actions
    assert (a0.action, a0.ok, a0.first_broken_seq, a0.gaps, a0.message) == (0, True, None, (), "")
    assert a1.first_broken_seq == 7 and a1.high_water_mark == 500 and a1.count == 5
    assert a1.gaps[:3] == (3, 4, 10) and len(a1.gaps) == 100 and a1.gaps[-1] == 107
    assert a1.message == "seq 7 bad; gap"
    assert res.report == json.loads(json.dumps(report.to_dict()))  # the whole report as JSON


def test_dates_of_every_stored_form(tmp_path: Path) -> None:
    naive = datetime(2026, 5, 6, 7, 8, 9)
    assert views._when(None) is None and views._when("") is None
    assert views._when("not a date") is None
    assert views._when(naive) == naive.replace(tzinfo=UTC)
    assert views._when(0) == datetime(1970, 1, 1, tzinfo=UTC)
    assert views._when("2026-05-06T07:08:09") == naive.replace(tzinfo=UTC)
    assert views._f(None, 1.5) == 1.5 and math.isnan(views._f("x")) and views._f("2") == 2.0
