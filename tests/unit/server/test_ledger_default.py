"""Privacy ledger on by default, with real `qveil serve` / `qveil train`
processes and real SQLite stores: every served or trained release is recorded against its
training data (dataset fingerprint, else environment id), once; `--budget EPS` refuses a
release that would push its dataset past EPS, leaving the ledger and store untouched; `qveil
admin ledger` lists spending per dataset and names the composition rule."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from server_helpers import QVEIL, make_bundle, running

from qveil.bundle import load_bundle, read_binding
from qveil.privacy import E3_SETTINGS, PrivacyParams, account
from qveil.privacy.ledger import BASIC_RULE, GAUSSIAN_RULE, PrivacyEvent, compose_with_rule


def _ledger(store: str) -> list[dict]:  # type: ignore[type-arg]
    r = subprocess.run(
        [QVEIL, "admin", "ledger", "--store", store, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def _epsilon(bundle: Path) -> float:
    return float(load_bundle(bundle).card["epsilon"])


def test_serve_records_each_release_once_with_the_rule(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 's.sqlite'}"
    a = make_bundle(tmp_path / "a", seed=71)
    b = make_bundle(tmp_path / "b", seed=72, sigma=3.0)
    with running(tmp_path, a, store=store) as srv:
        pass
    assert "ledger of 'LineWalk-v0': recorded" in srv.output()
    with running(tmp_path, a, store=store) as srv:  # a restart charges nothing more
        pass
    assert "already recorded" in srv.output()
    [rep] = _ledger(store)
    assert rep["dataset_id"] == "LineWalk-v0" and len(rep["events"]) == 1
    assert rep["spent"]["epsilon"] == pytest.approx(_epsilon(a), rel=1e-12)
    with running(tmp_path, b, store=store):
        pass
    [rep] = _ledger(store)
    assert len(rep["events"]) == 2
    # both are Gaussian mechanisms: exact mu-GDP composition, tighter than the sum
    assert rep["rule"] == GAUSSIAN_RULE
    assert rep["spent"]["epsilon"] < _epsilon(a) + _epsilon(b)
    text = subprocess.run(
        [QVEIL, "admin", "ledger", "--store", store], capture_output=True, text=True, timeout=60
    ).stdout
    assert "LineWalk-v0" in text and "mu-GDP" in text


def _serve_under_budget(
    bundle: Path, store: str, budget: float
) -> subprocess.CompletedProcess[str]:
    """``qveil serve --budget`` of a release the budget must refuse: the process ends."""
    return subprocess.run(
        [QVEIL, "serve", "--bundle", str(bundle), "--store", store, "--listen", "127.0.0.1:0"]
        + ["--budget", f"{budget!r}"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_budget_refuses_a_release_past_it_and_changes_nothing(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 's.sqlite'}"
    a = make_bundle(tmp_path / "a", seed=73)
    b = make_bundle(tmp_path / "b", seed=74)
    budget = _epsilon(a) * 1.2  # room for a, not for a and b (same sigma: ~sqrt(2) eps)
    with running(tmp_path, a, "--budget", f"{budget!r}", store=store):
        pass
    r = _serve_under_budget(b, store, budget)
    assert r.returncode != 0 and "serving release" not in r.stderr, r.stderr
    assert "budget" in r.stderr.lower() or "cap" in r.stderr.lower(), r.stderr
    [rep] = _ledger(store)
    assert len(rep["events"]) == 1  # nothing recorded for b
    assert read_binding(b) is None  # and b was not bound: it may still go elsewhere
    # a, already recorded, still serves under the budget; b serves without one
    with running(tmp_path, a, "--budget", f"{budget!r}", store=store):
        pass
    with running(tmp_path, b, store=store):
        pass
    [rep] = _ledger(store)
    assert len(rep["events"]) == 2 and rep["spent"]["epsilon"] > budget
    # now the dataset is past the budget: even a recorded release is refused under it
    r = _serve_under_budget(a, store, budget)
    assert r.returncode != 0, r.stderr


def test_composition_rule_names() -> None:
    """Gaussian events compose exactly (mu-GDP); an event without a mu falls back to basic
    composition, whose epsilon is the plain sum. A wrong rule (basic for Gaussians) would give
    eps_a + eps_b, which the first assertion refuses."""

    def ev(sigma: float, bid: str) -> PrivacyEvent:
        r = account(PrivacyParams(mode="output", sigma=sigma, **{**E3_SETTINGS, "actions": 2}))
        return PrivacyEvent.from_result(r, dataset_id="d", bundle_id=bid)

    a, b = ev(2.0, "a"), ev(3.0, "b")
    eps, _, rule = compose_with_rule([a, b])
    assert rule == GAUSSIAN_RULE and eps < a.epsilon + b.epsilon
    no_mu = PrivacyEvent.from_json(json.dumps({**b.to_dict(), "mu": None}))
    eps, _, rule = compose_with_rule([a, no_mu])
    assert rule == BASIC_RULE and math.isclose(eps, a.epsilon + b.epsilon)
